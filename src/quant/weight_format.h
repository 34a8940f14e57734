// Precision: how one logical weight is stored in a checkpoint, and StoredWeight: the tensors that hold
// it. A quantized weight is one logical [out, in] matrix spread over a data tensor and a scale tensor:
//   mxfp4        X.weight u8 [out, in/2] + X.weight_scale u8|e8m0 [out, ceil(in/32)]     (AMD Quark)
//   fp8-block    X.weight f8_e4m3 [out, in] + X.weight_scale_inv f32 [ceil(out/br), ceil(in/bc)]
//   fp8-tensor   X.weight f8_e4m3 [out, in] + X.weight_scale f32|bf16|f16 [1] (or [])
//   fp8-channel  X.weight f8_e4m3 [out, in] + X.weight_scale f32|bf16|f16 [out, 1] (or [out])
//                (compressed-tensors "float-quantized", e.g. the official GLM-4.x FP8 releases)
//   mxfp4-gptoss X_blocks u8 [E, N, in/32, 16] + X_scales u8 [E, N, in/32]              (gpt-oss experts)
// Invariant: the precision is read from the tensors present, never from names or configs.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace mxserve::quant {

enum class Precision { kF32, kBF16, kF16, kMxfp4, kFp8Block, kFp8Tensor, kFp8Channel, kMxfp4GptOss };
const char* precision_name(Precision p);  // "f32", "bf16", "f16", "mxfp4", "fp8-block", "fp8-tensor", "fp8-channel", "mxfp4-gptoss"
bool is_quantized(Precision p);
bool is_float(Precision p);  // f32 / bf16 / f16

struct StoredWeight {
  Precision precision = Precision::kBF16;
  std::string name;        // the data tensor: "X.weight" (or "X_blocks")
  Tensor data;             // host view of the stored data tensor
  std::string scale_name;  // empty for plain floats
  Tensor scale;            // host view of the scale tensor
  Shape shape;             // logical shape ([out, in]; [E, N, in] for gpt-oss blocks)
  int64_t block_rows = 0;  // fp8-block block size
  int64_t block_cols = 0;

  // "mxfp4 (weight u8[32, 32] + weight_scale u8[32, 2])", "bf16 [32, 64]".
  std::string describe() const;
};

// What a weight of logical shape `shape` stored as `p` looks like on disk (for error messages):
// "mxfp4 (X.weight u8 [32, 32] + X.weight_scale u8 [32, 2])".
std::string expected_storage(Precision p, const Shape& shape, int64_t block_rows = 128, int64_t block_cols = 128);

// Dequantizes (or converts) to a host f32 tensor of the logical shape. Plain float weights are
// converted too, so callers get one representation.
Tensor to_host_f32(const StoredWeight& w);

}  // namespace mxserve::quant
