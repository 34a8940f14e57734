// FP8 e4m3 (OCP e4m3fn) weight quantization: 2-D block scales (DeepSeek-V3 / official GLM FP8 releases,
// `weight_scale_inv`, multiplied on dequantize) and a single per-tensor scale. Bit-exact CPU reference.
//
// Key invariants:
//   - elements round to nearest, ties to even, and saturate at +-448 (+-Inf saturates too; NaN -> 0x7F);
//   - a block's scale is s = amax / 448 computed in f32; elements are e4m3(x / s) with the division in
//     f32, and dequantize is q * s. An all-zero block gets s = 1. A block holding NaN/Inf gets s = NaN
//     and NaN codes (`mxserve quantize` refuses non-finite weights before this is reached);
//   - a weight [rows, cols] with block [br, bc] has scales f32 [ceil(rows/br), ceil(cols/bc)]; edge
//     blocks are partial.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace mxserve::quant {

inline constexpr int64_t kFp8Block = 128;
inline constexpr float kE4M3Max = 448.0f;

uint8_t e4m3_encode(float v);
float e4m3_decode(uint8_t code);

struct Fp8Tensors {
  Tensor weight;  // fp8_e4m3 [rows, cols]
  Tensor scale;   // f32 [ceil(rows/br), ceil(cols/bc)] (block) or [1] (per tensor)
};

// w: host f32/bf16/f16 [rows, cols]. Errors name `name`.
Result<Fp8Tensors> quantize_fp8_block(const Tensor& w, int64_t block_rows, int64_t block_cols,
                                      const std::string& name);
Result<Fp8Tensors> quantize_fp8_tensor(const Tensor& w, const std::string& name);
// One scale per output row: scale f32 [rows, 1] (compressed-tensors "channel" strategy).
Result<Fp8Tensors> quantize_fp8_channel(const Tensor& w, const std::string& name);

// weight fp8_e4m3 [rows, cols], scale of any float dtype with one element (per tensor) or one per row
// (per channel) -> f32 [rows, cols]. CHECKed like dequantize_fp8.
Tensor dequantize_fp8_rows(const Tensor& weight, const Tensor& scale);

// weight fp8_e4m3 [rows, cols], scale f32 grid (block size derived as ceil(rows/grid_rows), like HF) or a
// single element (per tensor) -> f32 [rows, cols]. Shapes are CHECKed (the binder validated them).
Tensor dequantize_fp8(const Tensor& weight, const Tensor& scale, int64_t block_rows, int64_t block_cols);

}  // namespace mxserve::quant
