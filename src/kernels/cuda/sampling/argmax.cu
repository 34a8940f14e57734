// Row argmax: one 512-thread block per row; each thread scans a strided slice (coalesced 16-byte loads
// when V % 4 == 0), then a warp-shuffle and a shared-memory reduction keep (value, lowest index).
#include <cfloat>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/sampling/argmax.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kThreads = 512;

struct Best {
  float v;
  int32_t i;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  // Larger value wins; equal values -> lower index. A NaN value never wins (comparisons are false).
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

__device__ __forceinline__ void consider(Best& best, float v, int32_t i) {
  if (v > best.v || (v == best.v && i < best.i)) best = {v, i};
}

__global__ void argmax_rows_kernel(const float* __restrict__ logits, int32_t* __restrict__ out, int64_t vocab) {
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  Best best{-FLT_MAX, INT32_MAX};
  if (vocab % 4 == 0) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int64_t j = threadIdx.x; j < vocab / 4; j += kThreads) {
      const float4 q = row4[j];
      const int32_t base = static_cast<int32_t>(4 * j);
      consider(best, q.x, base);
      consider(best, q.y, base + 1);
      consider(best, q.z, base + 2);
      consider(best, q.w, base + 3);
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += kThreads) consider(best, row[j], static_cast<int32_t>(j));
  }
  for (int off = 16; off > 0; off >>= 1) {
    Best o{__shfl_xor_sync(0xffffffffu, best.v, off), __shfl_xor_sync(0xffffffffu, best.i, off)};
    best = better(best, o);
  }
  __shared__ Best warp_best[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = lane < kThreads / 32 ? warp_best[lane] : Best{-FLT_MAX, INT32_MAX};
    for (int off = 16; off > 0; off >>= 1) {
      Best o{__shfl_xor_sync(0xffffffffu, best.v, off), __shfl_xor_sync(0xffffffffu, best.i, off)};
      best = better(best, o);
    }
    // An all-NaN (or all -FLT_MAX) row has no winner: report token 0 rather than an invalid id.
    if (lane == 0) out[blockIdx.x] = best.i == INT32_MAX ? 0 : best.i;
  }
}

}  // namespace

void argmax_rows_f32(const float* logits, int32_t* out, int64_t rows, int64_t vocab, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, out, vocab);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
