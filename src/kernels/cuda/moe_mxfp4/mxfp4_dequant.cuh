// In-register MXFP4 dequantization shared by the MXFP4 MoE kernels: E2M1 code pairs -> bf16x2 and the
// E8M0 block scale -> the bf16 factor that finishes the conversion. Plain integer + bf16x2 ops (sm_80+).
//
// The bit trick: an E2M1 magnitude (e1 e0 m) dropped into bf16 bits 8..6 (the low two exponent bits and
// the top mantissa bit), sign into bit 15, reads as value * 2^-126 exactly, code 1 (0.5) becoming the
// subnormal 2^-127 (bf16 multiplies keep subnormals). Multiplying by 2^126 * 2^(s-127) = 2^(s-1) gives
// the dequantized weight, exact in bf16 (2 mantissa bits times a power of two).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace mxserve::kernels::cuda {

// Byte i (compile-time) of w as bf16x2 bits (lo nibble -> low half, hi nibble -> high half), value * 2^-126.
// w4 = w << 4: its byte i carries the lo nibble of w's byte i in its top 4 bits.
template <int kByte>
__device__ __forceinline__ uint32_t e2m1_pair_raw(uint32_t w, uint32_t w4) {
  // x: byte 1 <- byte i of w4 (lo nibble at bits 12..15), byte 3 <- byte i of w (hi nibble at bits 28..31)
  constexpr uint32_t kSel = kByte | (kByte << 4) | ((4 + kByte) << 8) | ((4 + kByte) << 12);
  const uint32_t x = __byte_perm(w4, w, kSel);
  return (x & 0x80008000u) | ((x >> 6) & 0x01C001C0u);
}

__device__ __forceinline__ __nv_bfloat162 as_bf162(uint32_t bits) {
  return *reinterpret_cast<const __nv_bfloat162*>(&bits);
}
__device__ __forceinline__ uint32_t as_u32(__nv_bfloat162 v) { return *reinterpret_cast<const uint32_t*>(&v); }

// E8M0 byte s -> the factor(s) turning raw pairs into weights. 2^(s-1) is a bf16 normal for s <= 128
// (every real checkpoint: |w| < 256); above that two multiplies (2^126 then 2^(s-127)); 255 is NaN.
struct Mxfp4Factor {
  uint32_t f1, f2;  // bf16x2 bits
  bool two_step;
};
__device__ __forceinline__ Mxfp4Factor mxfp4_factor(uint32_t s) {
  Mxfp4Factor f;
  f.two_step = s > 128;
  const uint32_t h1 = f.two_step ? (253u << 7) : ((s + 126u) << 7);  // 2^126 or 2^(s-1)
  const uint32_t h2 = s == 255u ? 0x7FC0u : (s << 7);                 // NaN or 2^(s-127)
  f.f1 = h1 | (h1 << 16);
  f.f2 = h2 | (h2 << 16);
  return f;
}
__device__ __forceinline__ uint32_t mxfp4_apply(uint32_t raw, const Mxfp4Factor& f) {
  __nv_bfloat162 v = __hmul2(as_bf162(raw), as_bf162(f.f1));
  if (f.two_step) v = __hmul2(v, as_bf162(f.f2));
  return as_u32(v);
}

// One 32-bit word of E2M1 codes (4 bytes, 8 weights) -> 8 bf16 weights as one uint4, in byte order (byte i ->
// component i: its lo nibble the low half).
__device__ __forceinline__ uint4 mxfp4_dequant_word(uint32_t w, const Mxfp4Factor& f) {
  const uint32_t w4 = w << 4;
  uint4 v;
  v.x = mxfp4_apply(e2m1_pair_raw<0>(w, w4), f);
  v.y = mxfp4_apply(e2m1_pair_raw<1>(w, w4), f);
  v.z = mxfp4_apply(e2m1_pair_raw<2>(w, w4), f);
  v.w = mxfp4_apply(e2m1_pair_raw<3>(w, w4), f);
  return v;
}

// The MMA A fragment (m16n8k16, weights = operand A) of MMA kJ (0..7) of one 128-wide k step, from a lane's
// 16 code bytes of rows g (qa) and g+8 (qb): bytes 2kJ (regs 0/1: k slots 2t, 2t+1) and 2kJ+1 (regs 2/3:
// 2t+8, 2t+9), the byte's low nibble in the low bf16 half. The k order this implies is the one the kernels
// give their token operand (docs/cuda.md, "K permutation"). One fragment at a time: 4 registers live.
template <int kJ>
__device__ __forceinline__ void mxfp4_a_frag(const uint4& qa, const uint4& qb, const Mxfp4Factor& fa,
                                             const Mxfp4Factor& fb, uint32_t (&a)[4]) {
  constexpr int wi = kJ / 2, b0 = (kJ % 2) * 2;
  const uint32_t x = wi == 0 ? qa.x : wi == 1 ? qa.y : wi == 2 ? qa.z : qa.w;
  const uint32_t y = wi == 0 ? qb.x : wi == 1 ? qb.y : wi == 2 ? qb.z : qb.w;
  const uint32_t x4 = x << 4, y4 = y << 4;
  a[0] = mxfp4_apply(e2m1_pair_raw<b0>(x, x4), fa);
  a[2] = mxfp4_apply(e2m1_pair_raw<b0 + 1>(x, x4), fa);
  a[1] = mxfp4_apply(e2m1_pair_raw<b0>(y, y4), fb);
  a[3] = mxfp4_apply(e2m1_pair_raw<b0 + 1>(y, y4), fb);
}

// mxfp4_a_frag's fragment from one code word of row g (ca) and one of row g + 8 (cb), with ca4 / cb4 = the words
// << 4: half h (0: bytes 0 / 1 of the word, 1: bytes 2 / 3). kTwoStep known at compile time (false: the single
// 2^(s-1) multiply of f1; the design-9 / GEMV kernels choose it per warp).
template <bool kTwoStep>
__device__ __forceinline__ void mxfp4_a_frag_word(uint32_t ca, uint32_t ca4, uint32_t cb, uint32_t cb4, int h,
                                                  const Mxfp4Factor& fa, const Mxfp4Factor& fb, uint32_t (&a)[4]) {
  a[0] = h == 0 ? e2m1_pair_raw<0>(ca, ca4) : e2m1_pair_raw<2>(ca, ca4);
  a[2] = h == 0 ? e2m1_pair_raw<1>(ca, ca4) : e2m1_pair_raw<3>(ca, ca4);
  a[1] = h == 0 ? e2m1_pair_raw<0>(cb, cb4) : e2m1_pair_raw<2>(cb, cb4);
  a[3] = h == 0 ? e2m1_pair_raw<1>(cb, cb4) : e2m1_pair_raw<3>(cb, cb4);
  if constexpr (kTwoStep) {
    a[0] = mxfp4_apply(a[0], fa);
    a[2] = mxfp4_apply(a[2], fa);
    a[1] = mxfp4_apply(a[1], fb);
    a[3] = mxfp4_apply(a[3], fb);
  } else {
    a[0] = as_u32(__hmul2(as_bf162(a[0]), as_bf162(fa.f1)));
    a[2] = as_u32(__hmul2(as_bf162(a[2]), as_bf162(fa.f1)));
    a[1] = as_u32(__hmul2(as_bf162(a[1]), as_bf162(fb.f1)));
    a[3] = as_u32(__hmul2(as_bf162(a[3]), as_bf162(fb.f1)));
  }
}

// The exact E2M1 values of a raw pair (scale not applied): raw * 2^126.
__device__ __forceinline__ __nv_bfloat162 e2m1_pair_value(uint32_t raw) {
  constexpr uint32_t k2p126 = (253u << 7) | ((253u << 7) << 16);
  return __hmul2(as_bf162(raw), as_bf162(k2p126));
}

// 2^(s-127) as f32 (s = 0 is the subnormal 2^-127; 255 NaN).
__device__ __forceinline__ float e8m0_to_f32(uint32_t s) {
  if (s == 0) return __uint_as_float(0x00400000u);
  if (s == 255) return __uint_as_float(0x7FC00000u);
  return __uint_as_float(s << 23);
}

}  // namespace mxserve::kernels::cuda
