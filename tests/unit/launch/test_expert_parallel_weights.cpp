// Expert parallelism, the weight side (docs/parallel.md): MoeBlock's documented contract -- its output is a
// partial sum over the expert-parallel group (local routed experts + this rank's shared-expert slice), the
// router replicated -- checked block by block against the one-rank block; and every weight source partitions
// to the one-rank model at ep 2: FP8-block and MXFP4 (Quark) checkpoints quantized at test time, a
// transformers 5.x fused expert stack, and synthetic weights.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <regex>

#include "cli/fixture.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "launch/launch.h"
#include "model/layers/blocks.h"
#include "quant/quantizer.h"
#include "runtime/sequence_runner.h"

namespace mxserve {
namespace {

namespace fs = std::filesystem;

Tensor random_f32(Shape shape, std::mt19937& rng, float scale) {
  Tensor t = Tensor::empty(DType::kF32, std::move(shape));
  std::normal_distribution<float> n(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
  return t;
}

// A MoE block of 8 experts (top 3 of 2 groups), width 8, one shared expert, hidden 16, random f32 weights.
struct BlockWeights {
  model::ModelConfig cfg;
  model::BoundWeights w;
  BlockWeights() {
    cfg.d_model = 16, cfg.n_experts = 8, cfg.moe_inter = 8, cfg.top_k = 3, cfg.n_group = 2, cfg.topk_group = 1;
    cfg.n_shared_experts = 1, cfg.routed_scaling_factor = 2.5;
    std::mt19937 rng(11);
    const int64_t H = cfg.d_model, I = cfg.moe_inter;
    auto add = [&](const std::string& n, Shape s, float scale) {
      w.add(n, model::BoundWeight(random_f32(std::move(s), rng, scale), model::Precision::kF32));
    };
    add("m.gate.weight", {8, H}, 0.5f);
    add("m.gate.e_score_correction_bias", {8}, 0.1f);
    for (int e = 0; e < 8; ++e)
      for (const char* p : {"gate_proj", "up_proj", "down_proj"})
        add("m.experts." + std::to_string(e) + "." + p + ".weight", p[0] == 'd' ? Shape{H, I} : Shape{I, H}, 0.3f);
    add("m.shared_experts.gate_proj.weight", {I, H}, 0.3f);
    add("m.shared_experts.up_proj.weight", {I, H}, 0.3f);
    add("m.shared_experts.down_proj.weight", {H, I}, 0.3f);
  }
};

TEST(ExpertParallelWeights, MoeBlockOutputIsAPartialSumOverTheGroup) {
  BlockWeights bw;
  auto be = backend::make_cpu_backend();
  std::mt19937 rng(3);
  const Tensor x = be->upload(random_f32({5, bw.cfg.d_model}, rng, 1.0f));
  auto run = [&](const parallel::RankLayout& rank, Tensor* routed_only, Tensor* shared_only) {
    model::WeightLoader wl(*be, bw.w);
    wl.set_rank(rank, nullptr);
    model::MoeBlock block = model::MoeBlock::load(wl, "m.", bw.cfg);
    if (rank.ep > 1) {  // this rank's experts, whole
      EXPECT_EQ(block.experts.n_experts(), 8 / rank.ep);
      EXPECT_EQ(block.experts.first_expert, rank.ep_rank() * 8 / rank.ep);
      EXPECT_EQ(block.experts.global_experts, 8);
      EXPECT_EQ(block.experts.inter(), bw.cfg.moe_inter);
    }
    Tensor out = be->alloc(DType::kF32, {5, bw.cfg.d_model});
    block.forward(*be, bw.cfg, x, out);
    if (routed_only != nullptr) {
      *routed_only = be->upload(Tensor::zeros(DType::kF32, out.shape()));
      block.forward_routed(*be, bw.cfg, x, *routed_only);
      *shared_only = be->alloc(DType::kF32, out.shape());
      block.forward_shared(*be, x, *shared_only);
    }
    return be->to_host(out);
  };
  const Tensor want = run(parallel::RankLayout{}, nullptr, nullptr);
  for (int n : {2, 4}) {
    Tensor sum = Tensor::zeros(DType::kF32, want.shape());
    for (int r = 0; r < n; ++r) {
      Tensor routed, shared;
      const Tensor part = run(parallel::RankLayout{.tp = n, .ep = n, .dp = 1, .rank = r}, &routed, &shared);
      const Tensor hr = be->to_host(routed), hs = be->to_host(shared);
      for (int64_t i = 0; i < part.numel(); ++i) {
        sum.data<float>()[i] += part.data<float>()[i];
        EXPECT_NEAR(hr.data<float>()[i] + hs.data<float>()[i], part.data<float>()[i], 1e-5f) << "forward = shared + routed";
      }
    }
    const cli::ErrorStats e = cli::compare(sum.data<float>(), want.data<float>(), want.numel());
    EXPECT_LT(e.rel_l2, 1e-6) << "ep " << n << ": the partial sums must add up to the one-rank block";
  }
}

fs::path scratch(const std::string& tag) {
  const fs::path p = fs::temp_directory_path() / ("mxserve_epw_" + std::to_string(::getpid()) + "_" + tag);
  fs::remove_all(p);
  return p;
}

const std::string kTinyB = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_b";

// tiny_b with every layer's routed experts written as transformers 5.x stacks (quant/hf_fused_experts.h).
fs::path fused_copy() {
  const fs::path out = scratch("fused");
  fs::create_directories(out);
  fs::copy_file(kTinyB + "/config.json", out / "config.json");
  auto f = io::SafetensorsFile::open(kTinyB + "/model.safetensors");
  EXPECT_TRUE(f.is_ok());
  const std::regex expert_re(R"((.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight)");
  std::map<std::string, std::map<int, std::map<std::string, Tensor>>> stacks;  // prefix -> expert -> part
  io::NamedTensors tensors;
  for (const auto& info : (*f)->tensors()) {
    const Tensor view = (*f)->view(info);
    std::smatch m;
    if (std::regex_match(info.name, m, expert_re)) stacks[m[1].str()][std::stoi(m[2].str())][m[3].str()] = view;
    else tensors.emplace_back(info.name, view);
  }
  for (const auto& [prefix, experts] : stacks) {
    const Tensor& g0 = experts.at(0).at("gate");
    const Tensor& d0 = experts.at(0).at("down");
    const int64_t E = static_cast<int64_t>(experts.size()), I = g0.dim(0), H = g0.dim(1);
    Tensor gate_up = Tensor::empty(g0.dtype(), {E, 2 * I, H}), down = Tensor::empty(d0.dtype(), {E, H, I});
    const uint64_t gb = g0.nbytes(), db = d0.nbytes();
    for (const auto& [e, parts] : experts) {
      std::memcpy(static_cast<char*>(gate_up.raw()) + e * 2 * gb, parts.at("gate").raw(), gb);
      std::memcpy(static_cast<char*>(gate_up.raw()) + e * 2 * gb + gb, parts.at("up").raw(), gb);
      std::memcpy(static_cast<char*>(down.raw()) + e * db, parts.at("down").raw(), db);
    }
    tensors.emplace_back(prefix + ".gate_up_proj", gate_up);
    tensors.emplace_back(prefix + ".down_proj", down);
  }
  EXPECT_FALSE(stacks.empty());
  EXPECT_TRUE(io::write_safetensors((out / "model.safetensors").string(), tensors).is_ok());
  return out;
}

fs::path quantized_copy(quant::Scheme scheme) {
  quant::QuantizeOptions o;
  o.in_dir = kTinyB;
  o.out_dir = scratch(quant::scheme_name(scheme)).string();
  o.scheme = scheme;
  auto r = quant::quantize_checkpoint(o, nullptr);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return o.out_dir;
}

Result<std::unique_ptr<launch::LaunchedModel>> launch(const std::string& path, int tp_ep, bool synthetic = false) {
  launch::LaunchConfig lc;
  lc.model.path = path;
  lc.model.synthetic = synthetic;
  lc.model.seed = 5;
  lc.model.load_mtp = true;
  lc.parallel = {.tp = tp_ep, .ep = tp_ep};
  return launch::launch_model(lc);
}

// Teacher-forced logits of every row and MTP logits of a prompt, and 8 greedy tokens.
struct Outputs {
  Tensor logits, mtp;
  std::vector<int32_t> greedy;
};

Outputs outputs(launch::LaunchedModel& lm) {
  const std::vector<int32_t> prompt = {3, 141, 59, 26, 5, 35, 89, 79, 32, 38, 46, 26};
  runtime::SequenceRunner runner(lm.model(), lm.backend(), 64, 4);
  Outputs o;
  runtime::SequenceState s, ms;
  auto step = runner.extend({&s}, {prompt}, true, true);
  EXPECT_TRUE(step.is_ok()) << step.status().to_string();
  o.logits = step->logits;
  const int64_t T = static_cast<int64_t>(prompt.size());
  auto mtp = runner.mtp(ms, std::vector<int32_t>(prompt.begin() + 1, prompt.end()), step->hidden.slice_rows(0, T - 1));
  EXPECT_TRUE(mtp.is_ok()) << mtp.status().to_string();
  o.mtp = *mtp;
  runner.release(s);
  runner.release(ms);
  auto g = runner.greedy(prompt, 8, 5, {});
  EXPECT_TRUE(g.is_ok());
  o.greedy = *g;
  return o;
}

void expect_same_model(const std::string& path, const std::string& what, bool synthetic = false) {
  auto one = launch(path, 1, synthetic);
  ASSERT_TRUE(one.is_ok()) << what << ": " << one.status().to_string();
  const Outputs want = outputs(**one);
  auto ep = launch(path, 2, synthetic);
  ASSERT_TRUE(ep.is_ok()) << what << " at ep 2: " << ep.status().to_string();
  EXPECT_EQ((*ep)->layout().ep, 2);
  const Outputs got = outputs(**ep);
  EXPECT_LT(cli::compare(got.logits.data<float>(), want.logits.data<float>(), want.logits.numel()).rel_l2, 1e-5) << what;
  EXPECT_LT(cli::compare(got.mtp.data<float>(), want.mtp.data<float>(), want.mtp.numel()).rel_l2, 1e-5) << what << " MTP";
  EXPECT_EQ(got.greedy, want.greedy) << what;
}

TEST(ExpertParallelWeights, EveryWeightSourcePartitionsToTheOneRankModel) {
  const fs::path fused = fused_copy();
  expect_same_model(fused.string(), "fused expert stacks");
  const fs::path fp8 = quantized_copy(quant::Scheme::kFp8Block);
  expect_same_model(fp8.string(), "fp8-block checkpoint");
  const fs::path mxfp4 = quantized_copy(quant::Scheme::kMxfp4);
  expect_same_model(mxfp4.string(), "mxfp4 (Quark) checkpoint");
  expect_same_model(kTinyB + "/config.json", "synthetic bf16 weights", /*synthetic=*/true);
  for (const fs::path& p : {fused, fp8, mxfp4}) fs::remove_all(p);
}

}  // namespace
}  // namespace mxserve
