// The DSA indexer's exact top-k select on order codes, shared by the fused CUDA path
// (kernels/cuda/attention/dsa_indexer_fused.cu) and its host emulation (tests/unit/kernels/test_dsa_topk_radix.cpp),
// so the emulation checks the same digit split, bin search and tie rule the kernel runs.
// A score s maps to a u32 order code (larger score, larger code; +0 and -0 the same code; 0 = not visible).
// The k-th largest code is found by three radix passes from the top: digit 0 = bits [31:20] (4096 bins,
// the histogram the score blocks build), digit 1 = bits [19:8] (4096 bins), digit 2 = bits [7:0] (256 bins).
// Tie rule (the CPU oracle's, kernels/cpu/mla_dsa.cpp: partial_sort by score descending then KV index
// ascending): every code above the threshold is kept, and of the codes equal to it the `ties` with the
// lowest KV indices; the selection is written in ascending KV order, -1 padded.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MX_DSA_HD __host__ __device__ __forceinline__
#else
#define MX_DSA_HD inline
#endif

namespace mxserve::kernels::dsa {

constexpr int kHistBins = 4096;  // the first digit: the per-token histogram in the workspace

MX_DSA_HD int digit_bins(int pass) { return pass == 2 ? 256 : 4096; }

MX_DSA_HD uint32_t order_code(float f) {
  if (f == 0.f) f = 0.f;  // -0 -> +0
#if defined(__CUDA_ARCH__)
  const uint32_t u = __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

MX_DSA_HD int digit_shift(int pass) { return pass == 0 ? 20 : (pass == 1 ? 8 : 0); }
MX_DSA_HD uint32_t digit_of(uint32_t code, int pass) {
  return (code >> digit_shift(pass)) & (pass == 2 ? 0xffu : 0xfffu);
}
// The bits above pass `pass`'s digit (the prefix fixed by the earlier passes).
MX_DSA_HD uint32_t prefix_mask(int pass) { return pass == 0 ? 0u : (pass == 1 ? 0xfff00000u : 0xffffff00u); }

struct RadixStep {
  uint32_t digit;  // the digit of the k-th largest candidate
  uint32_t k_rem;  // how many of the candidates with that digit are among the k largest (>= 1)
};

// hist: candidate counts per digit of one pass; 1 <= k <= sum(hist). The first digit from the top whose
// running count reaches k.
MX_DSA_HD RadixStep radix_step(const uint32_t* hist, int bins, uint32_t k) {
  uint32_t cum = 0;
  for (int b = bins - 1; b >= 0; --b) {
    if (cum + hist[b] >= k) return {static_cast<uint32_t>(b), k - cum};
    cum += hist[b];
  }
  return {0u, 0u};  // unreachable when k <= sum(hist)
}

struct Threshold {
  uint32_t code = 0;  // the k-th largest visible code; 0: at most K visible, keep every visible key
  uint32_t ties = 0;  // of the keys with exactly `code`, how many (lowest KV index first) are kept
};

// Whether key j with `code` is kept, given how many keys with code == thr.code come before it.
MX_DSA_HD bool keeps(uint32_t code, const Threshold& thr, uint32_t ties_before) {
  if (code == 0) return false;
  if (code > thr.code) return true;
  return code == thr.code && ties_before < thr.ties;
}

// The cluster-split select (kernels/cuda/attention/dsa_select_split.cu): CTA `rank` of `ctas` owns keys
// [lo, hi) of a row of n keys. Each CTA counts its range's digits of a pass, the counts are summed over the
// cluster (the same histogram as one pass over the row), and the ordered write of a CTA starts after the kept
// keys of the lower ranks: (keys above the threshold in lower ranks) + min(ties in lower ranks, thr.ties).
struct SplitRange {
  int64_t lo, hi;
};
MX_DSA_HD SplitRange split_range(int64_t n, int ctas, int rank) {
  const int64_t chunk = (n + ctas - 1) / ctas;
  const int64_t lo = chunk * rank < n ? chunk * rank : n;
  return {lo, lo + chunk < n ? lo + chunk : n};
}

// CTAs per token of the split select (a power of two in 1..max_ctas): the largest with group_tokens x ctas <=
// sm_count (one wave of clusters) and >= 2048 keys a CTA (max_ctx keys a row). 8 at batch 1 / 16 over 20k keys
// on 132 SMs, 2 at 64, 1 at 2k keys.
MX_DSA_HD int split_ctas(int64_t group_tokens, int64_t max_ctx, int sm_count, int max_ctas) {
  const int64_t T = group_tokens > 1 ? group_tokens : 1, sms = sm_count > 1 ? sm_count : 1;
  int ctas = max_ctas;
  while (ctas > 1 && (T * ctas > sms || max_ctx < int64_t{2048} * ctas)) ctas /= 2;
  return ctas;
}

// ---- host emulation (the kernel's passes, serially; the CPU test's oracle check) ----------------------
#if !defined(__CUDA_ARCH__)
inline Threshold radix_threshold_host(const uint32_t* codes, int64_t n, uint32_t K) {
  uint32_t hist[kHistBins];
  uint32_t visible = 0;
  Threshold thr;
  for (int pass = 0; pass < 3; ++pass) {
    std::memset(hist, 0, sizeof hist);
    const uint32_t mask = prefix_mask(pass);
    for (int64_t j = 0; j < n; ++j) {
      if (codes[j] == 0 || (codes[j] & mask) != (thr.code & mask)) continue;
      ++hist[digit_of(codes[j], pass)];
      if (pass == 0) ++visible;
    }
    if (pass == 0 && visible <= K) return Threshold{};
    const RadixStep s = radix_step(hist, digit_bins(pass), pass == 0 ? K : thr.ties);
    thr.code |= s.digit << digit_shift(pass);
    thr.ties = s.k_rem;
  }
  return thr;
}

// out[K]: the kept KV indices ascending, -1 padded; each kept key written at the kernel's position
// (keys above the threshold before it) + min(threshold ties before it, thr.ties).
inline void select_host(const uint32_t* codes, int64_t n, uint32_t K, int32_t* out) {
  const Threshold thr = radix_threshold_host(codes, n, K);
  for (uint32_t i = 0; i < K; ++i) out[i] = -1;
  uint32_t above_before = 0, ties_before = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (keeps(codes[j], thr, ties_before)) {
      const uint32_t pos = above_before + (ties_before < thr.ties ? ties_before : thr.ties);
      if (pos < K) out[pos] = static_cast<int32_t>(j);
    }
    if (codes[j] > thr.code) ++above_before;
    else if (thr.code != 0 && codes[j] == thr.code) ++ties_before;
  }
}

// The cluster-split select of `ctas` CTAs, emulated: each pass's histogram as per-range histograms summed over
// the ranges (digit 0 too: the kernel's kDsaSplitOwnHist mode; the score kernel's whole-row histogram is the same
// sum), each range's counts of keys above / tied with the threshold, and each range's ordered write from the
// lower ranges' counts.
inline void select_split_host(const uint32_t* codes, int64_t n, uint32_t K, int ctas, int32_t* out) {
  for (uint32_t i = 0; i < K; ++i) out[i] = -1;
  Threshold thr;
  for (int pass = 0; pass < 3; ++pass) {
    uint32_t merged[kHistBins] = {};
    const uint32_t mask = prefix_mask(pass);
    for (int r = 0; r < ctas; ++r) {
      uint32_t local[kHistBins] = {};
      const SplitRange range = split_range(n, ctas, r);
      for (int64_t j = range.lo; j < range.hi; ++j)
        if (codes[j] != 0 && (codes[j] & mask) == (thr.code & mask)) ++local[digit_of(codes[j], pass)];
      for (int b = 0; b < digit_bins(pass); ++b) merged[b] += local[b];
    }
    uint32_t total = 0;
    for (int b = 0; b < digit_bins(pass); ++b) total += merged[b];
    if (pass == 0 && total <= K) break;  // at most K visible: thr.code 0 keeps every visible key
    const RadixStep s = radix_step(merged, digit_bins(pass), pass == 0 ? K : thr.ties);
    thr.code |= s.digit << digit_shift(pass);
    thr.ties = s.k_rem;
  }
  uint32_t base_above = 0, base_ties = 0;  // over the lower ranks
  for (int r = 0; r < ctas; ++r) {
    const SplitRange range = split_range(n, ctas, r);
    uint32_t above = 0, ties = 0;
    for (int64_t j = range.lo; j < range.hi; ++j) {
      const uint32_t c = codes[j];
      const bool is_above = c > thr.code, is_tie = thr.code != 0 && c == thr.code;
      if (is_above || (is_tie && base_ties + ties < thr.ties)) {
        const uint32_t tb = base_ties + ties;
        const uint32_t pos = base_above + above + (tb < thr.ties ? tb : thr.ties);
        if (pos < K) out[pos] = static_cast<int32_t>(j);
      }
      above += is_above ? 1 : 0;
      ties += is_tie ? 1 : 0;
    }
    base_above += above;
    base_ties += ties;
  }
}
#endif

}  // namespace mxserve::kernels::dsa
