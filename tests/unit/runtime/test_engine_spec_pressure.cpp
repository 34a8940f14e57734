// Speculative decoding under memory and chunking pressure, with the real tiny models on the CPU backend:
// a KV pool so small that running sequences are preempted (and recomputed) between verify steps, and a
// chunked-prefill size shorter than every prompt. Greedy outputs must equal plain decoding's (a large
// pool, no speculation) token for token, chain and tree, and the engine's invariants hold every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"
#include "fixture_requests.h"

namespace mxserve::runtime {
namespace {

using Loaded = testing::LoadedFixture;
Loaded& fixture(const std::string& name) { return testing::load_fixture(name); }

struct RunSetup {
  int64_t n_blocks = 256;
  int64_t chunked_prefill = 128;
  int64_t max_batched = 256;
  int32_t steps = 0;
  int32_t topk = 1;
  int32_t draft_tokens = 0;
  bool prefix_cache = false;
};

struct Outcome {
  std::map<size_t, std::vector<int32_t>> tokens;
  EngineStats stats;
  bool invariants_held = true;
};

constexpr int64_t kBlockSize = 4;

// Submits every request at once (so they compete for blocks) and steps to the end.
Outcome run(Loaded& m, const std::vector<RequestSpec>& specs, const RunSetup& s) {
  EngineConfig cfg;
  cfg.scheduler.block_size = kBlockSize;
  cfg.scheduler.max_num_batched_tokens = s.max_batched;
  cfg.scheduler.chunked_prefill_size = s.chunked_prefill;
  cfg.scheduler.enable_prefix_cache = s.prefix_cache;
  cfg.n_blocks = s.n_blocks;
  cfg.max_model_len = 512;
  cfg.spec.num_steps = s.steps;
  cfg.spec.adaptive = false;
  cfg.spec.topk = s.topk;
  cfg.spec.num_draft_tokens = s.draft_tokens;
  Engine engine(cfg, make_model_executor(*m.lm, *m.be, cfg.n_blocks, kBlockSize));
  Outcome out;
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto id = engine.submit(specs[i], [&out, &index](const TokenEvent& ev) {
      if (ev.token >= 0) out.tokens[index.at(ev.id)].push_back(ev.token);
      EXPECT_NE(ev.finish, FinishReason::kError) << ev.error;
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    if (id.is_ok()) index[*id] = i;
  }
  for (int guard = 0; !engine.idle() && guard < 100000; ++guard) {
    engine.step();
    if (Status st = engine.check_invariants(); !st.is_ok()) {
      ADD_FAILURE() << st.to_string();
      out.invariants_held = false;
      break;
    }
  }
  EXPECT_TRUE(engine.idle()) << "the engine did not finish (a livelock under pressure?)";
  out.stats = engine.stats();
  return out;
}

std::vector<RequestSpec> greedy_requests(const Loaded& m, int32_t max_tokens) {
  std::vector<RequestSpec> specs = testing::greedy_fixture_requests(m.cases, max_tokens);
  specs.push_back(specs.front());  // the same prompt twice: prefix reuse when the cache is on
  return specs;
}

void expect_same_tokens(const Outcome& got, const Outcome& want, size_t n, const std::string& what) {
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(got.tokens.count(i)) << what << ": request " << i << " produced nothing";
    EXPECT_EQ(got.tokens.at(i), want.tokens.at(i)) << what << ": request " << i;
  }
}

struct Shape {
  int32_t steps, topk, draft_tokens;
  std::string name() const {
    return "S=" + std::to_string(steps) + " k=" + std::to_string(topk) + " M=" + std::to_string(draft_tokens);
  }
};
const Shape kShapes[] = {{3, 1, 0}, {3, 2, 6}};  // chain and tree (suite time: two shapes)

class SpecPressure : public ::testing::TestWithParam<std::string> {};

// The pool holds the largest request (prompt + output + a verify step's drafts) with a little room, but
// not all of them: verify steps, which need blocks for their draft rows, run out and preempt.
TEST_P(SpecPressure, PreemptionUnderSpeculationIsLossless) {
  Loaded& m = fixture(GetParam());
  const int32_t max_tokens = 10;
  const auto specs = greedy_requests(m, max_tokens);
  const Outcome plain = run(m, specs, RunSetup{});
  size_t longest = 0;
  for (const auto& r : specs) longest = std::max(longest, r.prompt.size());
  for (const Shape sh : kShapes) {
    for (bool prefix : {true}) {  // prefix reuse on: the harder bookkeeping (preempted blocks re-matched)
      RunSetup s;
      s.steps = sh.steps;
      s.topk = sh.topk;
      s.draft_tokens = sh.draft_tokens;
      s.prefix_cache = prefix;
      const int64_t draft_rows = sh.topk > 1 ? sh.draft_tokens : sh.steps + 1;
      const int64_t per_request = static_cast<int64_t>(longest) + max_tokens + 2 * draft_rows;
      s.n_blocks = (per_request + kBlockSize - 1) / kBlockSize + 2;
      const std::string what = GetParam() + " " + sh.name() + " prefix " + std::to_string(prefix) + " blocks " +
                               std::to_string(s.n_blocks);
      const Outcome sp = run(m, specs, s);
      ASSERT_TRUE(sp.invariants_held) << what;
      expect_same_tokens(sp, plain, specs.size(), what);
      EXPECT_GT(sp.stats.scheduler.preemptions, 0) << what << ": the pool must be small enough to preempt";
      EXPECT_GT(sp.stats.spec.num_drafts, 0) << what;
    }
  }
}

// chunked_prefill_size shorter than the prompts (all but the 1-token one): prompts arrive over several steps next to sequences that
// are verifying drafts; the draft model's KV for each chunk must line up with the target's.
TEST_P(SpecPressure, ChunkedPrefillShorterThanThePromptIsLossless) {
  Loaded& m = fixture(GetParam());
  const auto specs = greedy_requests(m, 10);
  size_t longer_than_chunk = 0;
  const Outcome plain = run(m, specs, RunSetup{});
  for (const Shape sh : kShapes) {
    for (int64_t chunk : {int64_t{3}}) {
      longer_than_chunk = 0;
      for (const auto& r : specs) longer_than_chunk += static_cast<int64_t>(r.prompt.size()) > chunk;
      ASSERT_GE(longer_than_chunk, 3u) << "the fixtures' prompts must be longer than the chunk";
      RunSetup s;
      s.steps = sh.steps;
      s.topk = sh.topk;
      s.draft_tokens = sh.draft_tokens;
      s.chunked_prefill = chunk;
      s.max_batched = chunk + static_cast<int64_t>(specs.size()) * (sh.topk > 1 ? sh.draft_tokens : sh.steps + 1);
      const std::string what = GetParam() + " " + sh.name() + " chunk " + std::to_string(chunk);
      const Outcome sp = run(m, specs, s);
      ASSERT_TRUE(sp.invariants_held) << what;
      expect_same_tokens(sp, plain, specs.size(), what);
      EXPECT_GT(sp.stats.spec.num_drafts, 0) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpecPressure, ::testing::Values("glm4_moe_tiny_a", "glm4_moe_tiny_b"));

}  // namespace
}  // namespace mxserve::runtime
