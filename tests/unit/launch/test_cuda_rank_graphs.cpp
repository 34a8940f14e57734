// Per-rank CUDA graphs (launch/rank_graphs.h) on ONE GPU: a LockstepModel over a one-rank NCCL world (the only
// NCCL world one GPU can host) forced into per-rank mode, so its decode graphs go the NCCL ranks' way: the body
// recorded, the rank's graph captured on its worker thread in thread-local mode, every replay launched from that
// thread after the event wait, the step's status returned. With mirror_rank0 rank 0 also reads copies of its
// inputs (the memcpy nodes a rank on another GPU starts its graph with; same-device copies here).
// Checked on glm4_moe_tiny_a and glm_moe_dsa_tiny_a: greedy tokens of the fixture's prompts identical with graphs on
// and off (cli::verify_fixture_graphs), decode steps replayed, and those replays were per-rank ones.
// Once a per-rank graph exists, an out-of-memory fails the group for good (recovery refused, named).
// Not covered on one GPU: peer copies between GPUs and NCCL collectives inside the graphs (a one-rank world
// runs none); two stand-in ranks forced per rank are refused (unsound: parallel/graph_join.h), which is checked.
// Label gpu; skips without a CUDA device (or without libnccl.so.2). MXSERVE_FIXTURE_ROOT overrides the fixtures.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/backend.h"
#include "cli/fixture_graphs.h"
#include "launch/launch.h"
#include "launch/lockstep_model.h"
#include "runtime/engine.h"
#include "runtime/executor.h"

namespace mxserve::launch {
namespace {

const std::string kFixtures = [] {
  const char* env = std::getenv("MXSERVE_FIXTURE_ROOT");
  return env != nullptr ? std::string(env) + "/" : std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/";
}();

Result<std::unique_ptr<LaunchedModel>> launch(const std::string& dir, int tp, const std::string& communicator) {
  LaunchConfig lc;
  lc.model.path = dir;
  lc.model.load_mtp = false;  // the lockstep model has no device-input MTP forward: its draft steps run eagerly
  lc.backend = "cuda";
  lc.communicator = communicator;
  lc.parallel.tp = tp;
  lc.cpu_group.timeout = std::chrono::seconds(60);
  return launch_model(lc);
}

class CudaRankGraphs : public ::testing::Test {
 protected:
  void SetUp() override {
    auto be = backend::make_backend("cuda");
    if (!be.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << be.status().to_string() << ")";
  }
};

TEST_F(CudaRankGraphs, OneNcclRankPerRankGraphsMatchEager) {
  setenv("MXSERVE_TP_GRAPHS", "1", 1);
  for (const char* f : {"glm4_moe_tiny_a", "glm_moe_dsa_tiny_a"}) {
    const std::string dir = kFixtures + f;
    for (bool mirror_rank0 : {false, true}) {
      const std::string what = std::string(f) + (mirror_rank0 ? " (rank 0 reads copies)" : " (rank 0 in place)");
      auto lm = launch(dir, 1, "nccl");
      if (!lm.is_ok() && lm.status().message().find("libnccl") != std::string::npos)
        GTEST_SKIP() << "no NCCL library: " << lm.status().to_string();
      ASSERT_TRUE(lm.is_ok()) << what << ": " << lm.status().to_string();
      LockstepModel lockstep({{&(*lm)->rank_backend(0), &(*lm)->rank_model(0), &(*lm)->rank_communicator(0), nullptr, 0}});
      lockstep.force_per_rank_graphs_for_tests(mirror_rank0);
      auto g = cli::verify_fixture_graphs(dir, lockstep, (*lm)->backend(), /*block_size=*/4, /*mtp_draft_graphs=*/false);
      ASSERT_TRUE(g.is_ok()) << what << ": " << g.status().to_string();
      EXPECT_EQ(g->failures, 0) << what << ": graphs on vs off";
      EXPECT_GT(g->replays, 0) << what << ": no decode step replayed (were the graphs refused? see the log)";
      EXPECT_EQ(lockstep.per_rank_replays(), g->replays) << what << ": replays that were not per-rank ones";
      std::printf("PASS-RANK-GRAPHS %s: %lld decode steps replayed per rank, tokens identical to eager\n", what.c_str(),
                  static_cast<long long>(g->replays));
    }
  }
  unsetenv("MXSERVE_TP_GRAPHS");
}

// Once a per-rank graph exists the group refuses recovery (a communicator reset would leave the graphs holding the
// old NCCL communicators): an out-of-memory on a rank then fails the group for good, saying why.
TEST_F(CudaRankGraphs, PerRankGraphsTurnRecoveryOff) {
  const std::string dir = kFixtures + "glm4_moe_tiny_a";
  auto lm = launch(dir, 1, "nccl");
  if (!lm.is_ok() && lm.status().message().find("libnccl") != std::string::npos)
    GTEST_SKIP() << "no NCCL library: " << lm.status().to_string();
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  LockstepModel lockstep({{&(*lm)->rank_backend(0), &(*lm)->rank_model(0), &(*lm)->rank_communicator(0), nullptr, 0}});
  lockstep.force_per_rank_graphs_for_tests(false);
  runtime::EngineConfig ec;
  ec.scheduler.block_size = 16;
  ec.scheduler.max_running = 2;
  ec.n_blocks = 32;
  ec.max_model_len = 128;
  ec.cuda_graphs = true;
  auto ex = runtime::make_model_executor(lockstep, (*lm)->backend(), ec.n_blocks, ec.scheduler.block_size);
  runtime::ModelExecutor* raw = ex.get();
  runtime::Engine engine(ec, std::move(ex));
  auto serve = [&](std::string* error) {
    runtime::RequestSpec req;
    req.prompt = {1, 2, 3, 4, 5};
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 4;
    req.sampling.ignore_eos = true;
    std::vector<int32_t> tokens;
    EXPECT_TRUE(engine
                    .submit(req,
                            [&](const runtime::TokenEvent& ev) {
                              if (ev.token >= 0) tokens.push_back(ev.token);
                              if (ev.finish != runtime::FinishReason::kNone) *error = ev.error;
                            })
                    .is_ok());
    for (int i = 0; i < 200 && !engine.idle(); ++i) engine.step();
    EXPECT_TRUE(engine.idle());
    return tokens;
  };
  std::string error;
  EXPECT_EQ(serve(&error).size(), 4u) << error;
  EXPECT_GT(raw->graph_replays(), 0) << "no decode step replayed";
  EXPECT_GT(lockstep.per_rank_replays(), 0);
  lockstep.set_fault_hook_for_test([](int) { return out_of_memory("injected device out-of-memory"); });
  std::string first, second;
  serve(&first);
  EXPECT_NE(first.find("injected device out-of-memory"), std::string::npos) << first;
  lockstep.set_fault_hook_for_test(nullptr);
  serve(&second);  // the group stayed failed: recovery was refused, naming the per-rank graphs
  EXPECT_NE(second.find("per-rank CUDA graphs hold the NCCL communicators"), std::string::npos) << second;
  EXPECT_EQ(lockstep.recoveries(), 0);
}

// Two stand-in ranks on one GPU forced per rank: refused (graphs off, the engine runs eagerly, same tokens).
TEST_F(CudaRankGraphs, StandInRanksForcedPerRankAreRefused) {
  const std::string dir = kFixtures + "glm4_moe_tiny_a";
  auto lm = launch(dir, 2, "shared-device");
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  std::vector<LockstepModel::Rank> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back({&(*lm)->rank_backend(r), &(*lm)->rank_model(r), &(*lm)->rank_communicator(r), nullptr, 0});
  LockstepModel lockstep(std::move(ranks));
  lockstep.force_per_rank_graphs_for_tests(false);
  auto g = cli::verify_fixture_graphs(dir, lockstep, (*lm)->backend(), 4, false);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(g->replays, 0) << "two ranks of one GPU must not get per-rank graphs";
  EXPECT_EQ(lockstep.per_rank_replays(), 0);
}

}  // namespace
}  // namespace mxserve::launch
