// The decode graphs on a device that runs short of memory part-way through their capture (runtime/decode_graphs.h
// "Capture order"): the graphs captured so far are kept, covering-first, so every step still replays one; greedy
// tokens equal the eager engine's; out of memory at the first graph turns the graphs off and releases their
// private pool (the failed warm-ups' temporaries). On the CPU through
// ReplayingBackend::run_short_after (a capture out of memory, as CUDA's instantiation on a full device or under
// backend/graph_memory_floor.h); test_cuda_graphs holds the CUDA side (the floor refusing an instantiation).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "model/causal_lm.h"
#include "engine_run.h"
#include "replaying_backend.h"
#include "runtime/decode_graphs.h"
#include "runtime/engine.h"

namespace mxserve::runtime {
namespace {

std::string fixture_dir(const std::string& name) { return std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/" + name; }

TEST(GraphCaptureOrder, CoveringFirstThenTighter) {
  const std::vector<GraphKey> order = graph_capture_order({1, 2}, {1, 2, 4}, {128, 256});
  ASSERT_EQ(order.size(), 12u);
  // The first key covers every shape of the family; the longest context class comes first for all (q, batch).
  EXPECT_EQ(order.front().batch, 4);
  EXPECT_EQ(order.front().q, 2);
  EXPECT_EQ(order.front().context, 256);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(order[i].context, 256) << i;
  EXPECT_EQ(order[1].batch, 2);
  EXPECT_EQ(order[3].q, 1);
  EXPECT_EQ(order.back().batch, 1);
  EXPECT_EQ(order.back().q, 1);
  EXPECT_EQ(order.back().context, 128);
  EXPECT_TRUE(graph_capture_order({}, {1, 2}, {128}).empty());
}

struct RunResult {
  std::map<size_t, std::vector<int32_t>> tokens;
  ModelExecutor::GraphReplayCounts counts;
};

RunResult run(model::CausalLM& lm, backend::Backend& be, const std::vector<RequestSpec>& specs, bool graphs, bool mtp) {
  EngineConfig cfg;
  if (mtp) {
    cfg.spec.num_steps = 2;
    cfg.spec.adaptive = false;
  }
  cfg.scheduler.block_size = 16;
  cfg.scheduler.max_running = 4;  // buckets 1, 2, 4
  cfg.max_model_len = 128;
  cfg.n_blocks = 64;
  cfg.cuda_graphs = graphs;
  auto ex = make_model_executor(lm, be, cfg.n_blocks, cfg.scheduler.block_size);
  ModelExecutor* raw = ex.get();
  Engine engine(cfg, std::move(ex));
  RunResult r;
  r.tokens = test::run_to_idle(engine, specs);
  r.counts = raw->graph_replay_counts();
  return r;
}

std::vector<RequestSpec> requests(const std::vector<cli::FixtureCase>& cases, size_t n) {
  std::vector<RequestSpec> specs;
  for (size_t i = 0; i < n; ++i) {
    RequestSpec s;
    s.prompt = cases[i % cases.size()].input_ids;
    s.prompt.push_back(static_cast<int32_t>(1 + i));
    s.sampling.temperature = 0;
    s.sampling.max_tokens = 10;
    s.sampling.ignore_eos = true;
    specs.push_back(s);
  }
  return specs;
}

TEST(GraphsRunShort, KeptGraphsServeEveryStepAndTokensEqualEager) {
  test::ReplayingBackend be(backend::make_cpu_backend());
  auto lm = model::load_causal_lm(fixture_dir("glm4_moe_tiny_a"), be, model::LoadOptions{});
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  auto cases = cli::read_fixture_cases(fixture_dir("glm4_moe_tiny_a"), (*lm)->config().vocab_size);
  ASSERT_TRUE(cases.is_ok()) << cases.status().to_string();
  for (size_t batch : {1, 3}) {
    const std::vector<RequestSpec> specs = requests(*cases, batch);
    const RunResult eager = run(**lm, be, specs, false, false);
    for (int64_t room : {0, 1, 2}) {
      const std::string what = "batch " + std::to_string(batch) + ", room for " + std::to_string(room) + " graphs";
      be.run_short_after(room);
      const int64_t before = be.captures(), released = be.pool_releases();
      const RunResult graph = run(**lm, be, specs, true, false);
      be.run_short_after(-1);
      EXPECT_EQ(be.captures() - before, room) << what << ": graphs captured";
      // Graphs off: the failed warm-ups' private pool goes back to the device; graphs kept: it stays theirs.
      EXPECT_EQ(be.pool_releases() - released, room == 0 ? 1 : 0) << what << ": graph pool releases";
      if (room == 0) {
        EXPECT_EQ(graph.counts.decode, 0) << what << ": the graphs are off";
      } else {
        // Every decode step replays: the first graph captured (4 sequences at the longest context) covers them.
        EXPECT_EQ(graph.counts.decode, 9) << what << ": decode steps replayed (10 tokens, the first from the prefill)";
      }
      for (size_t i = 0; i < batch; ++i) {
        ASSERT_EQ(eager.tokens.at(i).size(), 10u) << what;
        EXPECT_EQ(graph.tokens.at(i), eager.tokens.at(i)) << what << " request " << i;
      }
    }
  }
}

// MTP chain: the first chain graph (3 rows per sequence) serves the verify steps; the MTP draft graphs are not
// tried once the decode graphs ran short (their drafting runs eagerly, said so).
TEST(GraphsRunShort, ChainVerifyStepsReplayTheFirstGraphAndDraftsRunEagerly) {
  test::ReplayingBackend be(backend::make_cpu_backend());
  auto lm = model::load_causal_lm(fixture_dir("glm4_moe_tiny_a"), be, model::LoadOptions{});
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  ASSERT_TRUE((*lm)->has_mtp());
  auto cases = cli::read_fixture_cases(fixture_dir("glm4_moe_tiny_a"), (*lm)->config().vocab_size);
  ASSERT_TRUE(cases.is_ok()) << cases.status().to_string();
  const std::vector<RequestSpec> specs = requests(*cases, 3);
  const RunResult eager = run(**lm, be, specs, false, true);
  be.run_short_after(1);
  const RunResult graph = run(**lm, be, specs, true, true);
  be.run_short_after(-1);
  EXPECT_GT(graph.counts.verify, 0) << "no chain verify step replayed the kept graph";
  EXPECT_EQ(graph.counts.mtp, 0);
  EXPECT_EQ(graph.counts.extend, 0);
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(graph.tokens.at(i), eager.tokens.at(i)) << "request " << i;
}

}  // namespace
}  // namespace mxserve::runtime
