// A block-wide inclusive scan in shared memory and warp shuffles, shared by the DSA indexer's top-k select
// (attention/dsa_select_block.cuh) and the FP8 dequantize-once index kernel (attention/kv_fp8_dequant_once.cu).
#pragma once

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

}  // namespace mxserve::kernels::cuda
