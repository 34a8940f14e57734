// The shared greedy-divergence judge (cli/greedy_divergence.h) on the CPU, for two configurations of a BATCHED
// engine run whose requests share a prompt prefix through the prefix cache (the layout test_cuda_cascade_engine
// judges on the GPU):
//   - the committed-path tracker: a row is on the path only when its own token and its whole context are (its
//     earlier rows, and cached blocks written by committed-path rows of another sequence);
//   - identical configurations: no divergence;
//   - a deliberately wrong configuration B (one request's logits pushed to its least likely token at one position)
//     is judged a bug with its numbers: margin far beyond the bound, the replay reproduces it, forcing the
//     reference's decisions on every committed-path row -- the shared prefix's rows, prefilled by ANOTHER request
//     and served from the prefix cache, included -- does not bring the reference's token back.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "backend/backend.h"
#include "cli/greedy_divergence.h"
#include "model/causal_lm.h"
#include "model/decisions.h"
#include "runtime/sequence_runner.h"
#include "shared_prefix_run.h"

namespace mxserve {
namespace {

using testing_support::run_shared_prefix;

model::SequenceSpan span(int32_t begin, int32_t n, int32_t kv_len, int32_t row, uint64_t lease,
                         std::vector<int32_t> blocks) {
  model::SequenceSpan s;
  s.token_begin = begin;
  s.n_tokens = n;
  s.kv_len = kv_len;
  s.table_row = row;
  s.table_lease = lease;
  s.block_table = std::move(blocks);
  return s;
}

TEST(GreedyDivergence, TrackerFollowsContextAcrossForwardsAndThePrefixCache) {
  std::vector<int32_t> committed(12);
  for (int32_t i = 0; i < 12; ++i) committed[i] = 100 + i;  // block size 4: blocks of positions 0-3, 4-7, 8-11
  cli::CommittedPathTracker t(committed);
  // Sequence X (row 0) prefills positions 0..7 (blocks 10, 11) on the path; sequence Y (row 1) prefills 0..7 with
  // a wrong token at position 5 (blocks 20, 21).
  model::ForwardBatch b;
  for (int32_t p = 0; p < 8; ++p) b.token_ids.push_back(committed[p]), b.positions.push_back(p);
  for (int32_t p = 0; p < 8; ++p) b.token_ids.push_back(p == 5 ? 7 : committed[p]), b.positions.push_back(p);
  b.seqs = {span(0, 8, 8, 0, 1, {10, 11}), span(8, 8, 8, 1, 2, {20, 21})};
  const std::vector<int32_t> first = t.rows(b, 4);
  EXPECT_EQ(first, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, -1, -1, -1}));
  // Next forward: X and Y decode position 8 with the committed token: only X's context is on the path. Z (row 2,
  // a prefix-cache hit on X's blocks) and W (row 3, a hit on Y's second block) start at position 8.
  model::ForwardBatch d;
  d.token_ids = {committed[8], committed[8], committed[8], committed[8]};
  d.positions = {8, 8, 8, 8};
  d.seqs = {span(0, 1, 9, 0, 1, {10, 11, 12}), span(1, 1, 9, 1, 2, {20, 21, 22}), span(2, 1, 9, 2, 3, {10, 11, 13}),
            span(3, 1, 9, 3, 4, {10, 21, 14})};
  EXPECT_EQ(t.rows(d, 4), (std::vector<int32_t>{8, -1, 8, -1}));
  // A new lease on row 0 is a new sequence: its cached blocks decide, not the old holder's progress.
  model::ForwardBatch n;
  n.token_ids = {committed[8]};
  n.positions = {8};
  n.seqs = {span(0, 1, 9, 0, 9, {20, 21, 15})};
  EXPECT_EQ(t.rows(n, 4), (std::vector<int32_t>{-1}));
}

// Configuration B's model: request rows at `position` get their least likely token (or, second_best, their second
// most likely one) pushed to the top.
class WrongTokenModel final : public model::CausalLM {
 public:
  WrongTokenModel(model::CausalLM& inner, int32_t position, bool second_best = false)
      : inner_(inner), position_(position), second_best_(second_best) {}
  const model::ModelConfig& config() const override { return inner_.config(); }
  kvcache::KvCacheSpec kv_spec(int64_t n_blocks, int64_t block_size) const override {
    return inner_.kv_spec(n_blocks, block_size);
  }
  bool has_mtp() const override { return false; }
  Result<model::ForwardOutput> forward_mtp(const model::ForwardBatch&, const Tensor&, kvcache::KvCache&) override {
    return unsupported("WrongTokenModel has no MTP layer");
  }
  Result<model::ForwardOutput> forward(const model::ForwardBatch& batch, kvcache::KvCache& kv) override {
    MX_ASSIGN_OR_RETURN(model::ForwardOutput out, inner_.forward(batch, kv));
    const int64_t V = out.logits.dim(1);
    for (size_t k = 0; k < batch.logit_rows.size(); ++k) {
      if (batch.positions[batch.logit_rows[k]] != position_) continue;
      float* l = out.logits.data<float>() + k * V;
      float* top = std::max_element(l, l + V);
      float* pick = std::min_element(l, l + V);
      if (second_best_) {
        const float keep = *top;
        *top = -1e30f;
        pick = std::max_element(l, l + V);
        *top = keep;
      }
      *pick = *top + (second_best_ ? 1.0f : 100.0f);
    }
    return out;
  }

 private:
  model::CausalLM& inner_;
  int32_t position_;
  bool second_best_;
};

class GreedyDivergenceEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    cpu_ = backend::make_cpu_backend();
    auto lm = model::load_causal_lm(dir_, *cpu_, model::LoadOptions{.load_mtp = false});
    ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
    lm_ = std::move(*lm);
    // 64 shared tokens (4 whole blocks of 16), then 1, 20 and 40 distinct ones: the decode positions of the three
    // requests (64-69, 83-88, 103-108) never meet.
    const int32_t V = static_cast<int32_t>(lm_->config().vocab_size);
    std::vector<int32_t> prefix;
    for (int32_t k = 0; k < 64; ++k) prefix.push_back((13 * k + 7) % V);
    for (size_t i = 0; i < 3; ++i) {
      runtime::RequestSpec s;
      s.prompt = prefix;
      const int n_own = i == 0 ? 1 : static_cast<int>(20 * i);
      for (int j = 0; j < n_own; ++j) s.prompt.push_back((5 + static_cast<int32_t>(i) + 11 * j) % V);
      s.sampling.temperature = 0;
      s.sampling.max_tokens = 6;
      s.sampling.ignore_eos = true;
      s.sampling.logprobs = 2;  // the top-2 gap: the judge's margin must equal it
      specs_.push_back(s);
      prompts_.push_back(s.prompt);
    }
  }
  const std::string dir_ = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_a";
  std::unique_ptr<backend::Backend> cpu_;
  std::unique_ptr<model::CausalLM> lm_;
  std::vector<runtime::RequestSpec> specs_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_F(GreedyDivergenceEngine, AWrongConfigurationIsJudgedABug) {
  auto base = run_shared_prefix(*lm_, *cpu_, specs_, false);
  ASSERT_TRUE(base.is_ok()) << base.status().to_string();
  EXPECT_EQ(base->cached.at(1), 64) << "request 1 must hit the shared prefix (the replay's cached-context path)";
  const auto a_out = base->outputs(3);
  auto replay_on = [this](model::CausalLM& m, size_t i) -> Result<std::vector<int32_t>> {
    MX_ASSIGN_OR_RETURN(auto r, run_shared_prefix(m, *cpu_, specs_, false));
    return r.tokens[i];
  };
  const cli::GreedyConfig a{"per-sequence", lm_.get(), replay_on};
  // Same configuration twice: nothing to judge.
  auto same = cli::judge_greedy_divergences(dir_, prompts_, a_out, a_out, a, a, model::kBf16UnitRoundoff);
  ASSERT_TRUE(same.is_ok()) << same.status().to_string();
  EXPECT_TRUE(same->empty());

  // B: request 1's row at position 86 (its generated token 3) takes its least likely token.
  WrongTokenModel wrong(*lm_, 86);
  auto bad = run_shared_prefix(wrong, *cpu_, specs_, false);
  ASSERT_TRUE(bad.is_ok()) << bad.status().to_string();
  const auto b_out = bad->outputs(3);
  ASSERT_EQ(b_out[0], a_out[0]);
  ASSERT_EQ(b_out[2], a_out[2]);
  ASSERT_NE(b_out[1][3], a_out[1][3]);
  const cli::GreedyConfig b{"wrong", &wrong, replay_on};
  auto div = cli::judge_greedy_divergences(dir_, prompts_, a_out, b_out, a, b, model::kBf16UnitRoundoff);
  ASSERT_TRUE(div.is_ok()) << div.status().to_string();
  ASSERT_EQ(div->size(), 1u);
  const cli::GreedyDivergence& d = div->front();
  std::printf("%s\n", cli::describe(d).c_str());
  EXPECT_EQ(d.prompt, 1u);
  EXPECT_EQ(d.index, 3);
  EXPECT_EQ(d.a, a_out[1][3]);
  EXPECT_EQ(d.b, b_out[1][3]);
  EXPECT_EQ(d.reference, a_out[1][3]) << "f32 engine and f32 reference agree";
  EXPECT_GT(d.margin, d.bound);
  EXPECT_GT(d.ratio(), 1.0);
  EXPECT_FALSE(d.within_bound());
  EXPECT_FALSE(d.a_replay.ran) << "A took the reference's token: nothing to replay";
  ASSERT_TRUE(d.b_replay.ran);
  EXPECT_TRUE(d.b_replay.reproduced) << "the replay through B's model makes the same wrong choice";
  EXPECT_EQ(d.b_replay.token_as_ran, d.b);
  EXPECT_EQ(d.b_replay.token_forced, d.b) << "forcing the reference's decisions cannot undo a wrong logit";
  EXPECT_FALSE(d.b_replay.forced_within_token_bound);
  EXPECT_EQ(d.b_replay.flips, 0) << "f32 against f32: no decision differs";
  // Every committed-path row was compared at every decision site: positions 0..63 (request 0's prefill, served
  // to request 1 from the prefix cache), 64..83 (request 1's own prefill) and 84..86 (its decodes) = 87 rows.
  model::DecisionRecorder rec;
  {
    runtime::SequenceRunner runner(*lm_, *cpu_, 8, 16);
    runtime::SequenceState st;
    model::ScopedDecisionHook scope(&rec);
    auto step = runner.extend({&st}, std::vector<std::vector<int32_t>>{{1, 2}}, false, false);
    ASSERT_TRUE(step.is_ok()) << step.status().to_string();
    runner.release(st);
  }
  ASSERT_GT(rec.records.size(), 0u);
  EXPECT_EQ(d.b_replay.rows_compared, 87 * static_cast<int64_t>(rec.records.size()));
  EXPECT_FALSE(d.legitimate());
  EXPECT_NE(cli::describe(d).find("a bug"), std::string::npos);
  EXPECT_NE(cli::describe(d).find("ratio"), std::string::npos);
}

// The same layout with B taking the second most likely token at request 1's generated token 3: the judge's margin is
// the reference's top-2 gap at exactly that row (the engine's own top-2 logprob gap: f32 on both sides), and the
// verdict follows the bound -- under a format coarse enough (u = 1) it is a legitimate divergence, judged without a
// replay; under bf16 it is legitimate exactly when the margin is within u x (S_a + S_b).
TEST_F(GreedyDivergenceEngine, ANearTieFlipIsJudgedByTheBound) {
  auto base = run_shared_prefix(*lm_, *cpu_, specs_, false);
  ASSERT_TRUE(base.is_ok()) << base.status().to_string();
  WrongTokenModel second(*lm_, 86, /*second_best=*/true);
  auto flipped = run_shared_prefix(second, *cpu_, specs_, false);
  ASSERT_TRUE(flipped.is_ok()) << flipped.status().to_string();
  const auto a_out = base->outputs(3), b_out = flipped->outputs(3);
  ASSERT_NE(b_out[1][3], a_out[1][3]);
  auto no_replay = [](model::CausalLM&, size_t) -> Result<std::vector<int32_t>> {
    return internal_error("a divergence within the bound is judged without a replay");
  };
  const cli::GreedyConfig a{"per-sequence", lm_.get(), no_replay}, b{"second-best", &second, no_replay};
  auto coarse = cli::judge_greedy_divergences(dir_, prompts_, a_out, b_out, a, b, /*u=*/1.0);
  ASSERT_TRUE(coarse.is_ok()) << coarse.status().to_string();
  ASSERT_EQ(coarse->size(), 1u);
  const cli::GreedyDivergence& d = coarse->front();
  std::printf("%s\n", cli::describe(d).c_str());
  EXPECT_EQ(d.prompt, 1u);
  EXPECT_EQ(d.index, 3);
  EXPECT_EQ(d.reference, d.a);
  ASSERT_GE(base->top2_gap.at(1).size(), 4u);
  EXPECT_NEAR(d.margin, base->top2_gap.at(1)[3], 1e-3) << "the margin is the reference's top-2 gap at that row";
  EXPECT_GT(d.margin, 0);
  EXPECT_TRUE(d.within_bound());
  EXPECT_LT(d.ratio(), 1.0);
  EXPECT_TRUE(d.legitimate());
  EXPECT_FALSE(d.a_replay.ran || d.b_replay.ran);
  EXPECT_NE(cli::describe(d).find("a legitimate divergence"), std::string::npos);
  // bf16: the bound scales with u; the verdict is the comparison, nothing else (a replay if beyond: none given).
  auto bf16 = cli::judge_greedy_divergences(dir_, prompts_, a_out, b_out, a, b, model::kBf16UnitRoundoff);
  if (d.margin <= d.bound * model::kBf16UnitRoundoff) {
    ASSERT_TRUE(bf16.is_ok()) << bf16.status().to_string();
    EXPECT_TRUE(bf16->front().legitimate());
  } else {
    EXPECT_FALSE(bf16.is_ok()) << "beyond the bf16 bound the judge must replay, and this replay refuses";
  }
}

}  // namespace
}  // namespace mxserve
