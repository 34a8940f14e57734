// The block-per-row RMSNorm's shared steps (elementwise.cu rmsnorm_block_kernel, add_rmsnorm.cu): a row held in
// registers as kChunks 8-value chunks per thread (chunk c = threadIdx.x + i * kThreads), its sum of squares
// reduced over the block, and the normalized row written back from those registers.
// Invariant: the arithmetic is the kernels' own in their order (warp_sum, the per-warp partials summed in warp
// order, 1 / sqrtf(mean + eps), w * (v * inv)), so a kernel that uses these stays bit-identical (same PTX).
#pragma once

#include "kernels/cuda/common/bf16.cuh"

namespace mxserve::kernels::cuda {

// 1 / rms of the row, from each thread's partial sum of squares ss; part: kThreads / 32 floats of shared memory.
template <int kThreads>
__device__ __forceinline__ float block_rms_inv(float ss, float* part, int cols, float eps) {
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) total += part[i];
  return 1.0f / sqrtf(total / static_cast<float>(cols) + eps);
}

// orow = w * (v * inv) over the thread's chunks of the row (chunks: cols / 8).
template <int kThreads, int kChunks>
__device__ __forceinline__ void store_rmsnorm_row(const float (&v)[kChunks][8], float inv, const bf16* __restrict__ w,
                                                  bf16* orow, int chunks) {
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + i * kThreads;
    if (c < chunks) {
      float wv[8], o[8];
      load8(w + c * 8, wv);
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] = wv[j] * (v[i][j] * inv);
      store8(orow + c * 8, o);
    }
  }
}

}  // namespace mxserve::kernels::cuda
