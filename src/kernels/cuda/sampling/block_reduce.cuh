// Block-wide reductions, a histogram crossing search and an id-ordered prefix search for the sampling
// kernels (one block per row).
// Every result is returned to every thread, in a fixed order (deterministic run to run); each helper starts
// with a barrier so its shared slots can be reused by the next call.
#pragma once

#include <cstdint>

namespace mxserve::kernels::cuda::sampling {

constexpr unsigned kFullMask = 0xffffffffu;

template <int kThreads>
__device__ __forceinline__ double block_sum(double v) {
  __shared__ double part[kThreads / 32];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  double r = 0;
  for (int w = 0; w < kThreads / 32; ++w) r += part[w];
  return r;
}

template <int kThreads>
__device__ __forceinline__ uint64_t block_max_u64(uint64_t v) {
  __shared__ uint64_t part[kThreads / 32];
  for (int off = 16; off > 0; off >>= 1) {
    const uint64_t o = __shfl_xor_sync(kFullMask, v, off);
    v = o > v ? o : v;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  uint64_t r = 0;
  for (int w = 0; w < kThreads / 32; ++w) r = part[w] > r ? part[w] : r;
  return r;
}

template <int kThreads>
__device__ __forceinline__ int64_t block_min_i64(int64_t v) {
  __shared__ int64_t part[kThreads / 32];
  for (int off = 16; off > 0; off >>= 1) {
    const int64_t o = __shfl_xor_sync(kFullMask, v, off);
    v = o < v ? o : v;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  int64_t r = part[0];
  for (int w = 1; w < kThreads / 32; ++w) r = part[w] < r ? part[w] : r;
  return r;
}

template <int kThreads>
__device__ __forceinline__ float block_max_f32(float v) {
  __shared__ float part[kThreads / 32];
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = part[0];
  for (int w = 1; w < kThreads / 32; ++w) r = fmaxf(r, part[w]);
  return r;
}

template <int kThreads>
__device__ __forceinline__ uint64_t block_sum_u64(uint64_t v) {
  __shared__ uint64_t part[kThreads / 32];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  uint64_t r = 0;
  for (int w = 0; w < kThreads / 32; ++w) r += part[w];
  return r;
}

// The sum of v over the threads before this one (thread order).
template <int kThreads>
__device__ __forceinline__ uint64_t block_exclusive_scan_u64(uint64_t v) {
  __shared__ uint64_t warp_total[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t incl = v;
  for (int off = 1; off < 32; off <<= 1) {
    const uint64_t o = __shfl_up_sync(kFullMask, incl, off);
    if (lane >= off) incl += o;
  }
  __syncthreads();
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  uint64_t before = 0;
  for (int w = 0; w < warp; ++w) before += warp_total[w];
  return before + incl - v;
}

// Over a histogram h[0, n) (any memory every thread can read, n <= 4 * kThreads): the first j where
// base + h[0] + ... + h[j] >= need; *before = base + h[0] + ... + h[j - 1]. None: n - 1 and the sum before it
// (callers guarantee a crossing).
template <int kThreads>
__device__ int block_find_crossing(const uint64_t* h, int n, uint64_t need, uint64_t base, uint64_t* before) {
  __shared__ uint64_t hit_before_shared;
  const int per = (n + kThreads - 1) / kThreads;
  const int begin = min(n, static_cast<int>(threadIdx.x) * per), end = min(n, begin + per);
  uint64_t s = 0;
  for (int j = begin; j < end; ++j) s += h[j];
  uint64_t cum = base + block_exclusive_scan_u64<kThreads>(s);
  int64_t hit = n;
  uint64_t hit_before = 0;
  for (int j = begin; j < end; ++j) {
    if (cum + h[j] >= need) {
      hit = j;
      hit_before = cum;
      break;
    }
    cum += h[j];
  }
  if (end == n && begin < end && hit == n) hit_before = cum - h[n - 1];  // the no-crossing answer
  const int64_t first = block_min_i64<kThreads>(hit);
  const int j = first < n ? static_cast<int>(first) : n - 1;
  if (begin <= j && j < end) hit_before_shared = hit_before;
  __syncthreads();
  *before = hit_before_shared;
  return j;
}

// The smallest i in [0, n) where the id-ordered running sum of f(0..i) exceeds thr_of(total), total being the
// sum of f over [0, n) (exact: integer sums); -1 if none. *total_out = total. Narrowing by levels: the warps sum
// kWarps consecutive segments of the current range, the crossing segment becomes the range (V = 151,552:
// segments of 9,472, 608, 64, 32 ids), and every warp scans the last 32 ids alike (no serial long scan).
template <int kThreads, class Thr, class F>
__device__ int64_t find_prefix_crossing_u64(int64_t n, Thr thr_of, F f, uint64_t* total_out) {
  constexpr int kWarps = kThreads / 32;
  __shared__ uint64_t seg_sum[kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t lo = 0, hi = n;
  uint64_t carry = 0, thr = 0;
  for (int level = 0;; ++level) {
    const int64_t seg = ((hi - lo + kWarps - 1) / kWarps + 31) / 32 * 32;
    const int64_t begin = lo + warp * seg < hi ? lo + warp * seg : hi, end = begin + seg < hi ? begin + seg : hi;
    uint64_t s = 0;
    for (int64_t i = begin + lane; i < end; i += 32) s += f(i);
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(kFullMask, s, off);
    __syncthreads();  // every thread has read the previous level's sums
    if (lane == 0) seg_sum[warp] = s;
    __syncthreads();
    if (level == 0) {
      uint64_t total = 0;
      for (int w = 0; w < kWarps; ++w) total += seg_sum[w];
      *total_out = total;
      thr = thr_of(total);
    }
    int cross = -1;
    for (int w = 0; w < kWarps; ++w) {
      if (carry + seg_sum[w] > thr) {
        cross = w;
        break;
      }
      carry += seg_sum[w];
    }
    if (cross < 0) return -1;  // the same answer in every thread
    lo = lo + cross * seg < hi ? lo + cross * seg : hi;
    hi = lo + seg < hi ? lo + seg : hi;
    if (seg == 32) break;
  }
  const int64_t i = lo + lane;
  uint64_t v = i < hi ? f(i) : 0;
  for (int off = 1; off < 32; off <<= 1) {
    const uint64_t o = __shfl_up_sync(kFullMask, v, off);
    if (lane >= off) v += o;
  }
  const unsigned hit = __ballot_sync(kFullMask, i < hi && carry + v > thr);
  return hit != 0 ? lo + __ffs(hit) - 1 : -1;
}

}  // namespace mxserve::kernels::cuda::sampling
