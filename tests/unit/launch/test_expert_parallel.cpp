// Expert parallelism on the CPU backend (docs/parallel.md): the routed experts partitioned whole over the
// ranks of a tensor-parallel group (ep = tp; --enable-expert-parallel), the shared expert, dense MLP and
// attention in their TP layout. Table-driven over the committed fixtures: each layout of a row loads only
// its E / ep experts per rank (unsliced), matches the fixture's reference (teacher-forced, chunked-cache,
// greedy and MTP logits within the fp32 tolerance), and an engine over it decodes exactly what the one-rank
// engine decodes through chunked prefill, prefix reuse, preemption and MTP speculation (chain and tree).
// Bad layouts are errors naming the constraint and the flag.
// glm_moe_dsa rows run the same checks (MLA heads split over the tp group, experts partitioned over it).
// A row marked `refused` checks that the launch refuses the architecture by name (none today).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "cli/fixture.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "launch/launch.h"
#include "model/archs/glm4_moe.h"

namespace mxserve::launch {
namespace {

namespace fs = std::filesystem;

struct EpLayout {
  int tp, ep;  // dp 1: ep is the tp group
};
struct EpRow {
  std::string fixture;
  std::vector<EpLayout> layouts;
  bool refused = false;  // the architecture runs one rank only: the launch refuses it by name
};

const std::vector<EpRow>& rows() {
  static const std::vector<EpRow> r = {
      {"glm4_moe_tiny_a", {{2, 2}, {4, 4}}},  // 16 experts (4 / 8 per rank), 4 heads, 2 KV heads
      {"glm4_moe_tiny_b", {{2, 2}, {4, 4}}},  // 8 experts (4 / 2 per rank), 8 heads, 1 KV head, no dense layer
      {"glm_moe_dsa_tiny_a", {{2, 2}, {4, 4}}},  // 8 experts, 4 heads
      {"glm_moe_dsa_tiny_b", {{2, 2}, {4, 4}}},  // 8 experts, 8 heads
  };
  return r;
}

std::string fixture_dir(const std::string& name) {
  return (fs::path(MXSERVE_SOURCE_DIR) / "tests/fixtures" / name).string();
}

Result<std::unique_ptr<LaunchedModel>> launch_ep(const std::string& dir, EpLayout layout, bool mtp) {
  LaunchConfig lc;
  lc.model.path = dir;
  lc.model.load_mtp = mtp;
  lc.backend = "cpu";
  lc.parallel.tp = layout.tp;
  lc.parallel.ep = layout.ep;
  lc.cpu_group.timeout = std::chrono::seconds(60);
  return launch_model(lc);
}

std::string describe(const EpRow& row, EpLayout l) {
  return row.fixture + " at tp " + std::to_string(l.tp) + " ep " + std::to_string(l.ep);
}

// Routed-expert weights in a weight table: name -> shape.
std::map<std::string, Shape> expert_weights(const std::vector<model::WeightSpec>& table) {
  std::map<std::string, Shape> out;
  for (const auto& w : table)
    if (w.name.find(".mlp.experts.") != std::string::npos) out[w.name] = w.shape;
  return out;
}

TEST(ExpertParallel, EveryLayoutPartitionsTheExpertsAndMatchesTheFixtureReference) {
  for (const EpRow& row : rows()) {
    const std::string dir = fixture_dir(row.fixture);
    if (row.refused) {
      auto refused = launch_ep(dir, row.layouts.front(), true);
      ASSERT_FALSE(refused.is_ok()) << describe(row, row.layouts.front()) << " must be refused";
      EXPECT_NE(refused.status().message().find("implemented for Glm4MoeForCausalLM only"), std::string::npos)
          << refused.status().message();
      continue;
    }
    auto one = launch_ep(dir, {1, 1}, true);
    ASSERT_TRUE(one.is_ok()) << one.status().to_string();
    const auto all_experts = expert_weights((*one)->weight_table());
    const int64_t E = (*one)->config().n_experts;
    for (EpLayout l : row.layouts) {
      auto lm = launch_ep(dir, l, true);
      ASSERT_TRUE(lm.is_ok()) << describe(row, l) << ": " << lm.status().to_string();
      EXPECT_EQ((*lm)->world(), l.tp);
      EXPECT_EQ((*lm)->layout().ep, l.ep);
      // Rank 0 holds experts [0, E / ep) of every MoE layer, each whole (the one-rank shape).
      const auto held = expert_weights((*lm)->weight_table());
      EXPECT_EQ(held.size() * l.ep, all_experts.size()) << describe(row, l);
      for (const auto& [name, shape] : held) {
        const size_t at = name.find(".mlp.experts.") + 13;
        EXPECT_LT(std::stoll(name.substr(at)), E / l.ep) << name;
        EXPECT_EQ(shape, all_experts.at(name)) << name << " must not be width-sliced under expert parallelism";
      }
      cli::FixtureOptions opt;
      opt.chunk_size = 3;  // several prefill chunks per case
      opt.block_size = 4;
      auto report = cli::verify_fixture_model(dir, (*lm)->model(), (*lm)->backend(), opt);
      ASSERT_TRUE(report.is_ok()) << report.status().to_string();
      EXPECT_GT(report->cases, 0) << dir;
      EXPECT_EQ(report->failures, 0) << describe(row, l);
    }
  }
}

// Greedy outputs of an engine over `prompts`: chunked prefill (chunks of 5), prefix cache on. sequential:
// each request runs alone after the previous finished (its shared prefix comes from the cache); otherwise
// all at once into a pool of n_blocks x 4 tokens (tight pools preempt and recompute).
struct EngineRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int32_t> cached;
  int64_t preemptions = 0;
};

EngineRun run_engine(LaunchedModel& lm, const std::vector<std::vector<int32_t>>& prompts, bool sequential,
                     int64_t n_blocks, const runtime::SpecConfig& spec = {}) {
  runtime::EngineConfig ec;
  ec.spec = spec;
  ec.scheduler.block_size = 4;
  ec.scheduler.chunked_prefill_size = 5;
  ec.scheduler.max_num_batched_tokens = 8;
  ec.n_blocks = n_blocks;
  ec.max_model_len = 256;
  auto engine = lm.make_engine(ec);
  EngineRun run;
  run.tokens.resize(prompts.size());
  run.cached.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    runtime::RequestSpec req;
    req.prompt = prompts[i];
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 6;
    req.sampling.ignore_eos = true;
    auto* out = &run.tokens[i];
    auto* cached = &run.cached[i];
    EXPECT_TRUE(engine->submit(req, [out, cached](const runtime::TokenEvent& ev) {
      if (ev.token >= 0) out->push_back(ev.token);
      *cached = ev.usage.cached_tokens;
    }).is_ok());
    if (sequential)
      while (!engine->idle()) engine->step();
  }
  while (!engine->idle()) engine->step();
  run.preemptions = engine->stats().scheduler.preemptions;
  return run;
}

TEST(ExpertParallel, EngineGreedyMatchesOneRankThroughPrefixReusePreemptionAndMtp) {
  for (const EpRow& row : rows()) {
    if (row.refused) continue;  // checked above
    const std::string dir = fixture_dir(row.fixture);
    auto one = launch_ep(dir, {1, 1}, true);
    ASSERT_TRUE(one.is_ok()) << one.status().to_string();
    auto cases = cli::read_fixture_cases(dir, (*one)->config().vocab_size);
    ASSERT_TRUE(cases.is_ok());
    std::vector<int32_t> prompt = cases->front().input_ids;
    while (prompt.size() < 16) prompt.insert(prompt.end(), prompt.begin(), prompt.end());
    // Two prompts sharing a 12-token prefix (run one after the other: the second reuses it), and four
    // prompts at once into 6 blocks of 4 tokens (needs ~24 blocks: preempted and recomputed).
    std::vector<std::vector<int32_t>> shared = {prompt, std::vector<int32_t>(prompt.begin(), prompt.begin() + 12)};
    shared[1].push_back(prompt[3]);
    std::vector<std::vector<int32_t>> crowd;
    for (int i = 0; i < 4; ++i) crowd.emplace_back(prompt.begin() + i, prompt.begin() + 10 + i);
    const EngineRun want_shared = run_engine(**one, shared, true, 64);
    const EngineRun want_crowd = run_engine(**one, crowd, false, 64);
    ASSERT_EQ(want_shared.tokens[0].size(), 6u);
    EXPECT_GE(want_shared.cached[1], 8) << "the second prompt should reuse the cached prefix";
    for (EpLayout l : row.layouts) {
      auto lm = launch_ep(dir, l, true);
      ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
      const EngineRun got = run_engine(**lm, shared, true, 64);
      EXPECT_EQ(got.tokens, want_shared.tokens) << describe(row, l);
      EXPECT_EQ(got.cached, want_shared.cached) << describe(row, l);
      const EngineRun tight = run_engine(**lm, crowd, false, 6);
      EXPECT_GT(tight.preemptions, 0) << describe(row, l) << ": the tight pool should preempt";
      EXPECT_EQ(tight.tokens, want_crowd.tokens) << describe(row, l) << " with preemption";
      // MTP speculation is lossless: chain and tree drafts (the MTP layer's MoE is partitioned too).
      runtime::SpecConfig chain;
      chain.num_steps = 2;
      chain.adaptive = false;
      chain.self_test = false;
      EXPECT_EQ(run_engine(**lm, shared, true, 64, chain).tokens, want_shared.tokens) << describe(row, l) << " chain MTP";
      runtime::SpecConfig tree = chain;
      tree.topk = 2;
      tree.num_draft_tokens = 5;
      EXPECT_EQ(run_engine(**lm, shared, true, 64, tree).tokens, want_shared.tokens) << describe(row, l) << " tree MTP";
    }
  }
}

TEST(ExpertParallel, BadLayoutsNameTheConstraintAndTheFlag) {
  // ep must be 1, tp or tp x dp: experts are held whole, so a tp group must hold each expert exactly once.
  const std::string b = fixture_dir("glm4_moe_tiny_b");
  auto half = launch_ep(b, {4, 2}, false);
  ASSERT_FALSE(half.is_ok());
  EXPECT_NE(half.status().message().find("--ep-size 2 must be 1, the tensor-parallel size 4 or tp x dp = 4"),
            std::string::npos) << half.status().message();
  auto alone = launch_ep(b, {1, 2}, false);
  ASSERT_FALSE(alone.is_ok());
  EXPECT_NE(alone.status().message().find("--ep-size 2 must be 1"), std::string::npos) << alone.status().message();

  // ep not dividing the routed experts: a copy of tiny_b's config with 6 experts (synthetic weights).
  const fs::path dir = fs::temp_directory_path() / ("mxserve_ep_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ifstream in(b + "/config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find("\"n_routed_experts\": 8");
  ASSERT_NE(at, std::string::npos) << "tiny_b's config changed: update this test";
  text.replace(at, 21, "\"n_routed_experts\": 6");
  std::ofstream(dir / "config.json") << text;
  LaunchConfig lc;
  lc.model.path = (dir / "config.json").string();
  lc.model.synthetic = true;
  lc.parallel = {.tp = 4, .ep = 4};
  auto six = launch_model(lc);
  ASSERT_FALSE(six.is_ok());
  EXPECT_NE(six.status().message().find("--ep-size 4 does not divide num_routed_experts (n_routed_experts) 6 of " +
                                        (dir / "config.json").string()),
            std::string::npos) << six.status().message();
  lc.parallel = {.tp = 2, .ep = 2};  // 6 experts split over 2 ranks: fine
  EXPECT_TRUE(launch_model(lc).is_ok());
  fs::remove_all(dir);

  model::ModelConfig c;
  c.source = "config.json";
  EXPECT_NE(check_expert_parallel(c, 2).message().find("expert parallelism is implemented for Glm4MoeForCausalLM and GlmMoeDsaForCausalLM only"),
            std::string::npos);
  c.arch = &model::glm4_moe_architecture();
  EXPECT_NE(check_expert_parallel(c, 2).message().find("no routed experts"), std::string::npos);
  c.n_heads = 4, c.n_kv_heads = 2, c.n_experts = 8, c.moe_inter = 6, c.vocab_size = 64;
  EXPECT_TRUE(check_expert_parallel(c, 4).is_ok());
  // Whole experts: their width need not split over tp when they are partitioned.
  EXPECT_NE(check_tensor_parallel(c, 4).message().find("moe_intermediate_size 6"), std::string::npos);
  EXPECT_TRUE(check_tensor_parallel(c, 4, 4).is_ok());
}

}  // namespace
}  // namespace mxserve::launch

namespace mxserve::launch {
namespace {

// A rank failing at start-up (issue 19, "bad input"): a checkpoint that lacks one tensor of expert 7. Every
// rank checks the whole checkpoint against the model's weight table before loading its share, so the launch
// fails naming the first failing rank, the tensor and "every rank stopped" (the other ranks' models are freed,
// no thread is left waiting for a collective).
TEST(ExpertParallel, ARankFailingAtStartUpStopsTheLaunchNamingTheRank) {
  namespace fs = std::filesystem;
  const std::string b = fixture_dir("glm4_moe_tiny_b");
  const fs::path dir = fs::temp_directory_path() / ("mxserve_ep_startup_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* f : {"config.json", "generation_config.json"})
    if (fs::exists(fs::path(b) / f)) fs::copy_file(fs::path(b) / f, dir / f, fs::copy_options::overwrite_existing);
  auto file = io::SafetensorsFile::open(b + "/model.safetensors");
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  const std::string missing = "model.layers.1.mlp.experts.7.down_proj.weight";
  io::NamedTensors kept;
  bool dropped = false;
  for (const io::TensorInfo& t : (*file)->tensors()) {
    if (t.name == missing) {
      dropped = true;
      continue;
    }
    kept.push_back({t.name, (*file)->view(t)});
  }
  ASSERT_TRUE(dropped) << "tiny_b's checkpoint changed: update this test";
  ASSERT_TRUE(io::write_safetensors((dir / "model.safetensors").string(), kept).is_ok());

  LaunchConfig lc;
  lc.model.path = dir.string();
  lc.backend = "cpu";
  lc.parallel = {.tp = 2, .ep = 2};
  lc.cpu_group.timeout = std::chrono::seconds(30);
  const auto t0 = std::chrono::steady_clock::now();
  auto launched = launch_model(lc);
  ASSERT_FALSE(launched.is_ok());
  const std::string& why = launched.status().message();
  EXPECT_NE(why.find("rank 0/2 (tp 0/2, ep 0/2"), std::string::npos) << why;
  EXPECT_NE(why.find("failed at start-up; every rank stopped"), std::string::npos) << why;
  EXPECT_NE(why.find(missing), std::string::npos) << why;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20)) << "the launch waited for a timeout";
  lc.parallel = {.tp = 1};  // one rank needs every expert: the same tensor named, no rank prefix
  auto one = launch_model(lc);
  ASSERT_FALSE(one.is_ok());
  EXPECT_NE(one.status().message().find(missing), std::string::npos) << one.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mxserve::launch
