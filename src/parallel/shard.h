// Shard axes: how one weight is split over the ranks of its group at load (declared per weight in the
// model's weight table; model/weight_table.h). Shapes are the logical [out, in] of the weight.
//   kNone   -- replicated on every rank (norms, router, embeddings today)
//   kRow    -- dim 0 split over the tp group (q/k/v, gate/up projections: each rank owns output rows)
//   kColumn -- the last dim split over the tp group (o_proj, down_proj: partial sums, then an all-reduce)
//   kExpert -- a per-expert tensor: with ep > 1 owned whole by one ep rank (expert e on ep_rank e / (E / ep));
//              with ep == 1 and tp > 1 tensor-sliced along its `expert_tp` axis (gate/up: kRow, down: kColumn)
// Head groups (kRow with groups > 0, e.g. k_proj of n_kv_heads heads): only whole heads are split; when tp is
// a multiple of the head count each rank holds one whole head, head tp_rank / (tp / groups) (KV heads
// replicated over tp / groups ranks).
// MoE group (moe_group, and every kExpert weight): the weights of a MoE block (routed and shared experts) are
// sliced over the layout's MoE group (RankLayout::moe_tp(): the tp group, or the whole world under DP
// attention) instead of the tp group.
// Invariant: shard_slice() of every rank of a group tiles the logical tensor exactly (no overlap, no gap),
// except replicated heads (each head held by tp / groups ranks); an uneven split is an error naming the
// tensor and the sizes, never a silent rounding.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "parallel/rank_layout.h"

namespace mxserve::parallel {

enum class ShardAxis { kNone, kRow, kColumn, kExpert };
const char* shard_axis_name(ShardAxis a);

// The part of a weight one rank holds: dims [begin, end) along `dim` (-1 for kNone / whole), and whether
// the rank holds it at all (kExpert: only the owning ep rank).
struct ShardSlice {
  bool held = true;
  int dim = -1;
  int64_t begin = 0, end = 0;
  Shape local_shape;
};

// expert: the expert index of a kExpert weight, n_experts the layer's count, expert_tp its tensor-slicing
// axis when experts are not partitioned (ignored otherwise). groups: dim 0 holds this many equal heads (kRow
// only; 0 = plain rows).
Result<ShardSlice> shard_slice(const std::string& name, const Shape& logical, ShardAxis axis, const RankLayout& rank,
                               int64_t expert = -1, int64_t n_experts = 0, ShardAxis expert_tp = ShardAxis::kNone,
                               int64_t groups = 0, bool moe_group = false);

}  // namespace mxserve::parallel
