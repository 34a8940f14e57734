// The composition root (launch/launch.h) on the CPU backend: every committed fixture, launched with a
// 1-rank layout (single-rank communicator, shard-annotated weight table), matches its reference outputs --
// teacher-forced logits, chunked-cache logits, greedy tokens, MTP logits (cli::verify_fixture_model) and
// greedy tokens through an engine the launch root built. Bad launch configs are errors naming the culprit.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "cli/fixture.h"
#include "launch/launch.h"
#include "model/weight_stats.h"

namespace mxserve::launch {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> fixture_dirs() {
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(fs::path(MXSERVE_SOURCE_DIR) / "tests/fixtures"))
    if (fs::exists(e.path() / "reference.safetensors")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::unique_ptr<LaunchedModel> launch_fixture(const std::string& dir, bool mtp) {
  LaunchConfig lc;
  lc.model.path = dir;
  lc.model.load_mtp = mtp;
  lc.backend = "cpu";
  auto lm = launch_model(lc);
  EXPECT_TRUE(lm.is_ok()) << lm.status().to_string();
  return lm.is_ok() ? std::move(*lm) : nullptr;
}

const model::WeightSpec* find(const std::vector<model::WeightSpec>& t, const std::string& name) {
  for (const auto& w : t)
    if (w.name == name) return &w;
  return nullptr;
}

TEST(Launch, OneRankLaunchMatchesEveryFixture) {
  const auto dirs = fixture_dirs();
  ASSERT_GE(dirs.size(), 2u);
  for (const auto& dir : dirs) {
    auto lm = launch_fixture(dir, /*mtp=*/true);
    ASSERT_NE(lm, nullptr) << dir;
    EXPECT_EQ(lm->communicator().name(), "single-rank");
    EXPECT_EQ(lm->communicator().size(), 1);
    EXPECT_EQ(lm->layout().device, 0);
    auto report = cli::verify_fixture_model(dir, lm->model(), lm->backend(), cli::FixtureOptions{});
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    EXPECT_GT(report->cases, 0) << dir;
    EXPECT_EQ(report->failures, 0) << dir;
  }
}

TEST(Launch, WeightTableCarriesShardAxes) {
  auto lm = launch_fixture(fixture_dirs().front(), true);
  ASSERT_NE(lm, nullptr);
  const auto& t = lm->weight_table();
  using parallel::ShardAxis;
  const std::string p = "model.layers.1.";
  ASSERT_NE(find(t, p + "self_attn.q_proj.weight"), nullptr);
  EXPECT_EQ(find(t, p + "self_attn.q_proj.weight")->shard, ShardAxis::kRow);
  EXPECT_EQ(find(t, p + "self_attn.o_proj.weight")->shard, ShardAxis::kColumn);
  EXPECT_EQ(find(t, p + "input_layernorm.weight")->shard, ShardAxis::kNone);
  EXPECT_EQ(find(t, p + "mlp.gate.weight")->shard, ShardAxis::kNone);
  const auto* expert = find(t, p + "mlp.experts.5.down_proj.weight");
  ASSERT_NE(expert, nullptr);
  EXPECT_EQ(expert->shard, ShardAxis::kExpert);
  EXPECT_EQ(expert->expert, 5);
  EXPECT_EQ(expert->n_experts, lm->config().n_experts);
  EXPECT_EQ(find(t, p + "mlp.shared_experts.down_proj.weight")->shard, ShardAxis::kColumn);
  EXPECT_EQ(find(t, "model.layers.0.mlp.up_proj.weight")->shard, ShardAxis::kRow);
}

TEST(Launch, ShardedTableForTwoRanks) {
  // The declaration the multi-rank loader slices with: tp 2 halves q/k/v rows and o_proj columns, keeps
  // norms whole; ep 2 keeps half the experts (a tp 2 launch runs: test_tensor_parallel).
  auto lm = launch_fixture(fixture_dirs().front(), true);
  ASSERT_NE(lm, nullptr);
  const auto& c = lm->config();
  const auto& full = lm->weight_table();
  auto half = model::shard_weight_table(full, parallel::RankLayout{.tp = 2, .ep = 2, .rank = 1});
  ASSERT_TRUE(half.is_ok()) << half.status().to_string();
  const std::string p = "model.layers.1.";
  EXPECT_EQ(find(*half, p + "self_attn.q_proj.weight")->shape, (Shape{c.n_heads * c.head_dim / 2, c.d_model}));
  EXPECT_EQ(find(*half, p + "self_attn.k_proj.weight")->shape, (Shape{c.n_kv_heads * c.head_dim / 2, c.d_model}));
  EXPECT_EQ(find(*half, p + "self_attn.o_proj.weight")->shape, (Shape{c.d_model, c.n_heads * c.head_dim / 2}));
  EXPECT_EQ(find(*half, p + "input_layernorm.weight")->shape, (Shape{c.d_model}));
  EXPECT_EQ(find(*half, p + "mlp.experts.0.gate_proj.weight"), nullptr);  // ep rank 0's
  EXPECT_NE(find(*half, p + "mlp.experts." + std::to_string(c.n_experts - 1) + ".gate_proj.weight"), nullptr);
  const auto full_stats = model::weight_stats(full), half_stats = model::weight_stats(*half);
  EXPECT_EQ(half_stats.expert_parameters * 2, full_stats.expert_parameters);
  // The projections do not split over tp 3 (widths of 4 x 32 and 2 x 32): the error names the tensor.
  ASSERT_NE(c.n_heads * c.head_dim % 3, 0);
  auto bad = model::shard_weight_table(full, parallel::RankLayout{.tp = 3, .rank = 0});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("_proj"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("tp 3"), std::string::npos) << bad.status().message();
}

TEST(Launch, KvSizingComesFromTheModelsCacheLayout) {
  // glm4_moe declares GQA K + V per layer, the MTP layer included; f32 on the CPU backend.
  auto lm = launch_fixture(fixture_dirs().front(), true);
  ASSERT_NE(lm, nullptr);
  const auto& c = lm->config();
  const uint64_t per_block = 2ull * (c.n_layers + 1) * 16 * c.n_kv_heads * c.head_dim * 4;
  EXPECT_EQ(lm->kv_bytes_per_block(16), per_block);
  EXPECT_EQ(lm->kv_blocks_for_bytes(16, per_block * 7 + 1), 7);
  const auto layout = lm->model().kv_spec(3, 16);
  ASSERT_EQ(layout.n_layers(), c.n_layers + 1);
  EXPECT_NE(layout.layers.back().find(kvcache::CacheRole::kKey), nullptr);
  EXPECT_NE(layout.layers.back().find(kvcache::CacheRole::kValue), nullptr);
}

TEST(Launch, EngineFromTheLaunchRootDecodesTheFixtureGreedily) {
  const std::string dir = fixture_dirs().front();
  auto lm = launch_fixture(dir, false);
  ASSERT_NE(lm, nullptr);
  auto cases = cli::read_fixture_cases(dir, lm->config().vocab_size);
  ASSERT_TRUE(cases.is_ok()) << cases.status().to_string();
  const auto& c = cases->front();
  runtime::EngineConfig ec;
  ec.scheduler.block_size = 4;
  ec.n_blocks = 64;
  ec.max_model_len = 256;
  auto engine = lm->make_engine(ec);
  std::vector<int32_t> out;
  runtime::RequestSpec req;
  req.prompt = c.input_ids;
  req.sampling.temperature = 0;
  req.sampling.max_tokens = static_cast<int32_t>(c.greedy.size());
  req.sampling.ignore_eos = true;
  ASSERT_TRUE(engine->submit(req, [&](const runtime::TokenEvent& ev) {
    if (ev.token >= 0) out.push_back(ev.token);
  }).is_ok());
  while (!engine->idle()) engine->step();
  EXPECT_EQ(out, c.greedy);
}

TEST(Launch, BadConfigsNameTheCulprit) {
  LaunchConfig lc;
  EXPECT_NE(launch_model(lc).status().message().find("no model"), std::string::npos);
  lc.model.path = fixture_dirs().front();
  lc.parallel.tp = 2;
  lc.backend = "cuda";
  lc.parallel.first_device = 1024;  // more ranks than GPUs anywhere: refused naming the flags and the GPU count
  auto two = launch_model(lc);
  ASSERT_FALSE(two.is_ok());
  EXPECT_EQ(two.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(two.status().message().find("2 ranks need one GPU each"), std::string::npos) << two.status().message();
  lc.backend = "cpu";
  lc.parallel = {};
  lc.parallel.ep = 3;
  EXPECT_NE(launch_model(lc).status().message().find("expert-parallel"), std::string::npos);
  lc.parallel = {};
  lc.backend = "tpu";
  EXPECT_NE(launch_model(lc).status().message().find("tpu"), std::string::npos);
  lc.backend = "cpu";
  lc.model.path = "/nonexistent/model";
  EXPECT_NE(launch_model(lc).status().message().find("/nonexistent/model"), std::string::npos);
}

}  // namespace
}  // namespace mxserve::launch
