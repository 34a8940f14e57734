// The sampling kernel: one 512-thread block per sampled row, every pass a coalesced sweep of the row.
//   1. checks (first NaN id, any token allowed) and the argmax (ties: lowest id) of the processed row;
//   2. sampled rows: the top-k pivot (bisection on order-preserving keys: the largest key with >= k tokens
//      at or above it; ties at the pivot taken in id order), the top-p pivot the same way on the double
//      weights e = exp((l - max) / T) of the top-k candidates, min-p on e, then the draw: the first kept id
//      whose id-ordered cumulative probability exceeds counter_uniform(seed, step) (as the CPU's draw);
//   3. logprobs of the RAW row: log-softmax at the token and the top-n (ties: lower id first).
// Cost: ~35 sweeps of the row for top-k + top-p rows (L2-resident), ~5 without them.
#include <cfloat>
#include <cstdint>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/sampling/block_reduce.cuh"
#include "kernels/cuda/sampling/sample_rows.h"

namespace mxserve::kernels::cuda {
namespace {

using namespace sampling;
constexpr int kThreads = 512;

// Order-preserving key of a non-NaN float (-0 and +0 share one key: they compare equal).
__device__ __forceinline__ uint32_t order_key(float l) {
  if (l == 0.f) l = 0.f;
  const uint32_t b = __float_as_uint(l);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// Total order of the sampler (larger logit first, then lower id) as one u64: larger = earlier.
__device__ __forceinline__ uint64_t rank_of(float l, int64_t i) {
  return (static_cast<uint64_t>(order_key(l)) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
}
__device__ __forceinline__ int64_t id_of_rank(uint64_t r) { return 0xffffffffu - static_cast<uint32_t>(r); }

// core/hash.h's mix64 and kernels::cpu::counter_uniform, bit for bit.
__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ double counter_uniform(uint64_t seed, uint64_t counter) {
  const uint64_t r = mix64(mix64(seed) ^ (counter * 0xd1b54a32d192ed03ull));
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);
}

// The largest key tau with measure(tau) >= need, given measure(0) >= need and measure(2^32) = 0 < need
// (measure non-increasing in tau). *above = measure(tau + 1).
template <class M>
__device__ uint32_t bisect_key(M measure, double need, double* above) {
  uint64_t lo = 0, hi = 1ull << 32;
  double at_hi = 0;
  while (hi - lo > 1) {
    const uint64_t mid = (lo + hi) / 2;
    const double m = measure(static_cast<uint32_t>(mid));
    if (m >= need) {
      lo = mid;
    } else {
      hi = mid;
      at_hi = m;
    }
  }
  *above = at_hi;
  return static_cast<uint32_t>(lo);
}

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(DeviceSampleArgs a) {
  const SampleRowParams p = a.rows[blockIdx.x];
  DeviceSampleResult* res = a.out + blockIdx.x;
  const int64_t V = a.vocab;
  if (p.logit_row < 0 || p.logit_row >= a.n_logit_rows) {
    if (threadIdx.x == 0) *res = {-1, 0.f, kSampleBadRow, p.logit_row};
    return;
  }
  const float* raw = a.logits + static_cast<int64_t>(p.logit_row) * V;
  const float* row = row_has_processing(p) ? a.scratch + static_cast<int64_t>(blockIdx.x) * V : raw;

  // 1. checks and argmax.
  int64_t first_nan = INT64_MAX;
  uint64_t best = 0;  // rank of the best non-NaN token (every real rank is > 0)
  double allowed = 0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float l = row[i];
    if (isnan(l)) {
      first_nan = i < first_nan ? i : first_nan;
      continue;
    }
    allowed += l > -INFINITY ? 1.0 : 0.0;
    const uint64_t r = rank_of(l, i);
    best = r > best ? r : best;
  }
  first_nan = block_min_i64<kThreads>(first_nan);
  allowed = block_sum<kThreads>(allowed);
  best = block_max_u64<kThreads>(best);
  if (first_nan != INT64_MAX || allowed == 0) {
    if (threadIdx.x == 0)
      *res = first_nan != INT64_MAX ? DeviceSampleResult{-1, 0.f, kSampleNanLogit, static_cast<int32_t>(first_nan)}
                                    : DeviceSampleResult{-1, 0.f, kSampleNoAllowedToken, -1};
    return;
  }
  int64_t token = id_of_rank(best);

  // 2. sampled rows.
  if (!(p.temperature < kGreedyTemperature)) {
    const float mx = row[token];
    const bool inf_max = isinf(mx) && mx > 0;
    const double T = p.temperature, mxd = mx;
    auto weight = [&](float l) -> double {
      return inf_max ? (l == mx ? 1.0 : 0.0) : exp((static_cast<double>(l) - mxd) / T);
    };
    // Top-k candidates: key > tk, or key == tk and id <= pk.
    const bool use_top_k = p.top_k > 0 && p.top_k < V;
    uint32_t tk = 0;
    int64_t pk = V;
    if (use_top_k) {
      double above = 0;
      tk = bisect_key(
          [&](uint32_t tau) {
            double c = 0;
            for (int64_t i = threadIdx.x; i < V; i += kThreads) c += order_key(row[i]) >= tau ? 1.0 : 0.0;
            return block_sum<kThreads>(c);
          },
          static_cast<double>(p.top_k), &above);
      const double need_ties = p.top_k - above;  // >= 1
      pk = find_prefix_crossing<kThreads>(V, need_ties - 0.5, [&](int64_t i) {
        return order_key(row[i]) == tk ? 1.0 : 0.0;
      });
    }
    auto in_cand = [&](int64_t i, uint32_t k) { return !use_top_k || k > tk || (k == tk && i <= pk); };
    double total = 0;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float l = row[i];
      if (in_cand(i, order_key(l))) total += weight(l);
    }
    total = block_sum<kThreads>(total);
    // Top-p: the smallest prefix (in the candidates' order) whose mass reaches top_p * total.
    const bool use_top_p = p.top_p < 1.f;
    uint32_t tp = 0;
    int64_t pp = V;
    if (use_top_p) {
      const double target = p.top_p * total;
      double above = 0;
      tp = bisect_key(
          [&](uint32_t tau) {
            double m = 0;
            for (int64_t i = threadIdx.x; i < V; i += kThreads) {
              const float l = row[i];
              const uint32_t k = order_key(l);
              if (k >= tau && in_cand(i, k)) m += weight(l);
            }
            return block_sum<kThreads>(m);
          },
          target > 0 ? target : DBL_MIN, &above);
      double ties = 0;
      for (int64_t i = threadIdx.x; i < V; i += kThreads) {
        const uint32_t k = order_key(row[i]);
        ties += k == tp && in_cand(i, k) ? 1.0 : 0.0;
      }
      ties = block_sum<kThreads>(ties);
      double need_ties = ceil((target - above) / weight(key_value(tp)));
      need_ties = need_ties < 1 ? 1 : (need_ties > ties ? ties : need_ties);
      pp = find_prefix_crossing<kThreads>(V, need_ties - 0.5, [&](int64_t i) {
        const uint32_t k = order_key(row[i]);
        return k == tp && in_cand(i, k) ? 1.0 : 0.0;
      });
    }
    const double min_p = p.min_p;
    auto kept_weight = [&](int64_t i) -> double {
      const float l = row[i];
      const uint32_t k = order_key(l);
      if (!in_cand(i, k)) return 0.0;
      if (use_top_p && !(k > tp || (k == tp && i <= pp))) return 0.0;
      const double e = weight(l);
      if (min_p > 0 && e < min_p) return 0.0;
      return e;
    };
    double kept_total = 0;
    int64_t last_kept = -1;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const double e = kept_weight(i);
      kept_total += e;
      if (e > 0) last_kept = i;
    }
    kept_total = block_sum<kThreads>(kept_total);
    last_kept = -block_min_i64<kThreads>(-last_kept);
    const double u = counter_uniform(p.seed, p.step);
    const int64_t hit = find_prefix_crossing<kThreads>(V, u, [&](int64_t i) { return kept_weight(i) / kept_total; });
    // No crossing: u at the very top of the range (rounding): the last kept id, as the CPU's draw.
    if (hit >= 0) token = hit;
    else if (last_kept >= 0) token = last_kept;
  }

  // 3. raw logprobs.
  float logprob = 0.f;
  if (p.n_top >= 0) {
    float raw_max = -INFINITY;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) raw_max = fmaxf(raw_max, raw[i]);
    raw_max = block_max_f32<kThreads>(raw_max);
    double z = 0;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) z += exp(static_cast<double>(raw[i]) - raw_max);
    const double lse = raw_max + log(block_sum<kThreads>(z));
    logprob = static_cast<float>(raw[token] - lse);
    const int64_t n_top = p.n_top < V ? p.n_top : V;
    uint64_t prev = ~0ull;
    for (int64_t j = 0; j < n_top && j < a.max_top; ++j) {
      uint64_t b = 0;
      for (int64_t i = threadIdx.x; i < V; i += kThreads) {
        const uint64_t r = rank_of(raw[i], i);
        if (r < prev && r > b) b = r;
      }
      b = block_max_u64<kThreads>(b);
      prev = b;
      if (threadIdx.x == 0) {
        const int64_t id = id_of_rank(b);
        a.top_ids[blockIdx.x * a.max_top + j] = static_cast<int32_t>(id);
        a.top_logprobs[blockIdx.x * a.max_top + j] = static_cast<float>(raw[id] - lse);
      }
    }
  }
  if (threadIdx.x == 0) *res = {static_cast<int32_t>(token), logprob, kSampleOk, -1};
}

}  // namespace

void sample_rows(const DeviceSampleArgs& a, cudaStream_t stream) {
  if (a.n_sample == 0) return;
  sample_rows_kernel<<<static_cast<unsigned>(a.n_sample), kThreads, 0, stream>>>(a);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
