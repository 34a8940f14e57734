// `mxserve quantize`: a bf16/f16/f32 Hugging Face checkpoint -> MXFP4 (AMD Quark layout and config),
// FP8 block (DeepSeek / GLM-5 FP8 layout and config) or FP8 per channel (compressed-tensors), streaming tensor by tensor: memory is bounded by the
// largest tensor, never the model. Which tensors are quantized (default: routed experts only):
//   model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight       always candidates
//   model.layers.N.mlp.shared_experts.{gate,up,down}_proj.weight  with quantize_shared_experts
// minus modules matching an --exclude glob (module or tensor name) and, with mtp_bf16, every layer
// N >= num_hidden_layers (the MTP layer). Every other Linear weight (2-D "*.weight", except embeddings)
// stays as it is and is listed by its checkpoint name in the config's exclude / modules_to_not_convert / ignore,
// so a loader reading the config can check each tensor. Other files (tokenizer, ...) are copied through.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "core/status.h"
#include "quant/mxfp4.h"

namespace mxserve::quant {

enum class Scheme {
  kMxfp4,       // AMD Quark layout and config
  kFp8Block,    // 128x128 weight_scale_inv, DeepSeek / GLM-5 "fp8" config
  kFp8Channel,  // per-row weight_scale [out, 1], compressed-tensors "float-quantized" config (GLM-4.x FP8)
  kFp8Tensor,   // one weight_scale [1] per tensor, compressed-tensors config with strategy "tensor"
};
const char* scheme_name(Scheme s);  // "mxfp4", "fp8-block", "fp8-channel", "fp8-tensor"
Result<Scheme> parse_scheme(const std::string& name);

struct QuantizeOptions {
  std::string in_dir, out_dir;
  Scheme scheme = Scheme::kMxfp4;
  ScaleRule scale_rule = ScaleRule::kEven;  // mxfp4 only
  std::vector<std::string> exclude_globs;
  bool quantize_shared_experts = false;
  bool mtp_bf16 = false;                    // keep the MTP layer unquantized
  uint64_t shard_bytes = 4ull << 30;        // a shard closes before it would exceed this
};

struct QuantizeReport {
  int64_t n_tensors = 0;       // in the input
  int64_t n_quantized = 0;
  int64_t n_shards = 0;
  uint64_t bytes_in = 0, bytes_out = 0;
  std::vector<std::string> kept_modules;  // Linear modules left unquantized (the exclude list)
};

// progress: where progress lines go (nullptr: quiet).
Result<QuantizeReport> quantize_checkpoint(const QuantizeOptions& options, std::FILE* progress);

}  // namespace mxserve::quant
