// The speculative-divergence judge (cli/spec_divergence.h) on the CPU: which rows of an engine batch are on the
// committed path (chain and tree), and a fabricated divergence -- a token the run never chose -- is a bug, never
// "explained": its replay does not reproduce it. The GPU test test_cuda_spec_trained judges the real ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "backend/backend.h"
#include "cli/eval_common.h"
#include "cli/spec_divergence.h"
#include "model/causal_lm.h"
#include "model/decisions.h"

namespace mxserve {
namespace {

model::ForwardBatch batch_of(std::vector<int32_t> tokens, std::vector<int32_t> positions) {
  model::ForwardBatch b;
  b.token_ids = std::move(tokens);
  b.positions = std::move(positions);
  model::SequenceSpan s;
  s.n_tokens = b.n_tokens();
  s.kv_len = b.positions.back() + 1;
  b.seqs.push_back(s);
  return b;
}

TEST(SpecDivergence, CommittedPathOfAChainVerify) {
  const std::vector<int32_t> committed = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};  // positions 0..12
  // Rows at positions 10..13: the bonus token (committed), a correct draft, a wrong draft, and one past the end.
  auto b = batch_of({15, 16, 99, 18}, {10, 11, 12, 13});
  EXPECT_EQ(cli::committed_path_positions(b, committed), (std::vector<int32_t>{10, 11, -1, -1}));
  auto c = batch_of({15, 16, 17, 18}, {10, 11, 12, 13});
  EXPECT_EQ(cli::committed_path_positions(c, committed), (std::vector<int32_t>{10, 11, 12, -1}));
  auto prefill = batch_of({5, 6, 7}, {0, 1, 2});
  EXPECT_EQ(cli::committed_path_positions(prefill, committed), (std::vector<int32_t>{0, 1, 2}));
}

TEST(SpecDivergence, CommittedPathOfATreeVerify) {
  const std::vector<int32_t> committed = {1, 2, 3, 4, 5, 6};  // positions 0..5
  // Tree at kv indices 3..6 (tree_base 3): root (position 3), two children at position 4 (the wrong one first),
  // and a grandchild of the wrong child at position 5 carrying the committed token.
  model::ForwardBatch b;
  b.token_ids = {4, 77, 5, 6};
  b.positions = {3, 4, 4, 5};
  model::SequenceSpan s;
  s.n_tokens = 4;
  s.kv_len = 7;
  s.tree_base = 3;
  s.kv_indices = {3, 4, 5, 6};
  s.tree_mask = {0b0001, 0b0011, 0b0101, 0b1011};
  b.seqs.push_back(s);
  EXPECT_EQ(cli::committed_path_positions(b, committed), (std::vector<int32_t>{3, -1, 4, -1}))
      << "the grandchild's parent is the wrong draft: its decisions have no reference";
}

TEST(SpecDivergence, AFabricatedDivergenceIsABugNotExplained) {
  auto cpu = backend::make_cpu_backend();
  const std::string dir = std::string(MXSERVE_SOURCE_DIR) + "/models/tiny-glm-trained";
  model::LoadOptions lo;
  auto lm = model::load_causal_lm(dir, *cpu, lo);
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  auto ids = cli::text_file_ids(std::string(MXSERVE_SOURCE_DIR) + "/tests/data/tiny_glm/heldout_sample.txt", dir, 0,
                                (*lm)->config().vocab_size);
  ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
  ASSERT_GE(ids->size(), 40u);
  const std::vector<std::vector<int32_t>> prompts = {std::vector<int32_t>(ids->begin(), ids->begin() + 40)};
  runtime::SpecConfig off, chain;
  chain.num_steps = 2;
  chain.adaptive = false;
  auto plain = cli::generate_greedy_all(**lm, *cpu, prompts, off, 8);
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  auto same = cli::judge_spec_divergences(dir, **lm, *cpu, chain, prompts, plain->outputs, plain->outputs,
                                          model::kBf16UnitRoundoff);
  ASSERT_TRUE(same.is_ok()) << same.status().to_string();
  EXPECT_TRUE(same->empty());
  // The "speculative" output takes, at token 3, the token the model likes least: far beyond any rounding.
  auto fake = plain->outputs;
  fake[0][3] = plain->outputs[0][3] == 0 ? 1 : 0;
  auto div = cli::judge_spec_divergences(dir, **lm, *cpu, chain, prompts, plain->outputs, fake,
                                         model::kBf16UnitRoundoff);
  ASSERT_TRUE(div.is_ok()) << div.status().to_string();
  ASSERT_EQ(div->size(), 1u);
  const cli::SpecDivergence& d = div->front();
  EXPECT_EQ(d.index, 3);
  EXPECT_EQ(d.reference, plain->outputs[0][3]);
  EXPECT_FALSE(d.within_bound()) << cli::describe(d);
  EXPECT_FALSE(d.a_replay.ran) << "the plain run took the reference's token: nothing to replay";
  ASSERT_TRUE(d.b_replay.ran);
  EXPECT_FALSE(d.b_replay.reproduced) << "the CPU replay takes the reference's token, not the fabricated one";
  EXPECT_EQ(d.b_replay.token_as_ran, d.reference);
  EXPECT_EQ(d.b_replay.flips, 0) << "f32 against f32: no decision differs";
  EXPECT_GT(d.b_replay.rows_compared, 0) << "the committed path was compared";
  EXPECT_FALSE(d.legitimate()) << cli::describe(d);
  EXPECT_NE(cli::describe(d).find("a bug"), std::string::npos) << cli::describe(d);
}

}  // namespace
}  // namespace mxserve
