#include "parallel/shared_device_reduce.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace mxserve::parallel {
namespace {

struct Sources {
  const void* p[kMaxSharedDeviceRanks];
};

__device__ inline float load(const float* p, int64_t i) { return p[i]; }
__device__ inline float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ inline void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ inline void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ inline void store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

// Grid-stride; rank order 0..n_srcs-1 per element (no tree, no atomics), so the bits are reproducible.
template <typename T, bool kMax>
__global__ void rank_order_reduce(T* dst, Sources srcs, int n_srcs, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = load(static_cast<const T*>(srcs.p[0]), i);
    for (int r = 1; r < n_srcs; ++r) {
      const float v = load(static_cast<const T*>(srcs.p[r]), i);
      acc = kMax ? fmaxf(acc, v) : acc + v;
    }
    store(dst, i, acc);
  }
}

template <typename T>
cudaError_t launch(void* dst, const Sources& s, int n_srcs, int64_t n, bool max, cudaStream_t stream) {
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 4096);
  if (max)
    rank_order_reduce<T, true><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(static_cast<T*>(dst), s, n_srcs, n);
  else
    rank_order_reduce<T, false><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(static_cast<T*>(dst), s, n_srcs, n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_rank_order_reduce(void* dst, const void* const* srcs, int n_srcs, int64_t n, int elem, bool max,
                                     cudaStream_t stream) {
  if (n_srcs < 1 || n_srcs > kMaxSharedDeviceRanks || elem < 0 || elem > 2) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  Sources s{};
  for (int r = 0; r < n_srcs; ++r) s.p[r] = srcs[r];
  switch (elem) {
    case 0: return launch<float>(dst, s, n_srcs, n, max, stream);
    case 1: return launch<__nv_bfloat16>(dst, s, n_srcs, n, max, stream);
    default: return launch<__half>(dst, s, n_srcs, n, max, stream);
  }
}

}  // namespace mxserve::parallel
