// Tensor parallelism on the CPU backend (docs/parallel.md): a tp 2 / tp 4 launch of every committed glm4_moe
// fixture (threads as ranks, the CPU communicator) matches the fixture's reference -- teacher-forced logits,
// chunked-cache logits, greedy tokens and MTP logits within the fp32 tolerance (cli::verify_fixture_model) --
// and an engine over it decodes exactly what the one-rank engine decodes, through chunked prefill and
// prefix-cache reuse. Both fixtures cover KV-head splitting (tiny_a: 2 KV heads, tp 2) and replication
// (tiny_b: 1 KV head; tiny_a at tp 4), a tied and an untied lm_head, dense and MoE layers.
// Bad layouts are errors naming the constraint; a rank failing mid-forward fails the forward, naming the
// rank, without a hang.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "cli/fixture.h"
#include "launch/launch.h"
#include "launch/lockstep_model.h"
#include "model/archs/glm4_moe.h"
#include "parallel/cpu_communicator.h"

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

Result<std::unique_ptr<LaunchedModel>> launch_tp(const std::string& dir, int tp, bool mtp = true) {
  LaunchConfig lc;
  lc.model.path = dir;
  lc.model.load_mtp = mtp;
  lc.backend = "cpu";
  lc.parallel.tp = tp;
  lc.cpu_group.timeout = std::chrono::seconds(60);
  return launch_model(lc);
}

class TensorParallelFixture : public ::testing::TestWithParam<int> {};

TEST_P(TensorParallelFixture, MatchesEveryFixtureReference) {
  const int tp = GetParam();
  for (const auto& dir : fixture_dirs()) {
    if (fs::path(dir).filename().string().rfind("glm_moe_dsa", 0) == 0) {  // refused by name at tp > 1 (tested below)
      auto refused = launch_tp(dir, tp);
      EXPECT_FALSE(refused.is_ok()) << dir << ": glm_moe_dsa must be refused at tp " << tp;
      continue;
    }
    auto lm = launch_tp(dir, tp);
    ASSERT_TRUE(lm.is_ok()) << dir << ": " << lm.status().to_string();
    EXPECT_EQ((*lm)->world(), tp);
    EXPECT_EQ((*lm)->communicator().size(), tp);
    cli::FixtureOptions opt;
    opt.chunk_size = 3;  // several prefill chunks per case
    opt.block_size = 4;
    auto report = cli::verify_fixture_model(dir, (*lm)->model(), (*lm)->backend(), opt);
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    EXPECT_GT(report->cases, 0) << dir;
    EXPECT_EQ(report->failures, 0) << dir << " at tp " << tp;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, TensorParallelFixture, ::testing::Values(2, 4));

// Greedy outputs of requests through an engine: two prompts sharing a 12-token prefix, the second submitted
// after the first finished (its prefix comes from the cache), prefill in chunks of 5 tokens.
struct EngineRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int32_t> cached;
};

EngineRun run_engine(LaunchedModel& lm, const std::vector<int32_t>& prompt, const runtime::SpecConfig& spec = {}) {
  runtime::EngineConfig ec;
  ec.spec = spec;
  ec.scheduler.block_size = 4;
  ec.scheduler.chunked_prefill_size = 5;
  ec.scheduler.max_num_batched_tokens = 8;
  ec.n_blocks = 64;
  ec.max_model_len = 256;
  auto engine = lm.make_engine(ec);
  EngineRun run;
  std::vector<int32_t> second = std::vector<int32_t>(prompt.begin(), prompt.begin() + 12);
  second.push_back(prompt[3]);
  second.push_back(prompt[1]);
  for (const auto& p : {prompt, second}) {
    run.tokens.emplace_back();
    run.cached.push_back(0);
    runtime::RequestSpec req;
    req.prompt = p;
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 6;
    req.sampling.ignore_eos = true;
    auto* out = &run.tokens.back();
    auto* cached = &run.cached.back();
    EXPECT_TRUE(engine->submit(req, [out, cached](const runtime::TokenEvent& ev) {
      if (ev.token >= 0) out->push_back(ev.token);
      *cached = ev.usage.cached_tokens;
    }).is_ok());
    while (!engine->idle()) engine->step();
  }
  return run;
}

TEST(TensorParallel, EngineGreedyMatchesOneRankWithChunkedPrefillAndPrefixReuse) {
  for (const auto& dir : fixture_dirs()) {
    if (fs::path(dir).filename().string().rfind("glm_moe_dsa", 0) == 0) continue;  // no TP for it yet (refused)
    auto one = launch_tp(dir, 1, false);
    ASSERT_TRUE(one.is_ok()) << one.status().to_string();
    auto cases = cli::read_fixture_cases(dir, (*one)->config().vocab_size);
    ASSERT_TRUE(cases.is_ok());
    std::vector<int32_t> prompt = cases->front().input_ids;
    while (prompt.size() < 16) prompt.insert(prompt.end(), prompt.begin(), prompt.end());
    const EngineRun want = run_engine(**one, prompt);
    ASSERT_EQ(want.tokens[0].size(), 6u);
    EXPECT_GE(want.cached[1], 8) << "the second prompt should reuse the cached prefix";
    for (int tp : {2, 4}) {
      auto lm = launch_tp(dir, tp, false);
      ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
      const EngineRun got = run_engine(**lm, prompt);
      EXPECT_EQ(got.tokens, want.tokens) << dir << " tp " << tp;
      EXPECT_EQ(got.cached, want.cached) << dir << " tp " << tp;
    }
    // MTP speculation is lossless: chain and tree drafts (the tree compacts KV slots in every rank's cache)
    // at tp 2 give the one-rank greedy tokens.
    auto spec_lm = launch_tp(dir, 2, true);
    ASSERT_TRUE(spec_lm.is_ok()) << spec_lm.status().to_string();
    runtime::SpecConfig chain;
    chain.num_steps = 2;
    chain.adaptive = false;
    chain.self_test = false;
    EXPECT_EQ(run_engine(**spec_lm, prompt, chain).tokens, want.tokens) << dir << " chain MTP at tp 2";
    runtime::SpecConfig tree = chain;
    tree.topk = 2;
    tree.num_draft_tokens = 5;
    EXPECT_EQ(run_engine(**spec_lm, prompt, tree).tokens, want.tokens) << dir << " tree MTP at tp 2";
  }
}

TEST(TensorParallel, SyntheticWeightsSliceToTheOneRankModel) {
  // Every rank generates its slices from the same counter-based generator: tp 2 and 4 decode what tp 1 does.
  const std::string config = fixture_dirs().front() + "/config.json";
  auto launch_synthetic = [&](int tp, const std::string& quantization) {
    LaunchConfig lc;
    lc.model.path = config;
    lc.model.synthetic = true;
    lc.model.seed = 7;
    lc.model.load_mtp = false;
    lc.model.synthetic_quantization = quantization;
    lc.parallel.tp = tp;
    return launch_model(lc);
  };
  auto one = launch_synthetic(1, "");
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  const EngineRun want = run_engine(**one, prompt);
  for (int tp : {2, 4}) {
    auto lm = launch_synthetic(tp, "");
    ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
    EXPECT_EQ(run_engine(**lm, prompt).tokens, want.tokens) << "tp " << tp;
  }
  auto quantized = launch_synthetic(2, "mxfp4");
  ASSERT_FALSE(quantized.is_ok());
  EXPECT_NE(quantized.status().message().find("quantized synthetic weights are not implemented yet"),
            std::string::npos) << quantized.status().message();
}

TEST(TensorParallel, BadLayoutsNameTheConstraint) {
  const std::string a = fixture_dirs().front();  // tiny_a: 4 heads, 2 KV heads, widths 96 / 32, vocab 384
  auto three = launch_tp(a, 3);
  ASSERT_FALSE(three.is_ok());
  EXPECT_NE(three.status().message().find("num_attention_heads 4"), std::string::npos) << three.status().message();
  auto eight = launch_tp(a, 8);
  ASSERT_FALSE(eight.is_ok());
  EXPECT_NE(eight.status().message().find("does not divide num_attention_heads"), std::string::npos);

  LaunchConfig lc;
  lc.model.path = a;
  lc.parallel.tp = 2;
  lc.backend = "cuda";
  lc.parallel.first_device = 1024;  // more ranks than GPUs on any machine: the error names the flag and the count
  auto cuda = launch_model(lc);
  EXPECT_EQ(cuda.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(cuda.status().message().find("--tensor-parallel-size 2 x --data-parallel-size 1 = 2 ranks need one GPU "
                                          "each (devices 1024..1025), but "),
            std::string::npos)
      << cuda.status().message();
  EXPECT_NE(cuda.status().message().find("GPU(s) are visible"), std::string::npos) << cuda.status().message();
  lc.parallel.first_device = 0;
  lc.communicator = "nccl";  // the one-rank NCCL switch needs the CUDA backend
  lc.parallel.tp = 1;
  lc.backend = "cpu";
  EXPECT_NE(launch_model(lc).status().message().find("=nccl needs --backend cuda"), std::string::npos);
  lc.communicator = "mpi";
  EXPECT_NE(launch_model(lc).status().message().find("communicator=mpi: expected nccl or auto"), std::string::npos);
  lc.communicator.clear();
  lc.backend = "cpu";
  lc.parallel = {.tp = 2, .ep = 2};
  EXPECT_NE(launch_model(lc).status().message().find("expert parallelism is not implemented yet"), std::string::npos);
  lc.parallel = {.tp = 1, .dp = 2};
  EXPECT_NE(launch_model(lc).status().message().find("data parallelism is not implemented yet"), std::string::npos);
}

TEST(TensorParallel, CheckNamesEveryWidth) {
  model::ModelConfig c;
  c.source = "config.json";
  EXPECT_NE(check_tensor_parallel(c, 2).message().find("implemented for Glm4MoeForCausalLM only"), std::string::npos);
  c.arch = &model::glm4_moe_architecture();
  c.n_heads = 8, c.n_kv_heads = 2, c.first_k_dense = 1, c.dense_inter = 64, c.n_experts = 4, c.moe_inter = 32;
  c.n_shared_experts = 1, c.vocab_size = 256;
  EXPECT_TRUE(check_tensor_parallel(c, 4).is_ok());  // KV heads replicated over 2 ranks each
  EXPECT_TRUE(check_tensor_parallel(c, 8).is_ok());  // one KV head per rank, replicated over 4 ranks
  EXPECT_NE(check_tensor_parallel(c, 16).message().find("num_attention_heads 8"), std::string::npos);
  c.n_kv_heads = 3;
  EXPECT_NE(check_tensor_parallel(c, 2).message().find("num_key_value_heads 3"), std::string::npos);
  c.n_kv_heads = 2, c.moe_inter = 30;
  EXPECT_NE(check_tensor_parallel(c, 4).message().find("moe_intermediate_size 30"), std::string::npos);
  c.moe_inter = 32, c.vocab_size = 250;
  EXPECT_NE(check_tensor_parallel(c, 4).message().find("vocab_size 250"), std::string::npos);
}

// A rank model that fails its forward (as a device error would): the lockstep forward returns that error,
// naming the rank, while the healthy ranks -- blocked in a collective -- are released by the abort.
class FailingModel final : public model::CausalLM {
 public:
  FailingModel(model::CausalLM& inner, bool fail) : inner_(inner), fail_(fail) {}
  const model::ModelConfig& config() const override { return inner_.config(); }
  kvcache::KvCacheSpec kv_spec(int64_t n, int64_t b) const override { return inner_.kv_spec(n, b); }
  bool has_mtp() const override { return false; }
  Result<model::ForwardOutput> forward(const model::ForwardBatch& batch, kvcache::KvCache& kv) override {
    if (fail_) return internal_error("injected failure in layer 0");
    return inner_.forward(batch, kv);
  }
  Result<model::ForwardOutput> forward_mtp(const model::ForwardBatch&, const Tensor&, kvcache::KvCache&) override {
    return unsupported("no MTP");
  }

 private:
  model::CausalLM& inner_;
  bool fail_;
};

TEST(TensorParallel, AFailingRankFailsTheForwardWithoutAHang) {
  // Four rank models of tiny_a at tp 4 (loaded by a launch), driven by a lockstep model whose rank 2 fails.
  auto lm = launch_tp(fixture_dirs().front(), 4, false);
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  // The launch's own lockstep model is idle; a second one drives the same rank models and communicators.
  std::vector<std::unique_ptr<FailingModel>> wrapped;
  std::vector<LockstepModel::Rank> ranks;
  for (int r = 0; r < 4; ++r) {
    wrapped.push_back(std::make_unique<FailingModel>((*lm)->rank_model(r), r == 2));
    ranks.push_back({&(*lm)->rank_backend(r), wrapped.back().get(), &(*lm)->rank_communicator(r)});
  }
  LockstepModel group(ranks);
  kvcache::KvCache kv(group.kv_spec(8, 4), [&](DType dt, Shape s) { return (*lm)->backend().alloc(dt, s); });
  model::ForwardBatch batch;
  batch.token_ids = {1, 2, 3};
  batch.positions = {0, 1, 2};
  batch.logit_rows = {2};
  model::SequenceSpan span;
  span.n_tokens = 3;
  span.kv_len = 3;
  span.block_table = {0};
  batch.seqs.push_back(span);
  const auto t0 = std::chrono::steady_clock::now();
  auto out = group.forward(batch, kv);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().message().find("rank 2 of 4"), std::string::npos) << out.status().message();
  EXPECT_NE(out.status().message().find("injected failure in layer 0"), std::string::npos) << out.status().message();
  // The group stays failed: the next forward fails at once.
  EXPECT_FALSE(group.forward(batch, kv).is_ok());
}

}  // namespace
}  // namespace mxserve::launch
