// The speculative graph runtime on the CPU (issue 36 item 1): an engine whose backend "captures" by keeping the
// body and replays it by running it again (replaying_backend.h, which also fails a body that copies to or from
// the host) against the same engine without graphs, MTP chain speculation (N = 2 fixed), greedy: identical tokens
// AND accepted-draft counts, with chain verify steps (DecodeGraphs, 3 rows per sequence) and MTP continuation
// steps (MtpGraphs, the staged first-step top-k under index_share_for_mtp_iteration) replayed (> 0 each), at a
// bucket-sized and a padded batch (1, 3 -> 4), also with simulated acceptance (accepted drafts become output
// tokens; fixed request seeds, which the simulation draws from). The MTP extend (the first draft step, uneven
// accepted + 1 rows per sequence) replays its graphs in every mode; tree mode (depth 2, topk 2, 3 nodes) replays
// tree verify steps (tree masks staged per row) and tree draft steps too (> 0 each). The CUDA run of the same
// comparison is test_cuda_graphs (label gpu).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "model/causal_lm.h"
#include "engine_run.h"
#include "replaying_backend.h"
#include "runtime/engine.h"

namespace mxserve::runtime {
namespace {

std::string fixture_dir(const std::string& name) { return std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/" + name; }

// A copy of fixture `name` with index_share_for_mtp_iteration on; the caller removes it.
std::filesystem::path shared_index_fixture(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("mxserve_sg_share_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(fixture_dir(name))) fs::copy_file(e.path(), dir / e.path().filename());
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  cfg["index_share_for_mtp_iteration"] = true;
  std::ofstream(dir / "config.json") << cfg.dump(2);
  return dir;
}

struct RunResult {
  std::map<size_t, std::vector<int32_t>> tokens;
  ModelExecutor::GraphReplayCounts counts;
  SpecStats spec;
};

// topk > 1: tree mode (depth 2, 3 draft nodes).
RunResult run(model::CausalLM& lm, backend::Backend& be, const std::vector<RequestSpec>& specs, bool graphs,
              std::optional<double> simulate, int32_t topk = 1) {
  EngineConfig cfg;
  cfg.spec.num_steps = 2;
  if (topk > 1) {
    cfg.spec.topk = topk;
    cfg.spec.num_draft_tokens = 4;
  }
  cfg.spec.adaptive = false;  // every step drafts
  cfg.spec.simulate_acceptance = simulate;
  cfg.scheduler.block_size = 16;
  cfg.scheduler.max_running = 4;  // buckets 1, 2, 4
  cfg.max_model_len = 128;        // one or two context classes
  cfg.n_blocks = 64;
  cfg.cuda_graphs = graphs;
  auto ex = make_model_executor(lm, be, cfg.n_blocks, cfg.scheduler.block_size);
  ModelExecutor* raw = ex.get();
  Engine engine(cfg, std::move(ex));
  RunResult r;
  r.tokens = test::run_to_idle(engine, specs);
  r.counts = raw->graph_replay_counts();
  r.spec = engine.stats().spec;
  return r;
}

void check(const std::string& dir, const std::string& label, int32_t topk = 1) {
  test::ReplayingBackend be(backend::make_cpu_backend());
  auto lm = model::load_causal_lm(dir, be, model::LoadOptions{});
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  ASSERT_TRUE((*lm)->has_mtp());
  auto cases = cli::read_fixture_cases(dir, (*lm)->config().vocab_size);
  ASSERT_TRUE(cases.is_ok()) << cases.status().to_string();
  for (std::optional<double> simulate : {std::optional<double>(), std::optional<double>(2.6)}) {
    for (size_t batch : {1, 3}) {
      std::vector<RequestSpec> specs;
      for (size_t i = 0; i < batch; ++i) {
        RequestSpec s;
        s.prompt = (*cases)[i % cases->size()].input_ids;
        s.prompt.push_back(static_cast<int32_t>(1 + i));
        s.sampling.temperature = 0;
        s.sampling.max_tokens = 12;
        s.sampling.ignore_eos = true;
        s.sampling.seed = 1000 + i;  // simulated acceptance draws from the request's seed: the same in both runs
        specs.push_back(s);
      }
      const std::string what = label + (topk > 1 ? " tree" : " chain") + " batch " + std::to_string(batch) +
                               (simulate ? " simulated" : "");
      const int64_t before = be.bodies_run();
      const RunResult eager = run(**lm, be, specs, false, simulate, topk);
      EXPECT_EQ(be.bodies_run(), before) << what << ": the eager engine ran a graph body";
      const RunResult graph = run(**lm, be, specs, true, simulate, topk);
      std::printf("%s: replays %lld decode, %lld verify, %lld tree verify, %lld MTP chain, %lld extend, %lld tree "
                  "draft; accepted %lld of %lld drafts\n",
                  what.c_str(), static_cast<long long>(graph.counts.decode), static_cast<long long>(graph.counts.verify),
                  static_cast<long long>(graph.counts.tree_verify), static_cast<long long>(graph.counts.mtp),
                  static_cast<long long>(graph.counts.extend), static_cast<long long>(graph.counts.tree_draft),
                  static_cast<long long>(graph.spec.num_accepted_tokens),
                  static_cast<long long>(graph.spec.num_draft_tokens));
      EXPECT_GT(graph.counts.extend, 0) << what << ": no MTP extend replayed";
      if (topk > 1) {
        EXPECT_GT(graph.counts.tree_verify, 0) << what << ": no tree verify step replayed";
        EXPECT_GT(graph.counts.tree_draft, 0) << what << ": no tree draft step replayed";
      } else {
        EXPECT_GT(graph.counts.verify, 0) << what << ": no chain verify step replayed";
        EXPECT_GT(graph.counts.mtp, 0) << what << ": no MTP continuation step replayed";
      }
      EXPECT_GT(graph.spec.num_draft_tokens, 0) << what;
      EXPECT_EQ(graph.spec.num_drafts, eager.spec.num_drafts) << what;
      EXPECT_EQ(graph.spec.num_draft_tokens, eager.spec.num_draft_tokens) << what;
      EXPECT_EQ(graph.spec.num_accepted_tokens, eager.spec.num_accepted_tokens) << what;
      EXPECT_EQ(graph.spec.accepted_per_pos, eager.spec.accepted_per_pos) << what;
      if (simulate) {
        EXPECT_GT(graph.spec.num_accepted_tokens, 0) << what;
      }
      for (size_t i = 0; i < batch; ++i) {
        ASSERT_EQ(eager.tokens.at(i).size(), 12u) << what;
        EXPECT_EQ(graph.tokens.at(i), eager.tokens.at(i)) << what << " request " << i;
      }
    }
  }
}

TEST(SpecGraphsCpu, Glm4MoeTokensAndAcceptedDraftsEqualEager) { check(fixture_dir("glm4_moe_tiny_a"), "glm4_moe_tiny_a"); }

TEST(SpecGraphsCpu, GlmMoeDsaTokensAndAcceptedDraftsEqualEager) {
  check(fixture_dir("glm_moe_dsa_tiny_a"), "glm_moe_dsa_tiny_a");
}

TEST(SpecGraphsCpu, Glm4MoeTreeTokensAndAcceptedDraftsEqualEager) {
  check(fixture_dir("glm4_moe_tiny_b"), "glm4_moe_tiny_b", /*topk=*/2);
}

TEST(SpecGraphsCpu, GlmMoeDsaTreeTokensAndAcceptedDraftsEqualEager) {
  check(fixture_dir("glm_moe_dsa_tiny_b"), "glm_moe_dsa_tiny_b", /*topk=*/2);
}

TEST(SpecGraphsCpu, GlmMoeDsaSharedIndexTokensAndAcceptedDraftsEqualEager) {
  const std::filesystem::path dir = shared_index_fixture("glm_moe_dsa_tiny_b");
  check(dir.string(), "glm_moe_dsa_tiny_b (index_share_for_mtp_iteration)");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mxserve::runtime
