// Synthetic weights: the counter-based generator (seed, tensor-name stream, element index) -> value,
// compiled for the host (CPU backend, tests) and the device (CUDA backend) from this one header, so both
// backends produce bit-identical values. Owns the value rule only; the backends own the loops.
//
// Key invariants (what makes host == device bit for bit):
//   - z is an integer-built approximate standard normal: Irwin-Hall over the four 16-bit lanes of
//     mix64(stream ^ mix64(index)): z = (sum - 2 * 65535) / 37837.23 (unit variance, |z| <= 3.46, sharp
//     tails cut). Integer sum, int->float exact (< 2^24), one IEEE multiply: no libm call, no rounding choice.
//   - value = fma(stddev, z, mean): one correctly rounded fma on both sides (never left to contraction).
//   - bf16 rounding is round-to-nearest-even on the bit pattern (same code both sides).
//   - MXFP4 blocks: 32 consecutive bf16-rounded values along K of one row are quantized with Quark's "even" scale rule
//     (integer ops on amax's bits) and round-to-nearest-even E2M1 codes: bitwise quant::mxfp4_quantize_row
//     with ScaleRule::kEven on the same f32 values. Dequantized values are code * 2^(s-127): exact in bf16/f32.
#pragma once

#include <cstdint>

#include <cmath>

#if defined(__CUDACC__)
#define MX_HD __host__ __device__ __forceinline__
#else
#define MX_HD inline
#endif

namespace mxserve::kernels {

// What fill_synthetic writes into its destination.
enum class SyntheticKind : int32_t {
  kNormal,        // float dst (f32 or bf16) [rows, cols]: fma(stddev, z, mean), rounded to bf16 unless keep_f32
  kMxfp4,         // dst u8 packed codes [rows, cols/2] + scales u8 [rows, cols/32] of the kNormal values
  kMxfp4Dequant,  // float dst [rows, cols]: the kMxfp4 bytes dequantized (exact in bf16 and f32)
};

struct SyntheticFill {
  uint64_t stream = 0;     // synthetic_stream(seed, tensor name)
  float mean = 0.f, stddev = 0.02f;
  SyntheticKind kind = SyntheticKind::kNormal;
  bool keep_f32 = false;   // kNormal only: keep the f32 value (no bf16 rounding; e_score_correction_bias)
  // Window of the logical tensor [rows, src_cols] written: dst element (r, c) is logical element
  // r * src_cols + col_offset + c. dst holds rows x cols values (cols == src_cols, col_offset 0: whole rows).
  int64_t rows = 0, cols = 0, src_cols = 0, col_offset = 0;
};

// ---- the generator ---------------------------------------------------------------------------------

MX_HD uint64_t synth_mix64(uint64_t x) {  // splitmix64 finalizer (== core/hash.h mix64)
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Stream of one tensor: mix of the seed and the FNV-1a hash of its name (host only: names are strings).
inline uint64_t synthetic_stream(uint64_t seed, const char* name) {
  uint64_t h = 1469598103934665603ull;
  for (const char* p = name; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  return synth_mix64(seed ^ h);
}

MX_HD float synth_fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

MX_HD float synth_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// Approximately standard normal z for element i of a stream (see the header comment).
MX_HD float synth_normal(uint64_t stream, uint64_t i) {
  const uint64_t h = synth_mix64(stream ^ synth_mix64(i));
  const int32_t sum = static_cast<int32_t>(h & 0xffff) + static_cast<int32_t>((h >> 16) & 0xffff) +
                      static_cast<int32_t>((h >> 32) & 0xffff) + static_cast<int32_t>(h >> 48);
  // sd of the sum of 4 uniforms on {0..65535}: sqrt(4 * (65536^2 - 1) / 12) = 37837.23
  return synth_fmul(static_cast<float>(sum - 131070), 1.0f / 37837.23f);
}

MX_HD float synth_value(const SyntheticFill& p, uint64_t i) { return synth_fma(p.stddev, synth_normal(p.stream, i), p.mean); }

MX_HD uint32_t synth_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}

MX_HD float synth_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}

// f32 -> bf16 bits, round to nearest even (finite inputs; the generator makes no NaN/Inf).
MX_HD uint16_t synth_bf16_bits(float f) {
  const uint32_t u = synth_bits(f);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

MX_HD float synth_bf16_round(float f) { return synth_from_bits(static_cast<uint32_t>(synth_bf16_bits(f)) << 16); }

// Logical index of dst element (r, c).
MX_HD uint64_t synth_index(const SyntheticFill& p, int64_t r, int64_t c) {
  return static_cast<uint64_t>(r * p.src_cols + p.col_offset + c);
}

// kNormal value of dst element (r, c), as stored in f32 (bf16-rounded unless keep_f32).
MX_HD float synth_normal_element(const SyntheticFill& p, int64_t r, int64_t c) {
  const float v = synth_value(p, synth_index(p, r, c));
  return p.keep_f32 ? v : synth_bf16_round(v);
}

// ---- MXFP4 -----------------------------------------------------------------------------------------

// E2M1 code of v (sign bit 3), round to nearest, ties to the even code, saturating at 6 (== quant::e2m1_encode).
MX_HD uint8_t synth_e2m1_encode(float v) {
  const uint8_t sign = (synth_bits(v) >> 31) ? 0x8 : 0x0;
  const float m = synth_from_bits(synth_bits(v) & 0x7fffffffu);
  uint8_t code;
  if (m <= 0.25f) code = 0;
  else if (m < 0.75f) code = 1;
  else if (m <= 1.25f) code = 2;
  else if (m < 1.75f) code = 3;
  else if (m <= 2.5f) code = 4;
  else if (m < 3.5f) code = 5;
  else if (m <= 5.0f) code = 6;
  else code = 7;
  return static_cast<uint8_t>(sign | code);
}

MX_HD float synth_e2m1_decode(uint8_t code) {
  const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  const float m = mag[code & 7];
  return (code & 8) ? -m : m;
}

// 2^(s-127) for an E8M0 byte s (s = 0: 2^-127, a subnormal; only an all-zero block gets it).
MX_HD float synth_e8m0_value(uint8_t s) {
  return s == 0 ? synth_from_bits(0x00400000u) : synth_from_bits(static_cast<uint32_t>(s) << 23);
}

// One 32-element block (row r, block b) of the logical [rows, cols] tensor: 16 packed bytes + scale byte,
// and, when deq is non-null, the 32 dequantized values. Quark "even" rule: s = exponent(amax + half an
// E2M1 mantissa ulp) - 2, elements x * 2^-(s-127) encoded to E2M1.
MX_HD uint8_t synth_mxfp4_block(const SyntheticFill& p, int64_t r, int64_t b, uint8_t* packed16, float* deq32) {
  float x[32];
  float amax = 0.f;
  for (int i = 0; i < 32; ++i) {
    x[i] = synth_bf16_round(synth_value(p, synth_index(p, r, b * 32 + i)));  // the bf16 weight
    const float a = synth_from_bits(synth_bits(x[i]) & 0x7fffffffu);
    amax = a > amax ? a : amax;
  }
  const uint32_t field = ((synth_bits(amax) + 0x200000u) & 0x7f800000u) >> 23;
  int e = static_cast<int>(field) - 127 - 2;  // amax == 0 gives field 0: clamp like quant (biased(-127))
  if (field == 0) e = -127;
  if (e < -127) e = -127;
  if (e > 127) e = 127;
  const uint8_t s = static_cast<uint8_t>(e + 127);
  // x * 2^-e is exact: a power of two. 2^-e as f32 for e in [-126, 127]; e = -127 only when amax ~ 0.
  const float inv = e >= -126 ? synth_from_bits(static_cast<uint32_t>(127 - e) << 23) : synth_from_bits(0x7f000000u);
  const float scale = synth_e8m0_value(s);
  for (int i = 0; i < 32; i += 2) {
    const uint8_t lo = synth_e2m1_encode(synth_fmul(x[i], inv));
    const uint8_t hi = synth_e2m1_encode(synth_fmul(x[i + 1], inv));
    packed16[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
    if (deq32) {
      deq32[i] = synth_fmul(synth_e2m1_decode(lo), scale);
      deq32[i + 1] = synth_fmul(synth_e2m1_decode(hi), scale);
    }
  }
  return s;
}

namespace cpu {
// Host loops over the generator (kernels/cpu/synthetic_fill.cpp, OpenMP): dst is f32 (dst_bf16 false) or bf16
// bits for kNormal / kMxfp4Dequant, packed u8 for kMxfp4 (then scales u8 [rows, cols/32]).
void synthetic_fill(const SyntheticFill& p, void* dst, bool dst_bf16, uint8_t* scales);
}  // namespace cpu

}  // namespace mxserve::kernels
