#include "model/layers/weight_loader.h"

#include <cstring>

#include "core/check.h"
#include "quant/weight_format.h"

namespace mxserve::model {

Tensor WeightLoader::host_float(const std::string& name) const {
  const BoundWeight& w = weights_.at(name);
  if (quant::is_float(w.precision())) return w.stored.data;
  return quant::to_host_f32(w.stored);
}

Tensor WeightLoader::get(const std::string& name) {
  if (synthetic_) return synthetic_get(name, be_.weight_dtype());
  const Tensor host = host_float(name);
  Tensor dst = be_.alloc(be_.weight_dtype(), host.shape());
  be_.copy_weight(host, dst);
  return dst;
}

Tensor WeightLoader::get_f32(const std::string& name) {
  if (synthetic_) return synthetic_get(name, DType::kF32);
  const Tensor host = host_float(name);
  Tensor dst = be_.alloc(DType::kF32, host.shape());
  be_.copy_weight(host, dst);
  return dst;
}

Tensor WeightLoader::concat_rows(const std::vector<std::string>& names) {
  Tensor stacked = stack({names});  // [1, rows, cols]
  return stacked.reshape({stacked.dim(1), stacked.dim(2)});
}

Tensor WeightLoader::stack(const std::vector<std::vector<std::string>>& groups) {
  MX_CHECK(!groups.empty() && !groups[0].empty());
  if (synthetic_) return synthetic_stack(groups);
  const int64_t cols = weights_.at(groups[0][0]).shape().at(1);
  int64_t rows = 0;
  for (const auto& n : groups[0]) rows += weights_.at(n).shape().at(0);
  const int64_t G = static_cast<int64_t>(groups.size());
  Tensor dst = be_.alloc(be_.weight_dtype(), {G * rows, cols});
  int64_t r = 0;
  for (const auto& group : groups) {
    for (const auto& n : group) {
      const Tensor host = host_float(n);
      MX_CHECK_EQ(host.dim(1), cols);
      Tensor slice = dst.slice_rows(r, r + host.dim(0));
      be_.copy_weight(host, slice);
      r += host.dim(0);
    }
  }
  MX_CHECK_EQ(r, G * rows);
  return dst.reshape({G, rows, cols});
}

backend::ExpertWeights WeightLoader::experts(const std::vector<std::vector<std::string>>& gate_up_groups,
                                             const std::vector<std::string>& down_names) {
  if (synthetic_) return synthetic_experts(gate_up_groups, down_names);
  backend::ExpertWeights ex;
  std::vector<std::vector<std::string>> down;
  for (const auto& n : down_names) down.push_back({n});
  ex.gate_up = stack(gate_up_groups);
  ex.down = stack(down);
  return ex;
}

Tensor WeightLoader::columns(const std::string& name, int64_t begin, int64_t end) {
  if (synthetic_) {
    const Shape shape = synthetic_shape(name);
    MX_CHECK(shape.size() == 2 && 0 <= begin && begin < end && end <= shape[1]);
    Tensor dst = be_.alloc(be_.weight_dtype(), {shape[0], end - begin});
    synthetic_fill(name, dst, begin, end);
    return dst;
  }
  const Tensor host = host_float(name);
  MX_CHECK(host.ndim() == 2 && 0 <= begin && begin < end && end <= host.dim(1));
  const int64_t rows = host.dim(0), width = end - begin;
  const int64_t esize = dtype_bits(host.dtype()) / 8;
  Tensor tmp = Tensor::empty(host.dtype(), {rows, width});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(tmp.raw()) + r * width * esize,
                static_cast<const char*>(host.raw()) + (r * host.dim(1) + begin) * esize, width * esize);
  Tensor dst = be_.alloc(be_.weight_dtype(), {rows, width});
  be_.copy_weight(tmp, dst);
  return dst;
}

}  // namespace mxserve::model
