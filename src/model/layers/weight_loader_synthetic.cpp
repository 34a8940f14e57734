// WeightLoader's synthetic branch: every tensor generated in place on the backend
// (Backend::fill_synthetic, values from kernels/synthetic_fill.h) in the layouts the kernels want.
// Host work happens only for FP8-block weights and for MXFP4 rows whose width is not a multiple of 32
// (tiny test models): those are generated, quantized and dequantized on the host one tensor at a time
// (the same values; never a host image of the model).
#include <string>

#include "core/check.h"
#include "model/layers/weight_loader.h"
#include "quant/weight_format.h"

namespace mxserve::model {

Shape WeightLoader::synthetic_shape(const std::string& name) const {
  const auto it = synthetic_->shapes.find(name);
  MX_CHECK_MSG(it != synthetic_->shapes.end(), "synthetic weights: no tensor '" << name << "' in the weight table");
  const parallel::ShardSlice* slice = slice_of(name);
  return slice == nullptr ? it->second : slice->local_shape;
}

void WeightLoader::synthetic_fill(const std::string& name, Tensor& dst, int64_t begin, int64_t end) {
  if (const parallel::ShardSlice* slice = slice_of(name)) {
    MX_CHECK_MSG(begin == 0 && end == slice->local_shape.back(),
                 "synthetic " << name << ": a column range of a rank-sliced weight is not supported");
    synthetic_fill_slice(name, *slice, dst);
    return;
  }
  kernels::SyntheticFill p = synthetic_fill_params(*synthetic_, name);
  const std::string scheme = synthetic_scheme(synthetic_->plan, name);
  const bool whole = begin == 0 && end == p.cols;
  MX_CHECK_MSG(0 <= begin && begin < end && end <= p.cols && dst.numel() == p.rows * (end - begin),
               "synthetic " << name << ": columns [" << begin << ", " << end << ") into " << dst.describe());
  p.col_offset = begin;
  p.cols = end - begin;
  if (scheme == "bf16") {
    be_.fill_synthetic(p, dst, nullptr);
    return;
  }
  MX_CHECK_MSG(whole, "synthetic " << name << ": a column slice of a " << scheme << " weight is not supported");
  if (scheme == "mxfp4" && p.cols % 32 == 0) {
    p.kind = kernels::SyntheticKind::kMxfp4Dequant;  // exact in bf16 and f32
    be_.fill_synthetic(p, dst, nullptr);
    return;
  }
  // Host path, one tensor: fp8-block, and mxfp4 with a partial last block (an mxserve extension).
  BoundWeights one;
  one.add(name, BoundWeight{synthetic_host_tensor(*synthetic_, name), Precision::kBF16});
  const Status st = quantize_synthetic_experts(one, synthetic_->plan.experts + ":" + synthetic_->plan.rest);
  MX_CHECK_MSG(st.is_ok(), "synthetic " << name << ": " << st.to_string());
  const Tensor host = quant::to_host_f32(one.at(name).stored);
  be_.copy_weight(host, dst);
}

Tensor WeightLoader::synthetic_get(const std::string& name, DType dtype) {
  const Shape shape = synthetic_shape(name);
  Tensor dst = alloc_counted(dtype, shape);
  synthetic_fill(name, dst, 0, shape.back());
  return dst;
}

Tensor WeightLoader::synthetic_stack(const std::vector<std::vector<std::string>>& groups) {
  const Shape first = synthetic_shape(groups[0][0]);
  MX_CHECK_MSG(first.size() == 2, "synthetic stack: " << groups[0][0] << " is not 2-D");
  const int64_t cols = first[1];
  int64_t rows = 0;
  for (const auto& n : groups[0]) rows += synthetic_shape(n).at(0);
  const int64_t G = static_cast<int64_t>(groups.size());
  Tensor dst = alloc_counted(be_.weight_dtype(), {G * rows, cols});
  int64_t r = 0;
  for (const auto& group : groups) {
    for (const auto& n : group) {
      const Shape s = synthetic_shape(n);
      MX_CHECK_EQ(s.at(1), cols);
      Tensor slice = dst.slice_rows(r, r + s[0]);
      synthetic_fill(n, slice, 0, cols);
      r += s[0];
    }
  }
  MX_CHECK_EQ(r, G * rows);
  return dst.reshape({G, rows, cols});
}

backend::ExpertWeights WeightLoader::synthetic_experts(const std::vector<std::vector<std::string>>& gate_up_groups,
                                                       const std::vector<std::string>& down_names) {
  const Shape gate = synthetic_shape(gate_up_groups.at(0).at(0));  // [I, H]
  const int64_t E = static_cast<int64_t>(gate_up_groups.size()), I = gate.at(0), H = gate.at(1);
  // Packed MXFP4 stacks also for a tensor-sliced rank (its gate/up rows and down columns, generated on the
  // 32-element blocks of the one-rank model: synthetic_fill_mxfp4); the MoE kernels see a narrower I.
  const bool packed = synthetic_->plan.experts == "mxfp4" &&
                      be_.supports_expert_format(backend::ExpertFormat::kMxfp4) && H % 32 == 0 && I % 32 == 0;
  backend::ExpertWeights ex;
  if (!packed) {  // float experts (mxfp4 plans: the MXFP4 values dequantized on the device, exactly)
    std::vector<std::vector<std::string>> down;
    for (const auto& n : down_names) down.push_back({n});
    ex.gate_up = synthetic_stack(gate_up_groups);
    ex.down = synthetic_stack(down);
    return ex;
  }
  ex.format = backend::ExpertFormat::kMxfp4;
  ex.gate_up = alloc_counted(DType::kU8, {E, 2 * I, H / 2});
  ex.gate_up_scales = alloc_counted(DType::kU8, {E, 2 * I, H / 32});
  ex.down = alloc_counted(DType::kU8, {E, H, I / 2});
  ex.down_scales = alloc_counted(DType::kU8, {E, H, I / 32});
  Tensor gu = ex.gate_up.reshape({E * 2 * I, H / 2}), gus = ex.gate_up_scales.reshape({E * 2 * I, H / 32});
  Tensor dn = ex.down.reshape({E * H, I / 2}), dns = ex.down_scales.reshape({E * H, I / 32});
  auto fill = [&](const std::string& name, Tensor& codes, Tensor& scales, int64_t r0, int64_t rows) {
    Tensor c = codes.slice_rows(r0, r0 + rows), s = scales.slice_rows(r0, r0 + rows);
    synthetic_fill_mxfp4(name, c, s);
  };
  for (int64_t e = 0; e < E; ++e) {
    MX_CHECK_EQ(gate_up_groups[e].size(), 2u);
    fill(gate_up_groups[e][0], gu, gus, e * 2 * I, I);
    fill(gate_up_groups[e][1], gu, gus, e * 2 * I + I, I);
    fill(down_names.at(e), dn, dns, e * H, H);
  }
  return ex;
}

}  // namespace mxserve::model
