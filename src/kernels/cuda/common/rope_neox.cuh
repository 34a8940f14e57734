// Partial NeoX RoPE arithmetic, shared by the rope kernel (elementwise.cu) and the fused RoPE + K/V cache write
// (rope_kv_write.cu): one definition, so the two kernels cannot drift apart by a bit. It is the CPU reference's
// formula (kernels/cpu/rope.cpp): inv_freq[j] = 1 / theta^(2j / rotary_dim) from a double pow rounded to f32,
// angle = f32(position) * inv_freq[j] in f32, sincosf, then the pair (j, j + rotary_dim / 2) rotated in f32;
// the callers round each output to bf16 once.
// Invariant: the callers compile with the same flags (no fast-math), so the same inputs give the same bits.
#pragma once

namespace mxserve::kernels::cuda {

__device__ __forceinline__ float rope_inv_freq(int j, int rotary_dim, float theta) {
  const float exponent = static_cast<float>(2 * j) / static_cast<float>(rotary_dim);
  return 1.0f / static_cast<float>(pow(static_cast<double>(theta), static_cast<double>(exponent)));
}

// sin / cos of the angle of pair j at `position` (inv_freq = rope_inv_freq(j, ...)).
__device__ __forceinline__ void rope_sincos(float position, float inv_freq, float* s, float* c) {
  sincosf(__fmul_rn(position, inv_freq), s, c);  // the angle rounded once, never contracted into sincosf's code
}

// The rotated pair: lo = x1 c - x2 s replaces x1 (dim j), hi = x2 c + x1 s replaces x2 (dim j + rotary_dim / 2).
// The roundings are pinned with intrinsics: left to the compiler, which product of each sum is fused into an fma
// depends on the surrounding code (nvcc gave the first draft of the fused kernel fma(x2, c, x1 s) for o2, the rope
// kernel fma(x1, s, x2 c): different bits). These are the rope kernel's as compiled before this header existed
// (its sm_90a code is byte-identical with them): lo = fma(x1, c, -round(x2 s)), hi = fma(x1, s, round(x2 c)).
__device__ __forceinline__ float rope_rotate_lo(float x1, float x2, float c, float s) {
  return __fmaf_rn(x1, c, -__fmul_rn(x2, s));
}
__device__ __forceinline__ float rope_rotate_hi(float x1, float x2, float c, float s) {
  return __fmaf_rn(x1, s, __fmul_rn(x2, c));
}

}  // namespace mxserve::kernels::cuda
