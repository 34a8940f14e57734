// Tuned split counts of the decode attention kernel (issue 17 item 5): one table per (GPU, KV cache dtype,
// head geometry) over a grid of (rows, context) buckets, written by `mxserve tune-attention`
// (kernels/attention_tuning.h parses and embeds them; docs/perf/decode-path.md says how to tune).
// Header-only so the CUDA planner (kernels/cuda/attention/paged_attention.cu) can look a shape up
// without a link dependency on the tuning library.
// Key invariant: a lookup never extrapolates past the grid's largest rows or context bucket (0 = outside:
// the planner runs its heuristic and says so); inside it, each axis snaps to its nearest bucket on a log scale.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace mxserve::kernels {

struct AttentionTuningKey {
  std::string gpu;       // cudaDeviceProp::name, e.g. "NVIDIA H200"
  std::string kv_dtype;  // "bf16" | "fp8_e4m3"
  int32_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  // "Q96_KV8_D128_bf16"
  std::string shape_label() const {
    return "Q" + std::to_string(n_heads) + "_KV" + std::to_string(n_kv_heads) + "_D" + std::to_string(head_dim) +
           "_" + kv_dtype;
  }
  bool operator==(const AttentionTuningKey& o) const {  // spelled out: the .cu files build as C++17
    return gpu == o.gpu && kv_dtype == o.kv_dtype && n_heads == o.n_heads && n_kv_heads == o.n_kv_heads &&
           head_dim == o.head_dim;
  }
};

struct AttentionSplitTable {
  AttentionTuningKey key;
  bool tuned = false;               // false: a placeholder (status "untuned"); the planner never uses one
  std::string command;              // how the tuner was run (informative)
  std::string source;               // file path or "embedded:<name>.json"
  std::vector<int64_t> rows;        // bucket axis: decode rows (sequences) per batch, ascending, unique
  std::vector<int64_t> contexts;    // bucket axis: context length (the batch's longest), ascending, unique
  std::vector<int32_t> n_splits;    // [rows.size() * contexts.size()], row-major over rows; each >= 1
  std::vector<double> us;           // the measured time of each choice (informative), same layout
};

namespace detail {
// Index of the bucket nearest x on a log scale (ties to the smaller); axis ascending, non-empty.
inline size_t nearest_log_bucket(const std::vector<int64_t>& axis, int64_t x) {
  const double lx = std::log(static_cast<double>(x > 0 ? x : 1));
  size_t best = 0;
  double best_d = INFINITY;
  for (size_t i = 0; i < axis.size(); ++i) {
    const double d = std::fabs(std::log(static_cast<double>(axis[i])) - lx);
    if (d < best_d) {
      best_d = d;
      best = i;
    }
  }
  return best;
}
}  // namespace detail

// Tuned split count for `rows` decode rows whose longest context is `context`; 0 when the table is not a
// tuned one or the shape lies beyond its largest bucket on either axis (the caller's heuristic applies).
inline int32_t lookup_attention_splits(const AttentionSplitTable& t, int64_t rows, int64_t context) {
  if (!t.tuned || t.rows.empty() || t.contexts.empty()) return 0;
  if (rows > t.rows.back() || context > t.contexts.back()) return 0;
  const size_t r = detail::nearest_log_bucket(t.rows, rows), c = detail::nearest_log_bucket(t.contexts, context);
  return t.n_splits[r * t.contexts.size() + c];
}

}  // namespace mxserve::kernels
