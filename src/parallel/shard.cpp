#include "parallel/shard.h"

namespace mxserve::parallel {

const char* shard_axis_name(ShardAxis a) {
  switch (a) {
    case ShardAxis::kNone: return "none";
    case ShardAxis::kRow: return "row";
    case ShardAxis::kColumn: return "column";
    case ShardAxis::kExpert: return "expert";
  }
  return "?";
}

Result<ShardSlice> shard_slice(const std::string& name, const Shape& logical, ShardAxis axis, const RankLayout& rank,
                               int64_t expert, int64_t n_experts, ShardAxis expert_tp, int64_t groups,
                               bool moe_group) {
  if ((moe_group || axis == ShardAxis::kExpert) && rank.dp_attention) {  // sliced over the MoE group (the world)
    RankLayout world = rank;
    world.tp = rank.moe_tp();
    world.dp = 1;
    world.dp_attention = false;
    return shard_slice(name, logical, axis, world, expert, n_experts, expert_tp, groups, false);
  }
  ShardSlice s;
  s.local_shape = logical;
  if (axis == ShardAxis::kNone) return s;
  if (axis == ShardAxis::kExpert) {
    if (expert < 0 || n_experts <= 0 || expert >= n_experts)
      return invalid_argument(name + ": expert-sharded weight without a valid expert index (" + std::to_string(expert) +
                              " of " + std::to_string(n_experts) + ")");
    if (n_experts % rank.ep != 0)
      return invalid_argument(name + ": " + std::to_string(n_experts) + " experts do not split over ep " +
                              std::to_string(rank.ep));
    if (rank.ep > 1) {
      s.held = expert / (n_experts / rank.ep) == rank.ep_rank();
      return s;
    }
    if (expert_tp == ShardAxis::kNone || expert_tp == ShardAxis::kExpert || rank.tp == 1) return s;
    axis = expert_tp;  // experts not partitioned: every rank holds a slice of every expert
  }
  if (logical.empty()) return invalid_argument(name + ": a scalar cannot be split (" + shard_axis_name(axis) + ")");
  s.dim = axis == ShardAxis::kRow ? 0 : static_cast<int>(logical.size()) - 1;
  const int64_t n = logical[s.dim];
  if (groups > 0 && axis == ShardAxis::kRow) {
    const int64_t width = n / groups;
    if (n % groups != 0)
      return invalid_argument(name + ": " + std::to_string(n) + " rows are not " + std::to_string(groups) + " heads");
    if (groups % rank.tp != 0 && rank.tp % groups != 0)
      return invalid_argument(name + ": " + std::to_string(groups) + " heads neither split over tp " +
                              std::to_string(rank.tp) + " nor replicate evenly (tp must divide the head count or be a "
                              "multiple of it)");
    if (groups % rank.tp != 0) {  // tp > groups: one whole head per rank, replicated over tp / groups ranks
      s.begin = rank.tp_rank() / (rank.tp / groups) * width;
      s.end = s.begin + width;
      s.local_shape[0] = width;
      return s;
    }
  }
  if (n % rank.tp != 0)
    return invalid_argument(name + ": dim " + std::to_string(s.dim) + " of " + shape_to_string(logical) + " (" +
                            shard_axis_name(axis) + ") does not split over tp " + std::to_string(rank.tp));
  const int64_t part = n / rank.tp;
  s.begin = part * rank.tp_rank();
  s.end = s.begin + part;
  s.local_shape[s.dim] = part;
  return s;
}

}  // namespace mxserve::parallel
