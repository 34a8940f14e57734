// Layout refusals and start-up failures of the parallel launch (issue 32 item 2), on the CPU: the CUDA MoE
// width check (a rank's slice of moe_intermediate_size must be a multiple of 8 on --backend cuda; refused
// naming the flag and the field, whole experts under EP exempt, DP attention slicing over tp x dp), and a
// rank that fails at start-up stopping the whole launch, naming the rank, without a hang (tp 2 and
// tp 2 x dp 2 on CPU ranks, through LaunchConfig::rank_start_hook); the fused all-reduce + add + RMSNorm seam
// (LaunchConfig::fused_allreduce: on the CPU backend the reference, three steps behind the seam) taken by the
// forward's chaining at tp 2 and tp 2 x dp 2 + DP attention, matching every fixture's reference; the CUDA ranks'
// DP merge and MTP broadcast through the world communicator (LaunchConfig::lockstep_device_paths on CPU ranks):
// an engine over both DP groups, with MTP chain and tree, decodes the one-rank greedy tokens.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>

#include "cli/fixture.h"
#include "launch/launch.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "parallel/fused_add_norm.h"
#include "runtime/engine.h"

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

std::vector<std::vector<int32_t>> engine_tokens(LaunchedModel& lm, const std::vector<std::vector<int32_t>>& prompts,
                                                const runtime::SpecConfig& spec) {
  runtime::EngineConfig ec;
  ec.spec = spec;
  ec.scheduler.block_size = 4;
  ec.scheduler.chunked_prefill_size = 5;
  ec.scheduler.max_num_batched_tokens = 12;
  ec.n_blocks = 64;
  ec.max_model_len = 64;
  auto engine = lm.make_engine(ec);
  std::vector<std::vector<int32_t>> tokens(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    runtime::RequestSpec req;
    req.prompt = prompts[i];
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 6;
    req.sampling.ignore_eos = true;
    auto* out = &tokens[i];
    EXPECT_TRUE(engine->submit(req, [out](const runtime::TokenEvent& ev) {
      if (ev.token >= 0) out->push_back(ev.token);
    }).is_ok());
  }
  while (!engine->idle()) {
    engine->step();
    const Status inv = engine->check_invariants();
    EXPECT_TRUE(inv.is_ok()) << inv.to_string();
    if (!inv.is_ok()) break;
  }
  return tokens;
}

TEST(ParallelLayouts, DeviceMergeAndMtpBroadcastMatchOneRank) {
  const std::string dir = kFixtures + "glm4_moe_tiny_a";
  LaunchConfig one_lc;
  one_lc.model.path = dir;
  one_lc.model.load_mtp = false;
  auto one = launch_model(one_lc);
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p;
    for (int t = 0; t < 9 + i; ++t) p.push_back((7 * t + 13 * i + 1) % static_cast<int32_t>((*one)->config().vocab_size));
    prompts.push_back(p);
  }
  const auto want = engine_tokens(**one, prompts, {});
  ASSERT_EQ(want[0].size(), 6u);
  runtime::SpecConfig chain;
  chain.num_steps = 2;
  chain.adaptive = false;
  chain.self_test = false;
  runtime::SpecConfig tree = chain;
  tree.topk = 2;
  tree.num_draft_tokens = 5;
  for (const parallel::ParallelConfig& p :
       {parallel::ParallelConfig{.tp = 2}, parallel::ParallelConfig{.dp = 2},
        parallel::ParallelConfig{.tp = 2, .dp = 2, .dp_attention = true}}) {
    LaunchConfig lc;
    lc.model.path = dir;
    lc.model.load_mtp = true;
    lc.parallel = p;
    lc.lockstep_device_paths = true;
    lc.cpu_group.timeout = std::chrono::seconds(60);
    auto lm = launch_model(lc);
    ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
    const std::string name = "tp " + std::to_string(p.tp) + " dp " + std::to_string(p.dp);
    EXPECT_EQ(engine_tokens(**lm, prompts, {}), want) << name;
    EXPECT_EQ(engine_tokens(**lm, prompts, chain), want) << name << " chain MTP";
    EXPECT_EQ(engine_tokens(**lm, prompts, tree), want) << name << " tree MTP";
  }
}

}  // namespace
}  // namespace mxserve::launch
