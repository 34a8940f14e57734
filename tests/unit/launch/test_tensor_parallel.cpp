// Tensor parallelism on the CPU backend (docs/parallel.md), table-driven: every committed fixture (glm4_moe and
// glm_moe_dsa) under every layout of kLayouts (threads as ranks, the CPU communicator) must
//   - match the fixture's reference: teacher-forced logits, chunked-cache logits, greedy tokens and MTP logits
//     within the fixture tolerance (cli::verify_fixture_model, 1e-4 rel L2);
//   - decode through an engine exactly what the one-rank engine decodes: chunked prefill + prefix-cache reuse,
//     preemption (a pool too small for the batch), chain and tree MTP speculation;
//   - (glm_moe_dsa) pick the same DSA top-k on every rank: the model compares it bit for bit across ranks on
//     every full indexer layer (TensorParallel::check_replicated) and the test asserts those checks ran.
// The glm4_moe fixtures cover KV-head splitting (tiny_a: 2 KV heads, tp 2) and replication (tiny_b: 1 KV head;
// tiny_a at tp 4), a tied and an untied lm_head, dense and MoE layers; the glm_moe_dsa fixtures (4 and 8 heads:
// both split at tp 4) cover MLA heads, full / shared indexer layers, dense and MoE layers and the MTP layer.
// Bad layouts are errors naming the constraint; a rank failing mid-forward fails the forward, naming the
// rank, without a hang.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli/fixture.h"
#include "core/device_oom.h"
#include "launch/launch.h"
#include "launch/lockstep_model.h"
#include "model/archs/glm4_moe.h"
#include "model/archs/glm_moe_dsa.h"
#include "model/layers/tensor_parallel.h"
#include "parallel/cpu_communicator.h"

namespace mxserve::launch {
namespace {

namespace fs = std::filesystem;

// The layouts every fixture runs under, one row each (expert / data parallel rows join this table).
struct Layout {
  const char* name;
  parallel::ParallelConfig parallel;
};
const Layout kLayouts[] = {
    {"tp2", {.tp = 2}},
    {"tp4", {.tp = 4}},
};

std::string fixture_dir(const std::string& name) {
  return (fs::path(MXSERVE_SOURCE_DIR) / "tests/fixtures" / name).string();
}

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fs::path(MXSERVE_SOURCE_DIR) / "tests/fixtures"))
    if (fs::exists(e.path() / "reference.safetensors")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> fixture_dirs() {
  std::vector<std::string> dirs;
  for (const auto& n : fixture_names()) dirs.push_back(fixture_dir(n));
  return dirs;
}

bool is_dsa(const std::string& name) { return fs::path(name).filename().string().rfind("glm_moe_dsa", 0) == 0; }

Result<std::unique_ptr<LaunchedModel>> launch(const std::string& dir, const parallel::ParallelConfig& parallel,
                                              bool mtp = true) {
  LaunchConfig lc;
  lc.model.path = dir;
  lc.model.load_mtp = mtp;
  lc.backend = "cpu";
  lc.parallel = parallel;
  lc.cpu_group.timeout = std::chrono::seconds(60);
  return launch_model(lc);
}

Result<std::unique_ptr<LaunchedModel>> launch_tp(const std::string& dir, int tp, bool mtp = true) {
  return launch(dir, {.tp = tp}, mtp);
}

// Greedy outputs of requests through an engine (prefill in chunks of 5 tokens, blocks of 4 slots).
struct EngineRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int32_t> cached;  // prompt tokens served from the prefix cache, per request
  int64_t preemptions = 0;
};

// one_at_a_time: each prompt is submitted after the previous one finished (its prefix comes from the cache);
// else all at once (with few blocks: preemption).
EngineRun run_engine(LaunchedModel& lm, const std::vector<std::vector<int32_t>>& prompts, bool one_at_a_time,
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
    if (one_at_a_time)
      while (!engine->idle()) engine->step();
  }
  while (!engine->idle()) engine->step();
  run.preemptions = engine->stats().scheduler.preemptions;
  return run;
}

// The engine workload of one fixture: a prompt of >= 16 tokens from its first case and a second one sharing
// its first 12 tokens (prefix reuse), then four prompts sharing a prefix decoded together in a pool of 7
// blocks (28 slots for ~4 x 20 tokens: preemption).
struct Workload {
  std::vector<std::vector<int32_t>> sequential, concurrent;
};

Workload workload(const std::string& dir, int64_t vocab) {
  auto cases = cli::read_fixture_cases(dir, vocab);
  EXPECT_TRUE(cases.is_ok()) << cases.status().to_string();
  std::vector<int32_t> prompt = cases->front().input_ids;
  while (prompt.size() < 16) prompt.insert(prompt.end(), prompt.begin(), prompt.end());
  std::vector<int32_t> second(prompt.begin(), prompt.begin() + 12);
  second.push_back(prompt[3]);
  second.push_back(prompt[1]);
  Workload w;
  w.sequential = {prompt, second};
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p(prompt.begin(), prompt.begin() + 10 + 2 * i);
    p.push_back(static_cast<int32_t>((40 + i) % vocab));
    w.concurrent.push_back(p);
  }
  return w;
}

constexpr int64_t kPlentyOfBlocks = 64, kTightBlocks = 7;

runtime::SpecConfig chain_spec() {
  runtime::SpecConfig chain;
  chain.num_steps = 2;
  chain.adaptive = false;
  chain.self_test = false;
  return chain;
}

runtime::SpecConfig tree_spec() {
  runtime::SpecConfig tree = chain_spec();
  tree.topk = 2;
  tree.num_draft_tokens = 5;
  return tree;
}

// The one-rank engine results of a fixture (computed once per fixture, shared by every layout row).
struct OneRank {
  Workload work;
  EngineRun sequential, concurrent;
};

const OneRank& one_rank(const std::string& name) {
  static std::map<std::string, OneRank> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  OneRank o;
  auto lm = launch(fixture_dir(name), {}, false);
  EXPECT_TRUE(lm.is_ok()) << lm.status().to_string();
  o.work = workload(fixture_dir(name), (*lm)->config().vocab_size);
  o.sequential = run_engine(**lm, o.work.sequential, true, kPlentyOfBlocks);
  o.concurrent = run_engine(**lm, o.work.concurrent, false, kTightBlocks);
  EXPECT_EQ(o.sequential.tokens[0].size(), 6u);
  EXPECT_GE(o.sequential.cached[1], 8) << name << ": the second prompt should reuse the cached prefix";
  EXPECT_GT(o.concurrent.preemptions, 0) << name << ": the tight pool should preempt";
  for (const auto& t : o.concurrent.tokens) EXPECT_EQ(t.size(), 6u);
  return cache.emplace(name, std::move(o)).first->second;
}

class LayoutFixture : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  std::string name() const { return std::get<0>(GetParam()); }
  const Layout& layout() const { return kLayouts[std::get<1>(GetParam())]; }
  std::string what() const { return name() + " under " + layout().name; }
};

TEST_P(LayoutFixture, MatchesTheFixtureReference) {
  const int64_t checks_before = model::TensorParallel::replica_checks_passed();
  auto lm = launch(fixture_dir(name()), layout().parallel);
  ASSERT_TRUE(lm.is_ok()) << what() << ": " << lm.status().to_string();
  EXPECT_EQ((*lm)->world(), layout().parallel.world());
  EXPECT_EQ((*lm)->communicator().size(), layout().parallel.world());
  cli::FixtureOptions opt;
  opt.chunk_size = 3;  // several prefill chunks per case
  opt.block_size = 4;
  auto report = cli::verify_fixture_model(fixture_dir(name()), (*lm)->model(), (*lm)->backend(), opt);
  ASSERT_TRUE(report.is_ok()) << what() << ": " << report.status().to_string();
  EXPECT_GT(report->cases, 0) << what();
  EXPECT_EQ(report->failures, 0) << what();
  if (is_dsa(name()) && layout().parallel.tp > 1) {  // every rank compared its top-k with every other rank's
    EXPECT_GT(model::TensorParallel::replica_checks_passed(), checks_before) << what();
  }
}

TEST_P(LayoutFixture, EngineMatchesOneRank) {
  const OneRank& want = one_rank(name());
  if (HasFailure()) return;
  auto lm = launch(fixture_dir(name()), layout().parallel);
  ASSERT_TRUE(lm.is_ok()) << what() << ": " << lm.status().to_string();
  const EngineRun got = run_engine(**lm, want.work.sequential, true, kPlentyOfBlocks);
  EXPECT_EQ(got.tokens, want.sequential.tokens) << what() << ": chunked prefill + prefix reuse";
  EXPECT_EQ(got.cached, want.sequential.cached) << what();
  const EngineRun tight = run_engine(**lm, want.work.concurrent, false, kTightBlocks);
  EXPECT_EQ(tight.tokens, want.concurrent.tokens) << what() << ": preemption";
  EXPECT_EQ(tight.preemptions, want.concurrent.preemptions) << what();
  // MTP speculation is lossless: chain and tree drafts (the tree compacts KV slots in every rank's cache)
  // give the one-rank greedy tokens.
  EXPECT_EQ(run_engine(**lm, want.work.sequential, true, kPlentyOfBlocks, chain_spec()).tokens,
            want.sequential.tokens) << what() << ": chain MTP";
  EXPECT_EQ(run_engine(**lm, want.work.sequential, true, kPlentyOfBlocks, tree_spec()).tokens,
            want.sequential.tokens) << what() << ": tree MTP";
}

std::vector<int> layout_rows() {
  std::vector<int> rows;
  for (int i = 0; i < static_cast<int>(std::size(kLayouts)); ++i) rows.push_back(i);
  return rows;
}

INSTANTIATE_TEST_SUITE_P(Layouts, LayoutFixture,
                         ::testing::Combine(::testing::ValuesIn(fixture_names()), ::testing::ValuesIn(layout_rows())),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + kLayouts[std::get<1>(info.param)].name;
                         });

TEST(TensorParallel, SyntheticWeightsSliceToTheOneRankModel) {
  // Every rank generates its slices from the same counter-based generator: tp 2 and 4 decode what tp 1 does
  // (a glm4_moe and a glm_moe_dsa config).
  for (const std::string fixture : {"glm4_moe_tiny_a", "glm_moe_dsa_tiny_b"}) {
    const std::string config = fixture_dir(fixture) + "/config.json";
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
    ASSERT_TRUE(one.is_ok()) << fixture << ": " << one.status().to_string();
    const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    const EngineRun want = run_engine(**one, {prompt}, true, kPlentyOfBlocks);
    for (int tp : {2, 4}) {
      auto lm = launch_synthetic(tp, "");
      ASSERT_TRUE(lm.is_ok()) << fixture << ": " << lm.status().to_string();
      EXPECT_EQ(run_engine(**lm, {prompt}, true, kPlentyOfBlocks).tokens, want.tokens) << fixture << " tp " << tp;
    }
    // MXFP4 experts slice on 32-element blocks: these fixtures' expert widths over 2 ranks do not.
    auto quantized = launch_synthetic(2, "mxfp4");
    ASSERT_FALSE(quantized.is_ok());
    EXPECT_NE(quantized.status().message().find("must be a multiple of the 32-element MXFP4 block"),
              std::string::npos) << quantized.status().message();
    auto fp8 = launch_synthetic(2, "fp8-block");
    ASSERT_FALSE(fp8.is_ok());
    EXPECT_NE(fp8.status().message().find("implemented for bf16 and for mxfp4 routed experts only"),
              std::string::npos) << fp8.status().message();
  }
}

TEST(TensorParallel, SyntheticMxfp4ExpertsSliceToTheOneRankModel) {
  // tiny_a with 128-wide experts: every rank generates its own 32-element MXFP4 blocks of the one-rank model
  // (gate/up rows, down columns) and keeps them packed; tp 2 / 4, DP attention over 4 and EP 2 decode what
  // one rank decodes, with the chosen tokens' logprobs within float-summation bounds.
  const fs::path dir = fs::temp_directory_path() / ("mxserve_tp_mxfp4_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ifstream in(fixture_dir("glm4_moe_tiny_a") + "/config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    cfg["moe_intermediate_size"] = 128;
    std::ofstream(dir / "config.json") << cfg.dump(2);
  }
  auto launch_mxfp4 = [&](const parallel::ParallelConfig& p) {
    LaunchConfig lc;
    lc.model.path = (dir / "config.json").string();
    lc.model.synthetic = true;
    lc.model.seed = 11;
    lc.model.load_mtp = false;
    lc.model.synthetic_quantization = "mxfp4";
    lc.parallel = p;
    lc.cpu_group.timeout = std::chrono::seconds(60);
    return launch_model(lc);
  };
  struct Decoded {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
  };
  auto decode = [](LaunchedModel& lm) {
    runtime::EngineConfig ec;
    ec.scheduler.block_size = 4;
    ec.scheduler.chunked_prefill_size = 5;
    ec.scheduler.max_num_batched_tokens = 8;
    ec.n_blocks = kPlentyOfBlocks;
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
  };
  auto one = launch_mxfp4({});
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  const Decoded want = decode(**one);
  ASSERT_EQ(want.tokens.size(), 6u);
  const struct {
    const char* name;
    parallel::ParallelConfig p;
  } layouts[] = {{"tp2", {.tp = 2}},
                 {"tp4", {.tp = 4}},
                 {"tp2 x dp2 + DP attention", {.tp = 2, .dp = 2, .dp_attention = true}},
                 {"tp2 ep2", {.tp = 2, .ep = 2}}};
  for (const auto& l : layouts) {
    auto lm = launch_mxfp4(l.p);
    ASSERT_TRUE(lm.is_ok()) << l.name << ": " << lm.status().to_string();
    const Decoded got = decode(**lm);
    EXPECT_EQ(got.tokens, want.tokens) << l.name;
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << l.name;
    for (size_t i = 0; i < got.logprobs.size(); ++i)
      EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 1e-3) << l.name << " token " << i;
  }
  // 128 / 8 ranks = 16: not a whole MXFP4 block per rank, refused naming the flag and the field.
  auto eight = launch_mxfp4({.tp = 4, .dp = 2, .dp_attention = true});
  ASSERT_FALSE(eight.is_ok());
  EXPECT_NE(eight.status().message().find("--enable-dp-attention 8 with --quantization mxfp4"), std::string::npos)
      << eight.status().message();
  EXPECT_NE(eight.status().message().find("moe_intermediate_size 128"), std::string::npos);
  fs::remove_all(dir);
}

TEST(TensorParallel, ADeviceOutOfMemoryOnOneRankFailsTheStepNamingIt) {
  // A rank whose allocation fails mid-forward (core/device_oom.h; injected) fails the step with an
  // out_of_memory error naming the rank, without a hang or an abort of the process: the engine finishes the
  // request with that error. (The rank group then recovers: tests/unit/launch/test_lockstep_recovery.cpp.)
  auto lm = launch_tp(fixture_dirs().front(), 2, /*mtp=*/false);
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  runtime::EngineConfig ec;
  ec.scheduler.block_size = 4;
  ec.n_blocks = kPlentyOfBlocks;
  ec.max_model_len = 256;
  auto engine = (*lm)->make_engine(ec);
  runtime::RequestSpec req;
  req.prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  req.sampling.temperature = 0;
  req.sampling.max_tokens = 3;
  req.sampling.ignore_eos = true;
  runtime::FinishReason finish = runtime::FinishReason::kNone;
  std::string error;
  auto on_event = [&](const runtime::TokenEvent& ev) {
    if (ev.finish != runtime::FinishReason::kNone) finish = ev.finish, error = ev.error;
  };
  ASSERT_TRUE(engine->submit(req, on_event).is_ok());  // a first request makes the ranks' cache mirrors
  while (!engine->idle()) engine->step();
  ASSERT_EQ(finish, runtime::FinishReason::kLength) << error;
  req.prompt = {9, 8, 7, 6, 5, 4, 3, 2, 1};
  ASSERT_TRUE(engine->submit(req, on_event).is_ok());
  alloc_fault::arm(1, 1);  // then a rank's forward meets a full device
  for (int i = 0; i < 100 && !engine->idle(); ++i) engine->step();
  alloc_fault::arm(0, 0);
  EXPECT_TRUE(engine->idle());
  EXPECT_EQ(finish, runtime::FinishReason::kError);
  EXPECT_EQ(error.rfind("out_of_memory: ", 0), 0u) << error;
  EXPECT_NE(error.find("of 2: cpu backend: allocation of"), std::string::npos) << error;  // "rank R of 2: ..."
}

TEST(TensorParallel, BadLayoutsNameTheConstraint) {
  const std::string a = fixture_dirs().front();  // tiny_a: 4 heads, 2 KV heads, widths 96 / 32, vocab 384
  auto three = launch_tp(a, 3);
  ASSERT_FALSE(three.is_ok());
  EXPECT_NE(three.status().message().find("num_attention_heads 4"), std::string::npos) << three.status().message();
  auto eight = launch_tp(a, 8);
  ASSERT_FALSE(eight.is_ok());
  EXPECT_NE(eight.status().message().find("does not divide num_attention_heads"), std::string::npos);
  // glm_moe_dsa splits MLA heads: tiny_b has 8 heads (tp 3 refused), tiny_a 4 (tp 8 refused), naming the file.
  auto dsa_three = launch_tp(fixture_dir("glm_moe_dsa_tiny_b"), 3);
  ASSERT_FALSE(dsa_three.is_ok());
  EXPECT_NE(dsa_three.status().message().find("--tensor-parallel-size 3 does not divide num_attention_heads 8 of " +
                                              fixture_dir("glm_moe_dsa_tiny_b")),
            std::string::npos) << dsa_three.status().message();
  auto dsa_eight = launch_tp(fixture_dir("glm_moe_dsa_tiny_a"), 8);
  ASSERT_FALSE(dsa_eight.is_ok());
  EXPECT_NE(dsa_eight.status().message().find("does not divide num_attention_heads 4"), std::string::npos)
      << dsa_eight.status().message();

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
  EXPECT_NE(launch_model(lc).status().message().find("communicator=mpi: expected nccl, shared-device or auto"), std::string::npos);
  lc.communicator.clear();
  lc.backend = "cpu";
  lc.parallel = {.tp = 4, .ep = 2};  // expert parallelism: tests/unit/launch/test_expert_parallel.cpp
  EXPECT_NE(launch_model(lc).status().message().find("--ep-size 2 must be 1, the tensor-parallel size 4"),
            std::string::npos);
}

TEST(TensorParallel, CheckNamesEveryWidth) {
  model::ModelConfig c;
  c.source = "config.json";
  EXPECT_NE(check_tensor_parallel(c, 2).message().find(
                "implemented for Glm4MoeForCausalLM and GlmMoeDsaForCausalLM only"),
            std::string::npos);
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

// CUDA graphs at tp > 1 are the CUDA ranks' (one joined capture, launch/lockstep_model.h): CPU ranks refuse the
// device-input forward, naming why, so the engine runs eagerly.
TEST(TensorParallel, LockstepDeviceForwardIsRefusedForCpuRanks) {
  auto lm = launch_tp(fixture_dirs().front(), 2, false);
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  kvcache::KvCache kv((*lm)->model().kv_spec(8, 4), [&](DType dt, Shape s) { return (*lm)->backend().alloc(dt, s); });
  Tensor ids, positions, logits;
  backend::AttentionMeta meta;
  const Status st = (*lm)->model().forward_device(ids, positions, meta, kv, logits);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  EXPECT_NE(st.message().find("not CUDA ranks"), std::string::npos) << st.to_string();
}

// The device-input forward at tp 2 -- what the joined CUDA capture runs on every rank (launch/lockstep_model.h) --
// on the CPU ranks directly: each rank's forward_device of a decode step (ids through the device vocabulary map,
// the layer stack unfused or through the fused seam's reference, the vocabulary-parallel logits gathered into the
// caller's buffer) equals that rank's eager decode step, and both ranks hold the same logits; every fixture.
TEST(TensorParallel, RankDeviceForwardEqualsTheEagerStepAtTp2) {
  constexpr int kTp = 2, kBlock = 4;
  for (const std::string& dir : fixture_dirs()) {
    for (bool fused : {false, true}) {
      LaunchConfig lc;
      lc.model.path = dir;
      lc.backend = "cpu";
      lc.parallel = {.tp = kTp};
      lc.fused_allreduce = fused;
      lc.cpu_group.timeout = std::chrono::seconds(60);
      auto lm = launch_model(lc);
      ASSERT_TRUE(lm.is_ok()) << dir << ": " << lm.status().to_string();
      const int64_t V = (*lm)->config().vocab_size;
      model::ForwardBatch prefill, decode;
      model::SequenceSpan sp;
      sp.n_tokens = 10;
      sp.kv_len = 10;
      sp.block_table = {0, 1, 2};
      for (int32_t i = 0; i < 10; ++i) {
        prefill.token_ids.push_back(static_cast<int32_t>((7 * i + 3) % V));
        prefill.positions.push_back(i);
      }
      prefill.logit_rows = {9};
      prefill.seqs.push_back(sp);
      model::SequenceSpan dsp;
      dsp.n_tokens = 1;
      dsp.kv_len = 11;
      dsp.block_table = {0, 1, 2};
      decode.token_ids = {static_cast<int32_t>(V - 1)};  // the last rank's vocabulary slice
      decode.positions = {10};
      decode.logit_rows = {0};
      decode.seqs.push_back(dsp);
      std::vector<Tensor> eager(kTp), device(kTp);
      std::vector<Status> st(kTp, Status::ok());
      std::vector<std::thread> threads;
      for (int r = 0; r < kTp; ++r)
        threads.emplace_back([&, r] {
          model::CausalLM& m = (*lm)->rank_model(r);
          backend::Backend& be = (*lm)->rank_backend(r);
          auto alloc = [&](DType dt, Shape s) { return be.alloc(dt, std::move(s)); };
          kvcache::KvCache kv_e(m.kv_spec(4, kBlock), alloc), kv_d(m.kv_spec(4, kBlock), alloc);
          auto run = [&]() -> Status {
            MX_RETURN_IF_ERROR(m.forward(prefill, kv_e).status());
            MX_RETURN_IF_ERROR(m.forward(prefill, kv_d).status());
            MX_ASSIGN_OR_RETURN(model::ForwardOutput e, m.forward(decode, kv_e));
            eager[r] = be.to_host(e.logits);
            kernels::AttentionParams shape;
            MX_ASSIGN_OR_RETURN(backend::AttentionMeta meta, model::build_attention_meta(decode, be, kBlock, shape));
            meta.params.max_kv_len = 16;  // a class bound, as a graph's
            meta.params.n_leading_decode_rows = 1;
            const Tensor ids = be.upload(Tensor::view_of(decode.token_ids.data(), DType::kI32, {1}));
            const Tensor pos = be.upload(Tensor::view_of(decode.positions.data(), DType::kI32, {1}));
            Tensor logits = be.alloc(DType::kF32, {1, V});
            MX_RETURN_IF_ERROR(m.forward_device(ids, pos, meta, kv_d, logits));
            device[r] = be.to_host(logits);
            return Status::ok();
          };
          st[r] = run();
          if (!st[r].is_ok()) (*lm)->rank_communicator(r).abort(st[r]);
        });
      for (auto& t : threads) t.join();
      const std::string what = dir + (fused ? " fused" : " unfused");
      for (int r = 0; r < kTp; ++r) ASSERT_TRUE(st[r].is_ok()) << what << " rank " << r << ": " << st[r].to_string();
      for (int r = 0; r < kTp; ++r) {
        ASSERT_EQ(device[r].numel(), V);
        double diff = 0, norm = 0;
        for (int64_t v = 0; v < V; ++v) {
          const double e = eager[r].data<float>()[v], d = device[r].data<float>()[v];
          diff += (e - d) * (e - d);
          norm += e * e;
        }
        EXPECT_GT(norm, 0) << what;
        EXPECT_LE(std::sqrt(diff / norm), 1e-6) << what << " rank " << r;
        EXPECT_EQ(std::memcmp(device[r].raw(), device[0].raw(), V * sizeof(float)), 0) << what << " rank " << r;
      }
    }
  }
}

// Loading glm_moe_dsa for a rank of a layout whose tp does not divide the heads (without the launch's check):
// a load error naming the config key and the file.
TEST(TensorParallel, GlmMoeDsaLoadRefusesTpNotDividingHeads) {
  auto be = backend::make_backend("cpu");
  ASSERT_TRUE(be.is_ok());
  model::LoadOptions lo;
  lo.rank = {.tp = 3, .rank = 1};
  const std::string dir = fixture_dir("glm_moe_dsa_tiny_b");
  auto m = model::load_causal_lm(dir, **be, lo);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("num_attention_heads 8 is not divisible by --tensor-parallel-size 3"),
            std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find(dir), std::string::npos) << m.status().message();
}

// The replica check the glm_moe_dsa forward runs on its top-k: equal copies pass on every rank; a copy that
// differs on one rank fails every rank, naming what, the ranks and the first differing element.
TEST(TensorParallel, CheckReplicatedCatchesADifferingRank) {
  std::vector<parallel::RankLayout> ranks = {{.tp = 2, .rank = 0}, {.tp = 2, .rank = 1}};
  auto comms = parallel::make_cpu_communicators(ranks, {.timeout = std::chrono::seconds(30)});
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  auto be0 = backend::make_backend("cpu"), be1 = backend::make_backend("cpu");
  ASSERT_TRUE(be0.is_ok() && be1.is_ok());
  backend::Backend* bes[2] = {be0->get(), be1->get()};
  auto run = [&](int32_t rank1_value) {
    std::vector<Status> st(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        model::TensorParallel tp(*bes[r], ranks[r], (*comms)[r].get());
        Tensor topk = Tensor::empty(DType::kI32, {3, 4});
        for (int64_t i = 0; i < 12; ++i) topk.data<int32_t>()[i] = static_cast<int32_t>(i);
        if (r == 1) topk.data<int32_t>()[6] = rank1_value;
        st[r] = tp.check_replicated(topk, "the DSA top-k of layer 2");
      });
    for (auto& t : threads) t.join();
    return st;
  };
  const int64_t before = model::TensorParallel::replica_checks_passed();
  for (const Status& s : run(6)) EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(model::TensorParallel::replica_checks_passed(), before + 2);
  const std::vector<Status> bad = run(7);
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(bad[r].is_ok()) << "rank " << r;
    EXPECT_NE(bad[r].message().find("the DSA top-k of layer 2 differs between ranks " + std::to_string(r) + " and " +
                                    std::to_string(1 - r) + " (first at element 6"),
              std::string::npos) << bad[r].message();
  }
}

}  // namespace
}  // namespace mxserve::launch
