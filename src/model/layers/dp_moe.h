// DP attention's MoE exchange (docs/parallel.md "DP attention"): each DP group (tp ranks) runs attention for
// its own requests; a MoE block runs over the tokens of every DP group at once, its weights spread over the
// whole world (the MoE group, parallel/shard.h):
//   1. each rank contributes its share of its group's rows -- tp rank j of a group with T rows brings rows
//      [j T / tp, (j + 1) T / tp), so every token enters once -- and all_gather_v over the world stacks them;
//   2. MoeBlock::forward on all gathered rows: this rank's partial sum (its slice of every expert);
//   3. reduce_scatter_v over the world hands each rank the full sums of the rows it contributed;
//   4. all_gather_v over the tp group reassembles the group's T rows (skipped at tp 1).
// A group with no tokens this step brings 0 rows and still joins every collective (lockstep).
// Invariant: the output equals the one-rank MoE block on the same rows up to fp32 summation order.
#pragma once

#include <variant>
#include <vector>

#include "core/status.h"
#include "model/layers/blocks.h"
#include "model/layers/tensor_parallel.h"
#include "parallel/communicator.h"

namespace mxserve::model {

struct DpMoeExchange {
  parallel::Communicator* world = nullptr;  // every rank (the MoE group); nullptr: DP attention is off
  parallel::Communicator* tp = nullptr;     // this rank's tp group; nullptr: tp 1

  bool enabled() const { return world != nullptr; }
  // h [T, H]: this group's rows (the same on each of its tp ranks) -> the MoE block's output for them [T, H].
  Result<Tensor> forward(backend::Backend& be, const ModelConfig& cfg, const MoeBlock& moe, const Tensor& h) const;
  // The MLP half of a decoder layer, h [T,H] -> o [T,H]: a MoE block under DP attention runs the exchange
  // (whole rows back); otherwise this rank's partial sum (MoE block or dense MLP) is summed over its tp group.
  // reduce false: the partial sum is left in o for the caller's fused all-reduce + add + RMSNorm (only where
  // exchanges(mlp) is false; an exchange always returns whole rows).
  Status mlp(backend::Backend& be, const ModelConfig& cfg, const std::variant<SwigluMlp, MoeBlock>& mlp,
             TensorParallel& tp_group, const Tensor& h, Tensor& o, bool reduce = true) const;
  // Whether mlp() runs the DP exchange for this block (a MoE block under DP attention).
  bool exchanges(const std::variant<SwigluMlp, MoeBlock>& mlp) const {
    return enabled() && std::holds_alternative<MoeBlock>(mlp);
  }
  // A DP group with no tokens this step: joins the exchange of every MoE block in `blocks` (the model's, in
  // layer order) with 0 rows.
  Status idle(backend::Backend& be, const ModelConfig& cfg, const std::vector<const MoeBlock*>& blocks) const;
};

}  // namespace mxserve::model
