// MXFP4 routed experts on the GPU (issue 9; label gpu, skips without a CUDA device). A small glm4_moe model
// whose widths are multiples of 32 (d_model 64, expert width 32: the committed fixtures' 48/24 are not) is
// written as a bf16 checkpoint from deterministic random weights, quantized to MXFP4 with the library behind
// `mxserve quantize`, and loaded on both backends: the CPU backend dequantizes the experts, the CUDA backend
// must keep them packed (ExpertFormat::kMxfp4, checked through the selection it records for every MXFP4
// shape and through its device memory) and run the fused MXFP4 kernels. Both see the same E2M1 codes and
// E8M0 scales, so the logits differ only by the CUDA backend's bf16 activations.
//
// Declared tolerance: teacher-forced logits rel L2 <= 3e-2 (the bf16 golden-fixture bound is 2e-2 at 2-4
// layers; MXFP4 experts add nothing exact-vs-exact, the extra margin covers the fused kernels' bf16
// intermediates). Token counts 1, 5, 70 and 1100 cover the decode, between and prefill regimes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "io/checkpoint.h"
#include "io/safetensors_writer.h"
#include "model/archs/glm4_moe.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/layers/weight_loader.h"
#include "model/synthetic_weights.h"
#include "quant/quantizer.h"
#include "runtime/sequence_runner.h"

namespace mxserve {
namespace {

namespace fs = std::filesystem;

constexpr double kMaxLogitsRelL2 = 3e-2;

fs::path scratch(const std::string& tag) {
  const fs::path p = fs::temp_directory_path() / ("mxserve_mxfp4moe_" + std::to_string(::getpid()) + "_" + tag);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// A glm4_moe config with every width a multiple of 32; 2 MoE layers, 8 experts, top-2, no MTP layer.
// MXSERVE_FIXTURE_ROOT overrides the fixtures directory (the GPU machine runs from a copied tree).
nlohmann::json small_config() {
  const char* env = std::getenv("MXSERVE_FIXTURE_ROOT");
  const fs::path root = env ? fs::path(env) : fs::path(MXSERVE_SOURCE_DIR) / "tests/fixtures";
  std::ifstream in(root / "glm4_moe_tiny_b/config.json");
  nlohmann::json c = nlohmann::json::parse(in);
  c["hidden_size"] = 64;
  c["intermediate_size"] = 128;
  c["moe_intermediate_size"] = 32;
  c["num_attention_heads"] = 4;
  c["num_key_value_heads"] = 2;
  c["head_dim"] = 16;
  c["n_routed_experts"] = 8;
  c["num_experts_per_tok"] = 2;
  c["n_shared_experts"] = 1;
  c["num_hidden_layers"] = 2;
  c["first_k_dense_replace"] = 0;
  c["num_nextn_predict_layers"] = 0;
  c["vocab_size"] = 320;
  return c;
}

// bf16 checkpoint (random weights) -> MXFP4 checkpoint; returns the MXFP4 directory.
fs::path make_mxfp4_checkpoint() {
  const fs::path bf16 = scratch("bf16"), mx = scratch("mxfp4");
  fs::remove_all(mx);
  std::ofstream(bf16 / "config.json") << small_config().dump(2);
  auto cfg = model::load_model_config(bf16.string());
  EXPECT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  if (!cfg.is_ok()) return {};
  const auto table = model::glm4_moe_weight_table(*cfg, /*include_mtp=*/false);
  model::BoundWeights w = model::make_synthetic_weights(table, cfg->d_model, /*seed=*/7);
  io::NamedTensors tensors;
  for (const auto& n : w.names()) tensors.emplace_back(n, w.at(n).host);
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  const Status ws = io::write_safetensors((bf16 / "model.safetensors").string(), tensors);
  EXPECT_TRUE(ws.is_ok()) << ws.to_string();
  quant::QuantizeOptions o;
  o.in_dir = bf16.string();
  o.out_dir = mx.string();
  o.scheme = quant::Scheme::kMxfp4;
  auto r = quant::quantize_checkpoint(o, nullptr);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return mx;
}

TEST(CudaMxfp4Moe, PackedExpertsMatchTheCpuBackend) {
  auto cuda = backend::make_backend("cuda");
  if (!cuda.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << cuda.status().to_string() << ")";
  ASSERT_TRUE((*cuda)->supports_expert_format(backend::ExpertFormat::kMxfp4));
  const fs::path dir = make_mxfp4_checkpoint();
  ASSERT_FALSE(dir.empty());

  auto cpu = backend::make_cpu_backend();
  auto cpu_lm = model::load_causal_lm(dir.string(), *cpu, model::LoadOptions{});
  ASSERT_TRUE(cpu_lm.is_ok()) << cpu_lm.status().to_string();
  EXPECT_TRUE(cpu->moe_kernel_configs().empty());  // the CPU backend dequantized (no MXFP4 experts to select for)

  // The loader itself, on the device: layer 0's experts stay packed (u8 on the GPU, the checkpoint's bytes).
  {
    auto cfg = model::load_model_config(dir.string());
    ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
    auto ckpt = io::Checkpoint::open(dir.string());
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    auto bound = model::bind_weights(**ckpt, model::glm4_moe_weight_table(*cfg, false),
                                     model::glm4_moe_bind_options(*cfg, false));
    ASSERT_TRUE(bound.is_ok()) << bound.status().to_string();
    std::vector<std::vector<std::string>> gate_up;
    std::vector<std::string> down;
    for (int e = 0; e < 8; ++e) {
      const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
      gate_up.push_back({p + "gate_proj.weight", p + "up_proj.weight"});
      down.push_back(p + "down_proj.weight");
    }
    ASSERT_EQ(bound->at(down[0]).precision(), quant::Precision::kMxfp4);
    model::WeightLoader wl(**cuda, *bound);
    const backend::ExpertWeights ex = wl.experts(gate_up, down);
    ASSERT_EQ(ex.format, backend::ExpertFormat::kMxfp4);
    for (const Tensor* t : {&ex.gate_up, &ex.gate_up_scales, &ex.down, &ex.down_scales}) {
      EXPECT_EQ(t->dtype(), DType::kU8);
      EXPECT_EQ(t->device().type, DeviceType::kCUDA);
    }
    EXPECT_EQ(ex.gate_up.shape(), (Shape{8, 64, 32}));
    EXPECT_EQ(ex.gate_up_scales.shape(), (Shape{8, 64, 2}));
    EXPECT_EQ(ex.down.shape(), (Shape{8, 64, 16}));
    EXPECT_EQ(ex.down_scales.shape(), (Shape{8, 64, 1}));
    const Tensor codes = (*cuda)->to_host(ex.gate_up);
    const Tensor& up1 = bound->at(gate_up[1][1]).stored.data;  // expert 1, up rows follow its 32 gate rows
    EXPECT_EQ(std::memcmp(codes.data<uint8_t>() + (64 + 32) * 32, up1.raw(), up1.nbytes()), 0);
  }

  auto cuda_lm = model::load_causal_lm(dir.string(), **cuda, model::LoadOptions{});
  ASSERT_TRUE(cuda_lm.is_ok()) << cuda_lm.status().to_string();

  // The CUDA backend records a selection only for experts stored as MXFP4 (prepare_moe on each MoE layer):
  // one shape E8_H64_I32_K2_mxfp4, with no tuned table for this GPU -> the heuristic.
  const auto rows = (*cuda)->moe_kernel_configs();
  ASSERT_FALSE(rows.empty()) << "the CUDA backend did not keep the routed experts as mxfp4";
  for (const auto& r : rows) EXPECT_EQ(r.shape, "E8_H64_I32_K2_mxfp4");

  const int64_t V = (*cpu_lm)->config().vocab_size;
  runtime::SequenceRunner cpu_run(**cpu_lm, *cpu, 256, 16);
  runtime::SequenceRunner cuda_run(**cuda_lm, **cuda, 256, 16);
  for (int64_t T : {1, 5, 70, 1100}) {
    std::vector<int32_t> ids(T);
    for (int64_t i = 0; i < T; ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % V);
    runtime::SequenceState a, b;
    auto ra = cpu_run.extend({&a}, {ids}, /*all_logits=*/true, /*want_hidden=*/false);
    auto rb = cuda_run.extend({&b}, {ids}, /*all_logits=*/true, /*want_hidden=*/false);
    ASSERT_TRUE(ra.is_ok()) << ra.status().to_string();
    ASSERT_TRUE(rb.is_ok()) << rb.status().to_string();
    cpu_run.release(a);
    cuda_run.release(b);
    const auto e = cli::compare(rb->logits.data<float>(), ra->logits.data<float>(), T * V);
    EXPECT_LE(e.rel_l2, kMaxLogitsRelL2) << "T=" << T;
    std::printf("mxfp4 experts, T=%lld: logits rel L2 %.3e (tolerance %.1e)\n", static_cast<long long>(T), e.rel_l2,
                kMaxLogitsRelL2);
  }
  fs::remove_all(dir.parent_path() / ("mxserve_mxfp4moe_" + std::to_string(::getpid()) + "_bf16"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mxserve
