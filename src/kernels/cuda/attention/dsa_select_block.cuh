// Block-wide pieces of the DSA indexer's exact top-k select (kernels/dsa_topk_radix.h), shared by the
// one-block-per-token select (dsa_indexer_fused.cu) and the cluster-split select (dsa_select_split.cu): an
// inclusive block scan and the parallel dsa::radix_step over a histogram. The histogram may live in this block's
// shared memory, global memory or another CTA's shared memory of the cluster (a generic pointer).
#pragma once

#include <cstdint>

#include "kernels/dsa_topk_radix.h"

namespace mxserve::kernels::cuda {

// Inclusive block scan (blockDim.x a multiple of 32, <= 1024); *total gets the block's sum. Ends synced.
template <typename T>
__device__ __forceinline__ T block_inclusive_scan(T v, T* warp_s, T* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  if (lane == 31) warp_s[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < n_warps ? warp_s[lane] : T{0};
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const T n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    if (lane < n_warps) warp_s[lane] = w;
    if (lane == 31) *total = w;
  }
  __syncthreads();
  const T before = warp > 0 ? warp_s[warp - 1] : T{0};
  __syncthreads();  // warp_s may be reused by the next scan
  return v + before;
}

// The parallel dsa::radix_step: the first digit from the top of hist[0, bins) whose running count reaches k
// (1 <= k <= sum). Thread i owns `per` bins, thread 0 the top ones. Ends synced; every thread returns it.
__device__ __forceinline__ kernels::dsa::RadixStep block_radix_step(const uint32_t* hist, int bins, uint32_t k,
                                                                    uint32_t* warp_s, uint32_t* total,
                                                                    kernels::dsa::RadixStep* step_s) {
  const int per = bins >= static_cast<int>(blockDim.x) ? bins / static_cast<int>(blockDim.x) : 1;
  const int owners = bins / per;
  const int top = bins - 1 - static_cast<int>(threadIdx.x) * per;  // this thread's highest bin
  uint32_t mine = 0;
  if (static_cast<int>(threadIdx.x) < owners)
    for (int i = 0; i < per; ++i) mine += hist[top - i];
  const uint32_t incl = block_inclusive_scan(mine, warp_s, total);
  const uint32_t excl = incl - mine;
  if (static_cast<int>(threadIdx.x) < owners && excl < k && k <= incl) {
    uint32_t cum = excl;
    for (int i = 0; i < per; ++i) {
      const uint32_t h = hist[top - i];
      if (cum + h >= k) {
        *step_s = {static_cast<uint32_t>(top - i), k - cum};
        break;
      }
      cum += h;
    }
  }
  __syncthreads();
  const kernels::dsa::RadixStep s = *step_s;
  __syncthreads();
  return s;
}

}  // namespace mxserve::kernels::cuda
