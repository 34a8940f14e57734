#include "launch/dp_graph_step.h"

#include <string>

namespace mxserve::launch {
namespace {

// Rows [g cap, (g + 1) cap) of a [T, ...] tensor; an undefined (or empty 0-d) tensor stays as it is.
Tensor range_of(const Tensor& t, int64_t cap, int g) {
  if (t.ndim() == 0 || t.numel() == 0) return t;
  return t.slice_rows(g * cap, (g + 1) * cap);
}

}  // namespace

Result<DpGroupStep> dp_group_step(const Tensor& ids, const Tensor& positions, const backend::AttentionMeta& meta,
                                  const Tensor& logits, const Tensor* hidden, int dp, int g) {
  const int64_t T = ids.numel();
  const kernels::AttentionParams& p = meta.params;
  if (dp < 1 || g < 0 || g >= dp)
    return invalid_argument("DP graph step: group " + std::to_string(g) + " of " + std::to_string(dp));
  if (ids.ndim() != 1 || positions.ndim() != 1 || positions.numel() != T || p.n_tokens != T || T % dp != 0 ||
      p.n_seqs % dp != 0 || p.n_leading_decode_rows % dp != 0 || logits.ndim() != 2 || logits.dim(0) != T ||
      (hidden != nullptr && (hidden->ndim() != 2 || hidden->dim(0) != T)))
    return invalid_argument("DP graph step: " + std::to_string(T) + " ids, " + std::to_string(positions.numel()) +
                            " positions, metadata for " + std::to_string(p.n_tokens) + " rows of " +
                            std::to_string(p.n_seqs) + " sequences (" + std::to_string(p.n_leading_decode_rows) +
                            " decode rows), logits " + logits.describe() +
                            (hidden != nullptr ? ", hidden " + hidden->describe() : std::string()) +
                            " do not split into " + std::to_string(dp) + " equal DP group ranges");
  if (dp == 1) {  // the whole step (a cascade buffer included)
    DpGroupStep whole{ids, positions, meta, logits, hidden != nullptr ? *hidden : Tensor()};
    return whole;
  }
  if (meta.cascade.ndim() == 1 && meta.cascade.numel() > 0)
    return invalid_argument("DP graph step: a cascade buffer indexes the whole step's rows (DP graphs are captured "
                            "without one)");
  const int64_t cap = T / dp;
  DpGroupStep out;
  out.ids = ids.slice_rows(g * cap, (g + 1) * cap);
  out.positions = positions.slice_rows(g * cap, (g + 1) * cap);
  out.logits = logits.slice_rows(g * cap, (g + 1) * cap);
  if (hidden != nullptr) out.hidden = hidden->slice_rows(g * cap, (g + 1) * cap);
  backend::AttentionMeta& m = out.meta;
  m = meta;
  m.token_seq = range_of(meta.token_seq, cap, g);
  m.kv_index = range_of(meta.kv_index, cap, g);
  m.slot_mapping = range_of(meta.slot_mapping, cap, g);
  m.tree_mask = range_of(meta.tree_mask, cap, g);
  m.tree_base = range_of(meta.tree_base, cap, g);
  m.params.n_tokens = static_cast<int32_t>(cap);
  m.params.n_seqs = p.n_seqs / dp;
  m.params.n_leading_decode_rows = p.n_leading_decode_rows / dp;
  if (p.tree_mask != nullptr) m.params.tree_mask = static_cast<const uint64_t*>(m.tree_mask.raw());
  if (p.tree_base != nullptr) m.params.tree_base = m.tree_base.data<int32_t>();
  return out;
}

}  // namespace mxserve::launch
