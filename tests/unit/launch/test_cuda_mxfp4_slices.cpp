// Synthetic MXFP4 experts sliced per rank on CUDA (docs/parallel.md "Rank-sliced loading"): glm4_moe_tiny_a with
// 128-wide experts at tp 2, tp 4 and tp 2 x dp 2 + DP attention through the shared-device stand-in, each rank
// holding its gate/up rows and down column blocks PACKED (WeightLoader::synthetic_fill_mxfp4), decodes the
// one-rank CUDA model's greedy tokens, the chosen tokens' logprobs within the bf16 bound; and tp 4's fullest rank
// holds fewer device bytes after the load than tp 2's (the packed experts, which dominate, are 1/tp).
// Then the start-up dry run (launch/launch_memory.h) on the tp 4 launch: a measured peak > 0, a budget
// split among the 4 ranks sharing the GPU, and a --kv-cache-memory larger than the GPU refused naming the flag.
// Label gpu; skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/device_memory.h"
#include "launch/launch.h"
#include "launch/launch_memory.h"
#include "runtime/engine.h"

namespace mxserve::launch {
namespace {

namespace fs = std::filesystem;

const int kConnections = setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);

struct Decoded {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

Decoded decode(LaunchedModel& lm) {
  runtime::EngineConfig ec;
  ec.scheduler.block_size = 4;
  ec.scheduler.chunked_prefill_size = 5;
  ec.scheduler.max_num_batched_tokens = 8;
  ec.n_blocks = 64;
  ec.max_model_len = 256;
  auto engine = lm.make_engine(ec);
  Decoded d;
  runtime::RequestSpec req;
  req.prompt = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3};
  req.sampling.temperature = 0;
  req.sampling.max_tokens = 6;
  req.sampling.ignore_eos = true;
  req.sampling.logprobs = 0;
  EXPECT_TRUE(engine->submit(req, [&d](const runtime::TokenEvent& ev) {
    if (ev.token < 0) return;
    d.tokens.push_back(ev.token);
    d.logprobs.push_back(ev.logprob);
  }).is_ok());
  while (!engine->idle()) engine->step();
  return d;
}

TEST(CudaMxfp4Slices, PackedRankSlicesDecodeTheOneRankTokens) {
  if (!backend::make_backend("cuda").is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine";
  const fs::path dir = fs::temp_directory_path() / ("mxserve_cuda_mxfp4_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    const char* root = std::getenv("MXSERVE_FIXTURE_ROOT");  // the GPU machine runs from a copied tree
    std::ifstream in((root != nullptr ? std::string(root) : std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures") +
                     "/glm4_moe_tiny_a/config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    cfg["moe_intermediate_size"] = 128;
    cfg["n_routed_experts"] = 64;  // the experts dominate the weights, as in GLM-5.2
    std::ofstream(dir / "config.json") << cfg.dump(2);
  }
  auto launch_mxfp4 = [&](const parallel::ParallelConfig& p) {
    LaunchConfig lc;
    lc.model.path = (dir / "config.json").string();
    lc.model.synthetic = true;
    lc.model.seed = 11;
    lc.model.load_mtp = false;
    lc.model.synthetic_quantization = "mxfp4";
    lc.backend = "cuda";
    lc.communicator = p.world() > 1 ? "shared-device" : "";
    lc.parallel = p;
    lc.cpu_group.timeout = std::chrono::seconds(60);
    return launch_model(lc);
  };
  uint64_t one_bytes = 0;
  Decoded want;
  {
    auto one = launch_mxfp4({});
    ASSERT_TRUE(one.is_ok()) << one.status().to_string();
    one_bytes = backend::device_memory((*one)->rank_backend(0)).in_use;
    want = decode(**one);
    ASSERT_EQ(want.tokens.size(), 6u);
  }
  const struct {
    const char* name;
    parallel::ParallelConfig p;
  } layouts[] = {{"tp2", {.tp = 2}}, {"tp4", {.tp = 4}}, {"tp2 x dp2 + DP attention", {.tp = 2, .dp = 2, .dp_attention = true}}};
  uint64_t tp2_max = 0;
  for (const auto& l : layouts) {
    auto lm = launch_mxfp4(l.p);
    ASSERT_TRUE(lm.is_ok()) << l.name << ": " << lm.status().to_string();
    uint64_t max_rank = 0;
    for (int r = 0; r < (*lm)->world(); ++r)
      max_rank = std::max(max_rank, backend::device_memory((*lm)->rank_backend(r)).in_use);
    std::printf("%s: the fullest rank holds %.2f MiB in use after the load (one rank: %.2f MiB)\n", l.name,
                max_rank / 1048576.0, one_bytes / 1048576.0);
    // The experts dominate these weights: tp 4's ranks hold less than tp 2's (the same communicator kind).
    if (l.p.tp == 2 && l.p.dp == 1) tp2_max = max_rank;
    if (l.p.tp == 4) EXPECT_LT(max_rank, tp2_max) << "tp 4's fullest rank vs tp 2's";
    const Decoded got = decode(**lm);
    EXPECT_EQ(got.tokens, want.tokens) << l.name;
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << l.name;
    for (size_t i = 0; i < got.logprobs.size(); ++i)
      EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 0.05) << l.name << " token " << i;
    if (l.p.tp != 4) continue;
    KvBudgetRequest kr;
    kr.block_size = 16;
    kr.max_num_batched_tokens = kr.chunked_prefill_size = 256;
    kr.max_model_len = 512;
    kr.kv_bytes_per_rank = 64ull << 20;
    kr.kv_bytes_given = true;
    auto budget = plan_kv_budget(**lm, kr);
    ASSERT_TRUE(budget.is_ok()) << budget.status().to_string();
    EXPECT_GT(budget->peak_activation_bytes, 0u);
    EXPECT_EQ(budget->kv_bytes_per_rank, 64ull << 20);  // named: checked, never resized
    kr.kv_bytes_per_rank = 1ull << 40;                   // 1 TiB a rank: refused naming the flag
    auto too_big = plan_kv_budget(**lm, kr);
    ASSERT_FALSE(too_big.is_ok());
    EXPECT_NE(too_big.status().message().find("--kv-cache-memory"), std::string::npos) << too_big.status().message();
    kr.kv_bytes_given = false;
    kr.utilization_given = true;
    kr.gpu_memory_utilization = 0.5;
    auto sized = plan_kv_budget(**lm, kr);
    ASSERT_TRUE(sized.is_ok()) << sized.status().to_string();
    const backend::DeviceMemory m = backend::device_memory((*lm)->rank_backend(0));
    EXPECT_LT(sized->kv_bytes_per_rank, m.device_total / 2 / 4);  // a quarter of half the GPU at most
    EXPECT_GT(sized->kv_bytes_per_rank, 0u);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mxserve::launch
