// The attention kernels' FP8 E4M3 K/V load: 8 codes of one (slot, kv head) row (8 bytes) and the row's f32
// scale -> 8 bf16 in registers (16 bytes), the same layout the bf16 cache path copies into shared memory,
// so the math after the load is shared by both cache dtypes. No dequantized copy of the cache exists.
// Exactness: an e4m3 code widens exactly to f16 (the bits shifted into place are the value * 2^-8,
// subnormals included), then f32 * 256 is exact, then one f32 rounding for * scale (as the CPU reference)
// and one bf16 rounding (relative 2^-9, far below FP8's 2^-4).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/op_params.h"

namespace mxserve::kernels::cuda {

// Two e4m3 codes (low byte first) -> their values * 2^-8 as floats (exact: the f16 the bits form, widened).
__device__ __forceinline__ float2 fp8x2_e4m3_to_float2_over_256(uint32_t two) {
  const uint32_t bits = ((two & 0x7fu) << 7) | ((two & 0x80u) << 8) | ((two & 0x7f00u) << 15) | ((two & 0x8000u) << 16);
  __half2 h;
  static_assert(sizeof(h) == 4);
  *reinterpret_cast<uint32_t*>(&h) = bits;
  return __half22float2(h);
}

// Two e4m3 codes (low byte first) -> their values as floats.
__device__ __forceinline__ float2 fp8x2_e4m3_to_float2(uint32_t two) {
  const float2 f = fp8x2_e4m3_to_float2_over_256(two);
  return make_float2(f.x * 256.f, f.y * 256.f);
}

// 8 codes (raw, low byte first) * scale -> 8 bf16, packed as one 16-byte vector: the one dequantization of
// the attention kernels' K/V tiles (the plain loader below and the cp.async tile loader, kv_fp8_tile.cuh).
// The 2^8 goes into the scale once per 8 codes instead of once per code: (v 2^-8) (256 scale) is the same real
// product as v scale (256 scale is exact: scale <= FLT_MAX / 448), so the f32 rounding, and every bit, is the same.
__device__ __forceinline__ uint4 fp8x8_to_bf16(uint2 raw, float scale) {
  uint4 out;
  uint32_t* o = reinterpret_cast<uint32_t*>(&out);
  const float scale256 = scale * 256.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = i < 2 ? raw.x : raw.y;
    const float2 f = fp8x2_e4m3_to_float2_over_256((word >> (16 * (i % 2))) & 0xffffu);
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale256, f.y * scale256);
    o[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return out;
}

// 16 codes * scale -> 16 bf16 (lo: codes 0-7, hi: 8-15), the same values as fp8x8_to_bf16 twice: on sm_89+ the
// hardware e4m3x2 -> f16x2 conversion (exact: every e4m3 value is an f16), then f32 * scale (the same real product,
// one rounding) and bf16 RN; about half the instructions of the bit-twiddled path (the wgmma prefill kernel's
// producer warpgroup dequantizes a whole K / V tile per tile, kernels/cuda/attention/paged_attention_wgmma_ws.cu).
__device__ __forceinline__ void fp8x16_to_bf16(uint4 raw, float scale, uint4& lo, uint4& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint16_t two = static_cast<uint16_t>(w[i / 2] >> (16 * (i % 2)));
    uint32_t h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(two));  // low byte -> low half
    __half2 h;
    *reinterpret_cast<uint32_t*>(&h) = h2;
    const float2 f = __half22float2(h);
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
    o[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
#else
  lo = fp8x8_to_bf16(make_uint2(raw.x, raw.y), scale);
  hi = fp8x8_to_bf16(make_uint2(raw.z, raw.w), scale);
#endif
}

// 8 codes (8-byte aligned, global memory) * scale -> 8 bf16.
__device__ __forceinline__ uint4 load_fp8x8_as_bf16(const uint8_t* codes, float scale) {
  return fp8x8_to_bf16(*reinterpret_cast<const uint2*>(codes), scale);
}

// The chunk of 8 elements at element offset `off` (a multiple of 8) of cache row `slot`, head `kvh`, as
// bf16: an FP8 cache (p.fp8_kv()) stores codes where a bf16 one stores values, so the same element
// offset is a byte offset into the codes. Returns the K chunk in k, the V chunk in v.
__device__ __forceinline__ void load_fp8_kv_chunk(const void* k_cache, const void* v_cache, int64_t off,
                                                  int64_t slot, int kvh, const AttentionParams& p, uint4& k,
                                                  uint4& v) {
  const int64_t s = slot * p.n_kv_heads + kvh;
  k = load_fp8x8_as_bf16(static_cast<const uint8_t*>(k_cache) + off, p.k_scales[s]);
  v = load_fp8x8_as_bf16(static_cast<const uint8_t*>(v_cache) + off, p.v_scales[s]);
}

}  // namespace mxserve::kernels::cuda
