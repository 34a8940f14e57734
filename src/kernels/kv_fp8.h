// FP8 E4M3 KV cache quantization, shared by the CPU reference and the CUDA kv_write kernel (one source,
// so both backends write the same bytes). Scheme (docs/kv-cache.md): dynamic scales, one f32 per
// (token slot, kv head), scale = amax / 448 over the head's head_dim values, code = e4m3(x / scale)
// rounded to nearest even and saturated to +-448; dequantized value = e4m3_value(code) * scale.
// A head whose values are all zero gets scale 0 and zero codes (dequantizes to 0).
// Key invariant: everything here is exact IEEE f32 arithmetic (one division, compares, bit operations,
// rint), so the host and device results are bit-identical; no fast-math may touch the callers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MX_KV_FP8_HD __host__ __device__ __forceinline__
#else
#define MX_KV_FP8_HD inline
#endif

namespace mxserve::kernels {

constexpr float kFp8E4M3Max = 448.f;

MX_KV_FP8_HD uint32_t kv_fp8_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

// f32 -> OCP e4m3fn code: round to nearest even, saturate to +-448 (the satfinite convention), NaN -> 0x7f.
MX_KV_FP8_HD uint8_t f32_to_fp8_e4m3(float f) {
  const uint32_t bits = kv_fp8_bits(f);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag > 0x7f800000u) return 0x7f;                               // NaN
  if (mag >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7e);  // >= 448 (and inf): saturate
  if (mag >= 0x3c800000u) {                                         // >= 2^-6: normal e4m3
    // Keep 3 of 23 mantissa bits, round to nearest even on the 20 dropped ones (a carry bumps the exponent).
    const uint32_t rounded = mag + 0x7ffffu + ((mag >> 20) & 1u);
    const uint32_t exp = (rounded >> 23) - 120u;  // f32 bias 127 -> e4m3 bias 7
    const uint32_t man = (rounded >> 20) & 7u;
    return static_cast<uint8_t>(sign | (exp << 3) | man);  // < 448 before rounding: at most 448 = 0x7e after
  }
  // Subnormal e4m3: multiples of 2^-9; the scaled value is exact (a power-of-two product), rint is RNE.
  float a;
#if defined(__CUDA_ARCH__)
  a = __uint_as_float(mag);
  const float m = rintf(a * 512.f);
#else
  std::memcpy(&a, &mag, 4);
  const float m = std::nearbyint(a * 512.f);
#endif
  return static_cast<uint8_t>(sign | static_cast<uint8_t>(m));  // m == 8 is the smallest normal, code 0x08
}

// The dequantization scale of one (slot, kv head) from the absolute maximum of its values.
MX_KV_FP8_HD float kv_fp8_scale(float amax) { return amax > 0.f ? amax / kFp8E4M3Max : 0.f; }

// The code of x under scale (0 when scale is 0: an all-zero head).
MX_KV_FP8_HD uint8_t kv_fp8_quantize(float x, float scale) {
  return scale > 0.f ? f32_to_fp8_e4m3(x / scale) : static_cast<uint8_t>(0);
}

}  // namespace mxserve::kernels
