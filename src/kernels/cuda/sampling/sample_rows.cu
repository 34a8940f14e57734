// The sampling kernel: one 512-thread block per sampled row, every pass a coalesced sweep of the row.
//   1. checks (first NaN id, any token allowed) and the argmax (ties: lowest id) of the processed row;
//   2. sampled rows: the top-k pivot (threshold_select.cuh: the largest key with >= k tokens at or above it;
//      ties at the pivot taken in id order), the top-p pivot the same way on the fixed-point weights of the
//      top-k candidates, min-p on e, then the draw: the first kept id whose id-ordered cumulative weight
//      exceeds counter_uniform(seed, step) * total (the CPU's draw);
//   3. logprobs of the RAW row: log-softmax at the token and the top-n (ties: lower id first).
// Cost: ~6 sweeps of the row per select (level-0 buckets + 4 radix digits + ties), 2 for the draw, 1 for
// the checks; only the level-0 and draw sweeps compute an exp per token.
#include <cstdint>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/sampling/block_reduce.cuh"
#include "kernels/cuda/sampling/sample_rows.h"
#include "kernels/cuda/sampling/threshold_select.cuh"

namespace mxserve::kernels::cuda {
namespace {

using namespace sampling;
constexpr int kThreads = 512;

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
    __shared__ uint64_t hist[kBuckets];
    const RowView r = make_row_view(row, V, row[token], p.temperature);
    // Top-k candidates: key > tk, or key == tk and id <= pk.
    const bool use_top_k = p.top_k > 0 && p.top_k < V;
    uint32_t tk = 0;
    int64_t pk = V;
    if (use_top_k) {
      uint64_t above = 0, total = 0, ties = 0;
      const uint64_t k = static_cast<uint64_t>(p.top_k);
      tk = select_pivot<kThreads>(
          r, hist, [](int64_t, uint32_t) { return true; }, [](float) { return uint64_t{1}; },
          [&](uint64_t) { return k; }, &above, &total);
      const uint64_t need_ties = k > above ? k - above : 1;
      pk = find_prefix_crossing_u64<kThreads>(
          V, [&](uint64_t) { return need_ties - 1; },
          [&](int64_t i) { return order_key(row[i]) == tk ? uint64_t{1} : uint64_t{0}; }, &ties);
    }
    auto in_cand = [&](int64_t i, uint32_t k) { return !use_top_k || k > tk || (k == tk && i <= pk); };
    // Top-p: the smallest prefix (in the candidates' order) whose mass reaches top_p * total.
    const bool use_top_p = p.top_p < 1.f;
    uint32_t tp = 0;
    int64_t pp = V;
    if (use_top_p) {
      const double top_p = p.top_p;
      auto target_of = [top_p](uint64_t total) {
        const double t = ceil(top_p * static_cast<double>(total));
        const uint64_t u = t < 1 ? 1 : static_cast<uint64_t>(t);
        return u < total ? u : total;
      };
      uint64_t above = 0, total = 0, ties = 0;
      tp = select_pivot<kThreads>(
          r, hist, in_cand, [&](float l) { return weight_fixed(r, l); }, target_of, &above, &total);
      const uint64_t target = target_of(total), w_tp = weight_fixed(r, key_value(tp));
      uint64_t need_ties = w_tp > 0 && target > above ? (target - above + w_tp - 1) / w_tp : 1;
      need_ties = need_ties < 1 ? 1 : need_ties;
      pp = find_prefix_crossing_u64<kThreads>(
          V, [&](uint64_t n_ties) { return (need_ties < n_ties ? need_ties : n_ties) - 1; },
          [&](int64_t i) {
            const uint32_t k = order_key(row[i]);
            return k == tp && in_cand(i, k) ? uint64_t{1} : uint64_t{0};
          },
          &ties);
    }
    const float min_p = p.min_p;
    auto kept_weight = [&](int64_t i) -> uint64_t {
      const float l = row[i];
      const uint32_t k = order_key(l);
      if (!in_cand(i, k)) return 0;
      if (use_top_p && !(k > tp || (k == tp && i <= pp))) return 0;
      const float e = weight_f(r, l);
      if (min_p > 0 && e < min_p) return 0;
      return to_fixed(r, e);
    };
    // The draw: the first kept id whose running weight exceeds u * total; u * total rounding up to the total
    // gives the last kept id, as the CPU's draw.
    const double u = counter_uniform(p.seed, p.step);
    uint64_t kept_total = 0;
    const int64_t hit = find_prefix_crossing_u64<kThreads>(
        V,
        [u](uint64_t total) -> uint64_t {
          if (total == 0) return 0;
          const double x = u * static_cast<double>(total);
          const uint64_t t = x < static_cast<double>(total) ? static_cast<uint64_t>(x) : total - 1;
          return t < total - 1 ? t : total - 1;
        },
        kept_weight, &kept_total);
    if (hit >= 0) token = hit;  // none: nothing kept (cannot happen: the argmax always is): the argmax
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
