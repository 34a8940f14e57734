// dp_graph_step: one DP group's view of a captured DP decode step (docs/parallel.md "CUDA graphs under DP").
// A DP step's device inputs hold dp equal slot ranges (runtime/dp_graph_rows.h stages them): rows
// [g cap, (g + 1) cap) of the ids, positions and attention metadata rows are DP group g's, padded; the step's
// logits / hidden buffers have the same ranges. LockstepModel::forward_device hands each rank of group g its
// group's view: the ranks run forward_device on cap rows, group g's first rank writes its logits (and hidden)
// rows straight into the range of rank 0's buffers (the stand-in: one device), so every shape is static --
// each group brings cap rows to the DP-attention MoE exchange at every replay -- and nothing is merged on
// the host. dp 1: the view is the whole step.
// Invariant: views only (no copy, no device work): every tensor of a group's view is a slice of the caller's,
// and the metadata's sizes and tree pointers describe that slice.
#pragma once

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"

namespace mxserve::launch {

struct DpGroupStep {
  Tensor ids, positions;        // i32 [cap]
  backend::AttentionMeta meta;  // cap rows: n_tokens cap, n_seqs / n_leading_decode_rows divided by dp
  Tensor logits;                // f32 [cap, V]: the group's range of the step's logits
  Tensor hidden;                // [cap, H], or undefined when the step wants no hidden rows
};

// Group g's view of a step of T = dp cap rows (ids / positions [T], meta for T rows of dp n sequences, logits
// [T, V], hidden [T, H] or nullptr). Errors name what does not split into dp equal ranges, and refuse a
// cascade buffer when dp > 1 (its prefix groups index the whole step's rows: DP graphs are captured without
// one). dp 1: the step as given, cascade buffer included.
Result<DpGroupStep> dp_group_step(const Tensor& ids, const Tensor& positions, const backend::AttentionMeta& meta,
                                  const Tensor& logits, const Tensor* hidden, int dp, int g);

}  // namespace mxserve::launch
