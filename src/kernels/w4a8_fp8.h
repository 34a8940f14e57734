// W4A8 (MXFP4 weights x per-token FP8 e4m3 activations) number formats, shared by the CUDA design-8 kernels
// (kernels/cuda/moe_mxfp4/moe_mxfp4_wg8.cu) and the CPU oracle of their tests (tests/ops/moe_mxfp4_synth.h),
// so both sides produce the same bytes. Key invariant: only exact IEEE f32 arithmetic (one division, compares,
// bit operations; the e4m3 encoder of kernels/kv_fp8.h), so host and device agree bit for bit; no fast-math
// may touch the callers.
//
// Activations: one f32 scale per row (token of x, or permuted row of the SwiGLU intermediate):
//   scale = amax / 448 (amax 0 -> 1), code = e4m3_rn_satfinite(x / scale), value = e4m3(code) * scale.
// Weights: a weight row of K E2M1 codes with one E8M0 byte s_b per 32 K. With the row's reference exponent
//   r = max_b s_b and d = r - s_b, block b's elements are stored as the e4m3 code of e2m1 * 2^(6 - d), and the
//   GEMM epilogue multiplies the row's column by 2^(r - 127 - 6). For d <= 11 every E2M1 magnitude
//   {0, .5, 1, 1.5, 2, 3, 4, 6} * 2^(6 - d) is an e4m3 normal (exact): its code is the d = 0 code minus 8 d
//   (d = 0 codes 0x00 0x60 0x68 0x6C 0x70 0x74 0x78 0x7C). For d > 11 the small magnitudes fall into e4m3
//   subnormals or flush to zero: w4a8_weight_code rounds them (RN), the one place W4A8 changes a weight.
#pragma once

#include <cstdint>

#include "kernels/kv_fp8.h"

#if defined(__CUDACC__)
#define MX_W4A8_HD __host__ __device__ __forceinline__
#else
#define MX_W4A8_HD inline
#endif

namespace mxserve::kernels {

// Largest block-exponent distance whose weights convert exactly (the fast table path).
constexpr int kW4a8ExactMaxD = 11;

// Per-row activation scale from the absolute maximum of the row (amax 0 -> 1: the codes are all zero anyway).
MX_W4A8_HD float w4a8_act_scale(float amax) { return amax > 0.f ? amax / kFp8E4M3Max : 1.f; }
MX_W4A8_HD uint8_t w4a8_act_code(float x, float scale) { return f32_to_fp8_e4m3(x / scale); }

// The e4m3 code of E2M1 code `e2m1` (sign bit 3, magnitude bits 0..2) in a block at exponent distance d >= 0.
MX_W4A8_HD uint8_t w4a8_weight_code(uint32_t e2m1, int d) {
  const uint32_t mag = e2m1 & 7u;
  const uint8_t sign = (e2m1 & 8u) ? 0x80 : 0x00;
  if (mag == 0) return sign;  // +-0 (a negative zero code is 0x80: value -0, harmless)
  constexpr uint8_t kD0[8] = {0x00, 0x60, 0x68, 0x6C, 0x70, 0x74, 0x78, 0x7C};
  if (d <= kW4a8ExactMaxD) return static_cast<uint8_t>(sign | (kD0[mag] - 8 * d));
  // Slow exact path: value * 2^(6 - d) as f32 (exact: a power-of-two product, d <= 255), then e4m3 RN.
  constexpr float kMag[8] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float v = kMag[mag] * 64.f;
  for (int i = 0; i < d && v != 0.f; ++i) v *= 0.5f;  // exact halvings down to the f32 subnormals
  return static_cast<uint8_t>(sign | f32_to_fp8_e4m3(v));
}

// __byte_perm (prmt, default mode) on the host: byte i of the result = byte (sel >> 4 i) & 7 of {hi:lo}.
MX_W4A8_HD uint32_t w4a8_byte_perm(uint32_t lo, uint32_t hi, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(lo, hi, sel);
#else
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((v >> (8 * ((sel >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
  return r;
#endif
}

// The byte table of the fast path at distance d <= 11: lo = codes of magnitudes 0..3, hi = 4..7 (the d = 0
// codes minus 8 d in every nonzero byte; no byte borrows since 0x60 >= 8 * 11).
struct W4a8Table {
  uint32_t lo, hi;
};
MX_W4A8_HD W4a8Table w4a8_table(int d) {
  const uint32_t dd = 8u * static_cast<uint32_t>(d);
  return {0x6C686000u - dd * 0x01010100u, 0x7C787470u - dd * 0x01010101u};
}

// 8 E2M1 codes (one word, element 2i = low nibble of byte i) -> 8 e4m3 bytes (x: elements 0..3, y: 4..7) at
// distance d <= 11: the masked nibbles select from the table, the sign (nibble bit 3) goes to byte bit 7.
// Equal to w4a8_weight_code element by element (tests/unit/kernels/test_w4a8_fp8.cpp).
struct W4a8Pair {
  uint32_t x, y;
};
MX_W4A8_HD W4a8Pair w4a8_convert8(uint32_t w, W4a8Table t) {
  const uint32_t m = w & 0x77777777u;
  // b0 b0 b1 b1 / b2 b2 b3 b3: element j's sign at bit 3 (even j) or 7 (odd j) of byte j.
  const uint32_t y0 = w4a8_byte_perm(w, 0u, 0x1100), y1 = w4a8_byte_perm(w, 0u, 0x3322);
  return {w4a8_byte_perm(t.lo, t.hi, m & 0xFFFFu) | ((y0 << 4) & 0x00800080u) | (y0 & 0x80008000u),
          w4a8_byte_perm(t.lo, t.hi, m >> 16) | ((y1 << 4) & 0x00800080u) | (y1 & 0x80008000u)};
}

// 2^(r - 127 - 6): the per-row epilogue factor undoing the +6 of the codes and applying the E8M0 reference.
MX_W4A8_HD float w4a8_row_factor(int r) {
  float f = 1.f;
  int e = r - 127 - 6;
  for (; e > 0; --e) f *= 2.f;
  for (; e < 0; ++e) f *= 0.5f;
  return f;
}

}  // namespace mxserve::kernels
