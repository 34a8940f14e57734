// Exact threshold selection over one logits row for the sampling kernel (one block per row): the top-k and
// top-p pivots in a handful of sweeps instead of a sort or a 32-step bisection.
//   RowView        the row, its max and temperature: weights e = exp((l - max) / T) as float, and as u64 fixed
//                  point (2^(62 - bits(V)) per unit) so that every mass sum is exact and order-independent
//                  (shared-memory atomics stay deterministic run to run and across batch compositions);
//   select_pivot   the largest order key tau whose candidates at or above it carry >= need (count or mass):
//                  level 0 buckets candidates by d = (max - l) * 16 / T (1024 buckets, monotone in the logit,
//                  so each bucket is a key range, and spread on both flat and peaked rows), the crossing
//                  bucket is refined by 4 radix passes of 8 bits over its candidates' keys.
// Key invariant: larger logit <=> larger order key <=> smaller-or-equal bucket; ties (equal keys) are resolved
// by the caller in id order.
#pragma once

#include <cstdint>

#include "kernels/cuda/sampling/block_reduce.cuh"

namespace mxserve::kernels::cuda::sampling {

constexpr int kBuckets = 1024;            // level-0 buckets; the last one takes d >= kBuckets - 1
constexpr float kBucketsPerUnit = 16.f;   // buckets per unit of (max - l) / T
constexpr int kRadixBins = 256;           // one radix digit: 8 bits of the order key

// Order-preserving key of a non-NaN float (-0 and +0 share one key: they compare equal).
__device__ __forceinline__ uint32_t order_key(float l) {
  if (l == 0.f) l = 0.f;
  const uint32_t b = __float_as_uint(l);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct RowView {
  const float* row = nullptr;  // [V]
  int64_t V = 0;
  float mx = 0.f;              // the row's max (not NaN, > -inf)
  bool inf_max = false;        // mx == +inf: the +inf tokens alone share the mass
  double mxd = 0, inv_t = 0;   // mx and 1 / T in double
  float bucket_scale = 0.f;    // kBucketsPerUnit / T
  double fixed_scale = 0;      // u64 units per unit of weight
};

__device__ __forceinline__ RowView make_row_view(const float* row, int64_t V, float mx, float temperature) {
  RowView r;
  r.row = row;
  r.V = V;
  r.mx = mx;
  r.inf_max = isinf(mx) && mx > 0;
  r.mxd = mx;
  r.inv_t = 1.0 / static_cast<double>(temperature);
  r.bucket_scale = kBucketsPerUnit / temperature;
  const int bits = 64 - __clzll(static_cast<long long>(V));  // V <= 2^bits - 1: the sum of V units fits 2^62
  r.fixed_scale = ldexp(1.0, 62 - bits);
  return r;
}

// The CPU's e = exp((l - max) / T) (kernels/cpu/sampling.cpp), in float: within ~1e-6 relative of the double.
__device__ __forceinline__ float weight_f(const RowView& r, float l) {
  if (r.inf_max) return l == r.mx ? 1.f : 0.f;
  return expf(static_cast<float>((static_cast<double>(l) - r.mxd) * r.inv_t));
}
__device__ __forceinline__ uint64_t to_fixed(const RowView& r, float e) {
  return __double2ull_rn(static_cast<double>(e) * r.fixed_scale);
}
__device__ __forceinline__ uint64_t weight_fixed(const RowView& r, float l) { return to_fixed(r, weight_f(r, l)); }

// Level-0 bucket of a logit: non-decreasing as the logit decreases.
__device__ __forceinline__ int bucket_of(const RowView& r, float l) {
  if (r.inf_max) return l == r.mx ? 0 : kBuckets - 1;
  const float d = (r.mx - l) * r.bucket_scale;  // >= 0; +inf for l = -inf
  return d < static_cast<float>(kBuckets - 1) ? static_cast<int>(d) : kBuckets - 1;
}

// Adds to a shared histogram through a per-thread run: a thread's consecutive hits on one bin become one
// atomic (rows of ties, and the bulk of peaked rows, would otherwise serialize on one address).
struct HistRun {
  int bin = 0;
  uint64_t acc = 0;
  __device__ __forceinline__ void add(uint64_t* hist, int b, uint64_t v) {
    if (b != bin) {
      flush(hist);
      bin = b;
    }
    acc += v;
  }
  __device__ __forceinline__ void flush(uint64_t* hist) {
    if (acc != 0) atomicAdd(reinterpret_cast<unsigned long long*>(hist + bin), static_cast<unsigned long long>(acc));
    acc = 0;
  }
};

// The largest key tau with M(tau) >= need, M(tau) = the sum of contrib(l) over candidates (cand(i, key)) with
// key >= tau, need = need_of(M(min key)) in [1, M(min key)]. *above = M(tau + 1) (what lies strictly above the
// pivot); *total = M(min key). hist: shared u64 [kBuckets]. Every thread gets the same answer.
template <int kThreads, class Cand, class Contrib, class Need>
__device__ uint32_t select_pivot(const RowView& r, uint64_t* hist, Cand cand, Contrib contrib, Need need_of,
                                 uint64_t* above, uint64_t* total_out) {
  __syncthreads();  // the previous user of hist is done
  for (int b = threadIdx.x; b < kBuckets; b += kThreads) hist[b] = 0;
  __syncthreads();
  uint64_t overflow = 0, total = 0;
  HistRun run;
  for (int64_t i = threadIdx.x; i < r.V; i += kThreads) {
    const float l = r.row[i];
    if (!cand(i, order_key(l))) continue;
    const uint64_t v = contrib(l);
    if (v == 0) continue;
    total += v;
    const int b = bucket_of(r, l);
    if (b == kBuckets - 1) overflow += v;
    else run.add(hist, b, v);
  }
  run.flush(hist);
  overflow = block_sum_u64<kThreads>(overflow);  // its barrier also publishes the atomics
  total = block_sum_u64<kThreads>(total);
  if (threadIdx.x == 0) hist[kBuckets - 1] = overflow;
  __syncthreads();
  const uint64_t need = need_of(total);
  uint64_t base = 0;
  const int bucket = block_find_crossing<kThreads>(hist, kBuckets, need, 0, &base);

  // Radix passes over the keys of the crossing bucket's candidates, 8 bits at a time from the top; bins are
  // stored largest digit first so that the scan order is the sampler's order.
  uint32_t prefix = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    __syncthreads();  // every thread has read hist
    for (int b = threadIdx.x; b < kRadixBins; b += kThreads) hist[b] = 0;
    __syncthreads();
    const uint32_t high_mask = shift == 24 ? 0u : ~0u << (shift + 8);
    HistRun digit_run;
    for (int64_t i = threadIdx.x; i < r.V; i += kThreads) {
      const float l = r.row[i];
      if (bucket_of(r, l) != bucket) continue;
      const uint32_t k = order_key(l);
      if ((k & high_mask) != prefix || !cand(i, k)) continue;
      const uint64_t v = contrib(l);
      if (v != 0) digit_run.add(hist, kRadixBins - 1 - static_cast<int>((k >> shift) & 0xffu), v);
    }
    digit_run.flush(hist);
    __syncthreads();
    const int j = block_find_crossing<kThreads>(hist, kRadixBins, need, base, &base);
    prefix |= static_cast<uint32_t>(kRadixBins - 1 - j) << shift;
  }
  *above = base;
  *total_out = total;
  return prefix;
}

}  // namespace mxserve::kernels::cuda::sampling
