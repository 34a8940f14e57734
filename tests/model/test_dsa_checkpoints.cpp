// glm_moe_dsa (GLM-5.x) checkpoints in their published layouts, written at test time from the fixtures by
// tools/independent_ckpt/dsa_formats.mjs (the format bounds are checked by test_independent_ckpt.cpp):
//   - bf16 over two shards + index: logits bit-identical to the single-file fixture;
//   - Quark MXFP4 whose exclude list misses the bf16 MTP layer (the seed's failure mode): a load error naming
//     the MTP tensors, the exclude list and what is stored;
//   - FP8 release layout with indexer.weights_proj stored FP8: an error naming it (the release keeps it bf16 and
//     quant_method fp8 never converts it, quant/fp8_release.h); with the release's own storage it loads.
// A writer failure fails these tests with the writer's output; only "node absent" outside CI skips them.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "dsa_ckpt_writer.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/causal_lm.h"
#include "quant_bound.h"

namespace mxserve {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& fx) { return std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/" + fx; }

Status load_status(const std::string& dir) {
  auto be = backend::make_cpu_backend();
  return model::load_causal_lm(dir, *be, model::LoadOptions{}).status();
}

void expect_all(const Status& s, const std::vector<std::string>& needles) {
  ASSERT_FALSE(s.is_ok()) << "the load must fail";
  for (const auto& n : needles) EXPECT_NE(s.message().find(n), std::string::npos) << "missing '" << n << "' in:\n" << s.message();
}

// A writer that runs and fails is an error carrying its output (the tests above then fail with it, never skip).
TEST(DsaCheckpoints, AWriterFailureIsAnErrorShowingItsOutput) {
  auto r = write_dsa_checkpoint("glm_moe_dsa_tiny_a", "no_such_format", 32);
  if (!r.is_ok() && dsa_writer_may_skip(r.status())) GTEST_SKIP() << r.status().to_string();
  ASSERT_FALSE(r.is_ok()) << "an unknown format must fail";
  EXPECT_FALSE(dsa_writer_may_skip(r.status())) << "a failed writer may not skip";
  expect_all(r.status(), {"dsa_formats.mjs", "failed (status", "its output:",
                          "usage: dsa_formats.mjs --fixture DIR --out DIR --format fp8_release|mxfp4_quark|bf16_sharded"});
}

TEST(DsaCheckpoints, Bf16ShardedIsBitIdenticalToTheFixture) {
  for (const char* fx : {"glm_moe_dsa_tiny_a", "glm_moe_dsa_tiny_b"}) {
    WRITE_DSA_CHECKPOINT_OR_FAIL(dir, fx, "bf16_sharded", 128);
    ASSERT_TRUE(fs::exists(fs::path(dir) / "model.safetensors.index.json"));
    auto a = quant_bound::case_logits(dir, fixture(fx)), b = quant_bound::case_logits(fixture(fx), fixture(fx));
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    ASSERT_EQ(a->size(), b->size());
    for (size_t i = 0; i < a->size(); ++i)
      EXPECT_EQ(std::memcmp((*a)[i].raw(), (*b)[i].raw(), (*a)[i].nbytes()), 0) << fx << " case " << i;
    fs::remove_all(dir);
  }
}

TEST(DsaCheckpoints, QuarkExcludeListMissingTheBf16MtpLayerIsNamed) {
  WRITE_DSA_CHECKPOINT_OR_FAIL(dir, "glm_moe_dsa_tiny_a", "mxfp4_quark", 32);
  EXPECT_TRUE(load_status(dir).is_ok()) << load_status(dir).to_string();  // as written: the MTP layer is listed
  {
    std::ifstream in(fs::path(dir) / "config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    nlohmann::json kept = nlohmann::json::array();
    for (const auto& e : cfg["quantization_config"]["exclude"])
      if (e.get<std::string>().rfind("model.layers.4.", 0) != 0) kept.push_back(e);
    cfg["quantization_config"]["exclude"] = kept;
    std::ofstream(fs::path(dir) / "config.json") << cfg.dump(2);
  }
  expect_all(load_status(dir), {"model.layers.4.eh_proj.weight: quantization_config (quant_method quark",
                                "model.layers.4.mlp.experts.0.gate_proj.weight: quantization_config",
                                "28 mismatched",  // eh_proj, 8 experts x 3, shared experts x 3: every MTP Linear
                                "expects mxfp4", "not matched by any exclude entry",
                                "(exclude: ['lm_head', 're:.*self_attn.*', 're:.*mlp.gate$'])", "stores bf16 [64, 128]"});
  fs::remove_all(dir);
}

TEST(DsaCheckpoints, Fp8ReleaseWithQuantizedWeightsProjIsNamed) {
  WRITE_DSA_CHECKPOINT_OR_FAIL(dir, "glm_moe_dsa_tiny_a", "fp8_release", 128);
  EXPECT_TRUE(load_status(dir).is_ok()) << load_status(dir).to_string();  // weights_proj / eh_proj bf16, unlisted
  const std::string w = "model.layers.2.self_attn.indexer.weights_proj.weight";
  {
    const std::string file = dir + "/model.safetensors";
    io::NamedTensors out;
    {
      auto f = io::SafetensorsFile::open(file);
      ASSERT_TRUE(f.is_ok());
      for (const auto& info : (*f)->tensors()) {
        Tensor view = (*f)->view(info);
        Tensor copy = Tensor::empty(info.dtype, info.shape);
        std::memcpy(copy.raw(), view.raw(), view.nbytes());
        if (info.name == w) {
          copy = Tensor::zeros(DType::kFP8E4M3, info.shape);
          out.emplace_back("model.layers.2.self_attn.indexer.weights_proj.weight_scale_inv",
                           Tensor::zeros(DType::kF32, {1, 1}));
        }
        out.emplace_back(info.name, std::move(copy));
      }
    }
    ASSERT_TRUE(io::write_safetensors(file, out).is_ok());
  }
  expect_all(load_status(dir), {w + ": quantization_config (quant_method fp8", "expects unquantized (bf16|f32|f16) [4, 64]",
                                "weights_proj, which quant_method fp8 never converts", "stores fp8-block"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mxserve
