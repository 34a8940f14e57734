#include "model/weight_stats.h"

#include <algorithm>

namespace mxserve::model {

WeightStats weight_stats(const std::vector<WeightSpec>& table) {
  WeightStats s;
  for (const WeightSpec& w : table) {
    if (w.optional) continue;
    const int64_t n = shape_numel(w.shape);
    ++s.tensors;
    s.parameters += n;
    if (w.shard == parallel::ShardAxis::kExpert) {
      s.expert_parameters += n;
      s.n_experts = std::max(s.n_experts, w.n_experts);
    }
  }
  return s;
}

std::vector<WeightSpec> weights_under(const std::vector<WeightSpec>& table, const std::string& prefix) {
  std::vector<WeightSpec> out;
  for (const WeightSpec& w : table)
    if (w.name.compare(0, prefix.size(), prefix) == 0) out.push_back(w);
  return out;
}

BlockWeights block_weights(const std::vector<WeightSpec>& table, const std::string& prefix) {
  BlockWeights b;
  int64_t expert_params = 0;
  for (const WeightSpec& w : weights_under(table, prefix)) {
    if (w.optional) continue;
    const int64_t n = shape_numel(w.shape);
    if (w.shard == parallel::ShardAxis::kExpert) {
      expert_params += n;
      b.n_experts = std::max(b.n_experts, w.n_experts);
      continue;
    }
    b.dense_params += n;
    if (w.role == WeightRole::kLinear || w.role == WeightRole::kRouter) b.matmul_params += n;
  }
  b.per_expert_params = b.n_experts > 0 ? expert_params / b.n_experts : 0;
  return b;
}

}  // namespace mxserve::model
