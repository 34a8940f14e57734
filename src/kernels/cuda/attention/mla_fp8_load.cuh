// Device reads of the packed FP8 cache rows of glm_moe_dsa (kernels/mla_fp8.h): the latent [512 e4m3 | 4 f32
// scales | 64 bf16 rope] and the indexer key [head_dim e4m3 | f32 scales]. Each read returns bf16 (the
// layout the bf16-cache kernels already consume), so the math after the load is shared by both cache
// dtypes and no dequantized copy of the cache exists. code * scale is one f32 rounding (as the CPU
// reference) then one bf16 rounding (relative 2^-9, far below FP8's 2^-4); the CPU reference keeps the f32.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention/kv_fp8_load.cuh"
#include "kernels/mla_fp8.h"

namespace mxserve::kernels::cuda {

// Element c (< n + tail) of a packed row as f32 (the SIMT oracles' per-element read).
__device__ __forceinline__ float mla_fp8_row_value(const uint8_t* row, int n, int c) {
  if (c >= n) {
    const uint16_t b = *reinterpret_cast<const uint16_t*>(row + mla_fp8_tail_offset(n) + 2 * (c - n));
    return __uint_as_float(static_cast<uint32_t>(b) << 16);
  }
  const float scale = *reinterpret_cast<const float*>(row + n + 4 * (c / kMlaFp8Block));
  const float2 v = fp8x2_e4m3_to_float2(row[c]);
  return v.x * scale;
}

// Chunk c (of (n + tail) / 8) of a packed row held in shared or global memory -> 8 bf16 (16 bytes): codes
// [8c, +8) * their block's scale for c < n / 8, else the bf16 tail chunk copied. Needs n % 8 == 0, an
// 8-byte aligned row (codes) and a 16-byte aligned tail (the GLM-5.x 656-byte row: tail at byte 528).
__device__ __forceinline__ uint4 mla_fp8_row_chunk(const uint8_t* row, int n, int c) {
  const MlaFp8Chunk k = mla_fp8_chunk(n, c);
  if (k.scale < 0) return *reinterpret_cast<const uint4*>(row + k.bytes);
  return load_fp8x8_as_bf16(row + k.bytes, *reinterpret_cast<const float*>(row + k.scale));
}

// Chunk c (of n / 8) of a packed indexer-key row (no tail) -> 8 bf16, with 4-byte loads only: the 132-byte
// rows of index_head_dim 128 are 4-byte aligned, not 8.
__device__ __forceinline__ uint4 mla_fp8_key_chunk(const uint8_t* row, int n, int c) {
  const MlaFp8Chunk k = mla_fp8_chunk(n, c);  // c < n / 8: a codes chunk
  const float scale = *reinterpret_cast<const float*>(row + k.scale);
  const uint32_t w0 = *reinterpret_cast<const uint32_t*>(row + k.bytes);
  const uint32_t w1 = *reinterpret_cast<const uint32_t*>(row + k.bytes + 4);
  uint4 out;
  uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = fp8x2_e4m3_to_float2(((i < 2 ? w0 : w1) >> (16 * (i % 2))) & 0xffffu);
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
    o[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return out;
}

}  // namespace mxserve::kernels::cuda
