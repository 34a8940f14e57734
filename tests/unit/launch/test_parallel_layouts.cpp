// Layout refusals and start-up failures of the parallel launch (issue 32 item 2), on the CPU: the CUDA MoE
// width check (a rank's slice of moe_intermediate_size must be a multiple of 8 on --backend cuda; refused
// naming the flag and the field, whole experts under EP exempt, DP attention slicing over tp x dp), and a
// rank that fails at start-up stopping the whole launch, naming the rank, without a hang (tp 2 and
// tp 2 x dp 2 on CPU ranks, through LaunchConfig::rank_start_hook); the fused all-reduce + add + RMSNorm seam
// (LaunchConfig::fused_allreduce: on the CPU backend the reference, three steps behind the seam) taken by the
// forward's chaining at tp 2 and tp 2 x dp 2 + DP attention, matching every fixture's reference.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <string>

#include "cli/fixture.h"
#include "launch/launch.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "parallel/fused_add_norm.h"

namespace mxserve::launch {
namespace {

const std::string kFixtures = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/";

model::ModelConfig config_of(const std::string& fixture) {
  auto c = model::resolve_model_config(kFixtures + fixture, model::LoadOptions{});
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return *c;
}

bool mentions(const Status& s, const std::string& what) { return s.message().find(what) != std::string::npos; }

TEST(ParallelLayouts, CudaMoeSlicesNameTheFlagAndTheField) {
  const model::ModelConfig a = config_of("glm4_moe_tiny_a");  // moe_intermediate_size 32
  const model::ModelConfig b = config_of("glm_moe_dsa_tiny_b");  // moe_intermediate_size 24
  EXPECT_TRUE(check_cuda_moe_slices(a, {.tp = 2}).is_ok());
  EXPECT_TRUE(check_cuda_moe_slices(a, {.tp = 4}).is_ok());  // 8 per rank
  EXPECT_TRUE(check_cuda_moe_slices(a, {.tp = 2, .dp = 2, .dp_attention = true}).is_ok());  // 32 / 4
  EXPECT_TRUE(check_cuda_moe_slices(a, {.tp = 1, .dp = 2}).is_ok());  // plain DP: whole replicas
  const Status b2 = check_cuda_moe_slices(b, {.tp = 2});
  EXPECT_EQ(b2.code(), StatusCode::kUnsupported) << b2.to_string();
  EXPECT_TRUE(mentions(b2, "--tensor-parallel-size 2")) << b2.message();
  EXPECT_TRUE(mentions(b2, "moe_intermediate_size 24")) << b2.message();
  EXPECT_TRUE(mentions(b2, "is 12")) << b2.message();
  EXPECT_TRUE(mentions(b2, "config.json")) << b2.message();
  EXPECT_TRUE(check_cuda_moe_slices(b, {.tp = 2, .ep = 2}).is_ok());  // EP: whole experts
  const Status wide = check_cuda_moe_slices(a, {.tp = 4, .dp = 2, .dp_attention = true});  // 32 / 8 = 4
  EXPECT_FALSE(wide.is_ok());
  EXPECT_TRUE(mentions(wide, "--enable-dp-attention")) << wide.message();
  EXPECT_TRUE(mentions(wide, "tp x dp = 8")) << wide.message();
  EXPECT_TRUE(mentions(wide, "moe_intermediate_size 32")) << wide.message();
  EXPECT_TRUE(check_cuda_moe_slices(a, {.tp = 4, .ep = 8, .dp = 2, .dp_attention = true}).is_ok());
}

// A rank whose start-up fails stops the launch: the error names that rank and says every rank stopped; the
// other ranks were started too (the hook ran on every rank) and the call returns (no hang).
TEST(ParallelLayouts, RankFailingAtStartUpStopsTheLaunchNamingIt) {
  struct Case {
    parallel::ParallelConfig p;
    int failing;
    std::string name;
  };
  for (const Case& c : {Case{{.tp = 2}, 1, "rank 1/2 (tp 1/2"},
                        Case{{.tp = 2, .dp = 2, .dp_attention = true}, 2, "rank 2/4 (tp 0/2"}}) {
    LaunchConfig lc;
    lc.model.path = kFixtures + "glm4_moe_tiny_a";
    lc.backend = "cpu";
    lc.parallel = c.p;
    std::atomic<int> started{0};
    lc.rank_start_hook = [&](const parallel::RankLayout& rank) -> Status {
      ++started;
      if (rank.rank == c.failing) return internal_error("injected start-up failure");
      return Status::ok();
    };
    auto lm = launch_model(lc);
    ASSERT_FALSE(lm.is_ok()) << c.name;
    EXPECT_EQ(started.load(), c.p.world()) << c.name;
    EXPECT_TRUE(mentions(lm.status(), c.name)) << lm.status().message();
    EXPECT_TRUE(mentions(lm.status(), "failed at start-up; every rank stopped")) << lm.status().message();
    EXPECT_TRUE(mentions(lm.status(), "injected start-up failure")) << lm.status().message();
  }
}

TEST(ParallelLayouts, FusedAddNormSeamMatchesTheFixtureReference) {
  for (const char* f : {"glm4_moe_tiny_a", "glm_moe_dsa_tiny_a"}) {
    for (const parallel::ParallelConfig& p :
         {parallel::ParallelConfig{.tp = 2}, parallel::ParallelConfig{.tp = 2, .dp = 2, .dp_attention = true}}) {
      LaunchConfig lc;
      lc.model.path = kFixtures + f;
      lc.backend = "cpu";
      lc.parallel = p;
      lc.fused_allreduce = true;
      lc.model.load_mtp = true;  // the MTP layer runs the fused chaining too
      auto lm = launch_model(lc);
      ASSERT_TRUE(lm.is_ok()) << f << ": " << lm.status().to_string();
      const int64_t before = parallel::reference_fused_add_norm_calls();
      cli::FixtureOptions opt;
      opt.chunk_size = 3;
      opt.block_size = 4;
      auto report = cli::verify_fixture_model(kFixtures + f, (*lm)->model(), (*lm)->backend(), opt);
      ASSERT_TRUE(report.is_ok()) << f << ": " << report.status().to_string();
      EXPECT_GT(report->cases, 0);
      EXPECT_EQ(report->failures, 0) << f << " tp " << p.tp << " dp " << p.dp;
      EXPECT_GT(parallel::reference_fused_add_norm_calls(), before) << f << ": the fused seam never ran";
    }
  }
}

}  // namespace
}  // namespace mxserve::launch
