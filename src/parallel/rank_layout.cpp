#include "parallel/rank_layout.h"

namespace mxserve::parallel {

std::string RankLayout::describe() const {
  return "rank " + std::to_string(rank) + "/" + std::to_string(world()) + " (tp " + std::to_string(tp_rank()) + "/" +
         std::to_string(tp) + ", ep " + std::to_string(ep_rank()) + "/" + std::to_string(ep) + ", dp " +
         std::to_string(dp_rank()) + "/" + std::to_string(dp) + (dp_attention ? ", dp attention" : "") +
         ") on device " + std::to_string(device);
}

Status ParallelConfig::validate() const {
  if (tp < 1) return invalid_argument("tensor-parallel size must be >= 1, got " + std::to_string(tp));
  if (dp < 1) return invalid_argument("data-parallel size must be >= 1, got " + std::to_string(dp));
  if (ep < 1) return invalid_argument("expert-parallel size must be >= 1, got " + std::to_string(ep));
  // Routed experts are held whole (never width-sliced) once partitioned, so the ranks that sum a MoE block's
  // partial outputs -- a tp group, or the whole world -- must hold each expert exactly once: ep is the tp
  // group (each DP replica partitions the experts over its tp ranks) or the world (one partition).
  if (ep != 1 && ep != tp && ep != world())
    return invalid_argument("--ep-size " + std::to_string(ep) + " must be 1, the tensor-parallel size " +
                            std::to_string(tp) + " or tp x dp = " + std::to_string(world()) +
                            " (experts are partitioned whole over a tp group or over all ranks; "
                            "--enable-expert-parallel picks tp x dp)");
  if (dp_attention && dp < 2)
    return invalid_argument("--enable-dp-attention needs --data-parallel-size > 1 (each dp rank runs attention for its "
                            "own requests), got --dp-size " + std::to_string(dp));
  // DP attention sums each MoE block over the whole world: experts partitioned over one tp group would count dp
  // times. Plain DP replicas are independent: a partition over the world would leave each replica without experts.
  if (dp > 1 && ep != 1 && ep != (dp_attention ? world() : tp))
    return invalid_argument("--ep-size " + std::to_string(ep) + (dp_attention ? " with --enable-dp-attention must be 1 or tp x dp = " + std::to_string(world()) + " (the MoE blocks are summed over all ranks)" : " with --data-parallel-size " + std::to_string(dp) + " (replicas) must be 1 or the tensor-parallel size " + std::to_string(tp) + " (each replica partitions its experts over its tp group)"));
  if (first_device < 0) return invalid_argument("first device must be >= 0, got " + std::to_string(first_device));
  return Status::ok();
}

Result<std::vector<RankLayout>> ParallelConfig::ranks() const {
  MX_RETURN_IF_ERROR(validate());
  std::vector<RankLayout> out;
  for (int r = 0; r < world(); ++r) out.push_back(RankLayout{tp, ep, dp, r, first_device + r, dp_attention});
  return out;
}

}  // namespace mxserve::parallel
