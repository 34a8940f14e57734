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
  if (world() % ep != 0)
    return invalid_argument("expert-parallel size " + std::to_string(ep) + " must divide the world (tp " +
                            std::to_string(tp) + " x dp " + std::to_string(dp) + " = " + std::to_string(world()) + ")");
  if (dp_attention && dp < 2)
    return invalid_argument("--enable-dp-attention needs --data-parallel-size > 1 (each dp rank runs attention for its "
                            "own requests), got --dp-size " + std::to_string(dp));
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
