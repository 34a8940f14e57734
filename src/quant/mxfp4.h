// MXFP4 (OCP MX v1.0): FP4 E2M1 elements, one E8M0 scale per 32 contiguous elements along the input
// (K) dimension, two elements per byte with element 2i in the low nibble. Bit-exact CPU reference for
// encoding, the three scale rules in use, packing and dequantization.
//
// Key invariants:
//   - element rounding is round-to-nearest, ties to the even code, saturating at +-6 (OCP);
//   - a weight [rows, k] packs to u8 [rows, k/2] (k must be even) and has u8 scales
//     [rows, ceil(k/32)]; when k % 32 != 0 the last block of a row is partial (an mxserve extension,
//     needed by tiny test models; real GLM widths are multiples of 32);
//   - non-finite inputs: a block holding a NaN or +-Inf gets the NaN scale 0xFF and zero codes, so it
//     dequantizes to NaN (OCP: a NaN scale makes the whole block NaN). `mxserve quantize` refuses
//     non-finite weights before this is reached.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace mxserve::quant {

inline constexpr int64_t kMxBlock = 32;    // elements per E8M0 scale
inline constexpr uint8_t kE8M0Nan = 0xff;  // the NaN scale

// How the shared exponent of a block is chosen from amax = max |x| of the block.
enum class ScaleRule {
  kEven,   // Quark default ("even"): round amax to E2M1 mantissa precision, then floor; X = 2^(e-2)
  kFloor,  // OCP MX v1.0 / torchao: X = 2^(floor(log2 amax) - 2); may saturate elements at +-6
  kCeil,   // triton_kernels / gpt-oss ROUND_UP: X = 2^ceil(log2(amax / 6)); never saturates
};
const char* scale_rule_name(ScaleRule r);  // "even", "floor", "ceil"
Result<ScaleRule> parse_scale_rule(const std::string& name);

// Nearest E2M1 code (sign bit 3) to v, ties to even code, |v| > 6 saturates to +-6. The sign of v is
// kept, so -0.1 encodes to 0x8 (-0). +-Inf saturates to +-6; NaN encodes to 0x0 (E2M1 has no NaN: the
// block quantizer marks such blocks with the NaN scale instead).
uint8_t e2m1_encode(float v);
float e2m1_decode(uint8_t code);  // low 4 bits

// E8M0 scale byte for a block with max magnitude amax (finite, >= 0; NaN/Inf give 0xFF). An all-zero
// block (amax 0) gets byte 0 (2^-127) under every rule. Exponents are clamped to [-127, 127].
uint8_t e8m0_scale_for(float amax, ScaleRule rule);

// One row of k elements: packed[(k+1)/2] bytes, scales[ceil(k/32)] bytes. k must be even.
void mxfp4_quantize_row(const float* x, int64_t k, ScaleRule rule, uint8_t* packed, uint8_t* scales);
void mxfp4_dequantize_row(const uint8_t* packed, const uint8_t* scales, int64_t k, float* out);

inline int64_t mx_scale_cols(int64_t k) { return (k + kMxBlock - 1) / kMxBlock; }

struct MxTensors {
  Tensor packed;  // u8 [rows, k/2]
  Tensor scales;  // u8 [rows, ceil(k/32)]
};

// w: host f32/bf16/f16 [rows, k]. Errors name `name` (odd k, wrong rank, unsupported dtype).
Result<MxTensors> quantize_mxfp4(const Tensor& w, ScaleRule rule, const std::string& name);
// packed u8 [rows, k/2] + scales u8|e8m0 [rows, ceil(k/32)] -> f32 [rows, k]. Shapes must match (CHECKed;
// the binder validated them).
Tensor dequantize_mxfp4(const Tensor& packed, const Tensor& scales, int64_t k);

}  // namespace mxserve::quant
