#include "model/layers/weight_loader.h"

#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "core/logging.h"
#include "quant/mxfp4.h"
#include "quant/weight_format.h"

namespace mxserve::model {
namespace {

// ---- checkpoint MXFP4 experts kept packed (issue 9). Only the BoundWeights branch lives here. ----

// Whether every routed-expert tensor of the layer is stored as MXFP4. A layer that mixes MXFP4 with other
// precisions is dequantized (loudly: the checkpoint is unusual and costs full-precision memory).
bool checkpoint_experts_all_mxfp4(const BoundWeights& w, const std::vector<std::vector<std::string>>& gate_up_groups,
                                  const std::vector<std::string>& down_names) {
  size_t mx = 0, total = 0;
  for (const auto& g : gate_up_groups)
    for (const auto& n : g) total++, mx += w.at(n).precision() == Precision::kMxfp4;
  for (const auto& n : down_names) total++, mx += w.at(n).precision() == Precision::kMxfp4;
  if (mx > 0 && mx < total) {
    MX_LOG(kWarn) << "routed experts (" << down_names.front() << " and the rest of its layer): " << mx << " of " << total
                  << " tensors are mxfp4, the others not: dequantizing the whole layer to float (full-precision "
                     "device memory, the bf16 expert kernels)";
  }
  return total > 0 && mx == total;
}

// Empty when the MXFP4 expert kernels can run these widths, else why not, naming the first bad tensor.
std::string checkpoint_mxfp4_width_problem(const BoundWeights& w,
                                           const std::vector<std::vector<std::string>>& gate_up_groups,
                                           const std::vector<std::string>& down_names) {
  auto check = [&](const std::string& n) -> std::string {
    const Shape& s = w.at(n).shape();  // logical [out, in]
    if (s.size() != 2 || s[1] % quant::kMxBlock != 0)
      return n + ": in-features " + (s.size() == 2 ? std::to_string(s[1]) : shape_to_string(s)) +
             " is not a multiple of 32 (the MXFP4 expert kernels need whole 32-element scale blocks)";
    return {};
  };
  for (const auto& g : gate_up_groups)
    for (const auto& n : g)
      if (auto p = check(n); !p.empty()) return p;
  for (const auto& n : down_names)
    if (auto p = check(n); !p.empty()) return p;
  return {};
}

// Stacks per-expert packed codes and E8M0 scales, groups[e] concatenated along rows, into host u8
// [G, rows, cols/2] and [G, rows, cols/32] (the same row order as the float stack), then uploads both.
void stack_checkpoint_mxfp4(backend::Backend& be, const BoundWeights& w,
                            const std::vector<std::vector<std::string>>& groups, Tensor* codes, Tensor* scales,
                            WeightLoader::LoadStats* stats) {
  const int64_t cols = w.at(groups[0][0]).shape().at(1);
  int64_t rows = 0;
  for (const auto& n : groups[0]) rows += w.at(n).shape().at(0);
  const int64_t G = static_cast<int64_t>(groups.size());
  const int64_t qcols = cols / 2, scols = cols / quant::kMxBlock;
  // NOTE: one layer's codes are staged on the host (e.g. 160 x 3072 x 2560 B = 1.26 GB for GLM-4.5 gate_up);
  // a per-expert device copy would need a raw copy-into-slice on Backend.
  Tensor hq = Tensor::empty(DType::kU8, {G, rows, qcols});
  Tensor hs = Tensor::empty(DType::kU8, {G, rows, scols});
  int64_t r = 0;  // row over G * rows
  for (const auto& group : groups) {
    for (const auto& n : group) {
      const quant::StoredWeight& sw = w.at(n).stored;
      const int64_t nr = sw.shape.at(0);
      MX_CHECK_MSG(sw.shape.at(1) == cols && sw.data.numel() == nr * qcols && sw.scale.numel() == nr * scols &&
                       sw.data.nbytes() == static_cast<uint64_t>(nr * qcols) &&
                       sw.scale.nbytes() == static_cast<uint64_t>(nr * scols),
                   "mxfp4 experts: " << sw.describe() << " does not stack as [" << nr << ", " << qcols << "] + ["
                                     << nr << ", " << scols << "]");
      std::memcpy(hq.data<uint8_t>() + r * qcols, sw.data.raw(), nr * qcols);
      std::memcpy(hs.data<uint8_t>() + r * scols, sw.scale.raw(), nr * scols);
      stats->bytes_read += nr * (qcols + scols);
      stats->bytes_share += nr * (qcols + scols);
      stats->tensors++;
      r += nr;
    }
  }
  MX_CHECK_EQ(r, G * rows);
  *codes = be.upload(hq);
  *scales = be.upload(hs);
  stats->backend_bytes += codes->nbytes() + scales->nbytes();
}

backend::ExpertWeights checkpoint_experts_mxfp4(backend::Backend& be, const BoundWeights& w,
                                                const std::vector<std::vector<std::string>>& gate_up_groups,
                                                const std::vector<std::string>& down_names,
                                                WeightLoader::LoadStats* stats) {
  backend::ExpertWeights ex;
  ex.format = backend::ExpertFormat::kMxfp4;
  std::vector<std::vector<std::string>> down;
  for (const auto& n : down_names) down.push_back({n});
  stack_checkpoint_mxfp4(be, w, gate_up_groups, &ex.gate_up, &ex.gate_up_scales, stats);  // [E, 2I, H/2], [E, 2I, H/32]
  stack_checkpoint_mxfp4(be, w, down, &ex.down, &ex.down_scales, stats);                 // [E, H, I/2], [E, H, I/32]
  MX_CHECK_EQ(ex.down.dim(1), ex.gate_up.dim(2) * 2);
  MX_CHECK_EQ(ex.down.dim(2) * 4, ex.gate_up.dim(1));  // I/2 * 4 == 2I
  return ex;
}

}  // namespace

Tensor WeightLoader::host_float(const std::string& name) {
  const BoundWeight& w = weights_.at(name);
  const quant::StoredWeight& sw = w.stored;
  const parallel::ShardSlice* slice = slice_of(name);
  const uint64_t stored = sw.data.nbytes() + (sw.scale.raw() != nullptr ? sw.scale.nbytes() : 0);
  stats_.tensors++;
  if (quant::is_float(w.precision())) {
    // A view of the mapping: only the slice's byte ranges are copied out (copy_slice), so only its pages read.
    const Tensor out = slice == nullptr ? sw.data : copy_slice(sw.data, *slice);
    stats_.bytes_read += out.nbytes();
    stats_.bytes_share += out.nbytes();
    return out;
  }
  if (slice != nullptr) {
    if (auto part = slice_stored(sw, *slice)) {  // the packed slice only, then dequantized
      const uint64_t part_bytes = part->data.nbytes() + (part->scale.raw() != nullptr ? part->scale.nbytes() : 0);
      stats_.bytes_read += part_bytes;
      stats_.bytes_share += part_bytes;
      return quant::to_host_f32(*part);
    }
    if (!warned_whole_dequant_) {  // once per rank: the read then costs the whole tensor (stats_ counts it)
      warned_whole_dequant_ = true;
      MX_LOG(kWarn) << name << " (" << sw.describe() << "): the slice of " << rank_.describe()
                    << " does not fall on its scale blocks; dequantizing whole tensors on this rank (this one and"
                       " any other like it: more host memory and bytes read than the rank's share)";
    }
  }
  const Tensor whole = quant::to_host_f32(sw);
  stats_.bytes_read += stored;
  if (slice == nullptr) {
    stats_.bytes_share += stored;
    return whole;
  }
  Tensor out = copy_slice(whole, *slice);
  stats_.bytes_share += static_cast<uint64_t>(static_cast<double>(stored) * out.numel() / whole.numel());
  return out;
}

Tensor WeightLoader::alloc_counted(DType dtype, Shape shape) {
  Tensor t = be_.alloc(dtype, std::move(shape));
  stats_.backend_bytes += t.nbytes();
  return t;
}

Tensor WeightLoader::get(const std::string& name) {
  if (synthetic_) return synthetic_get(name, be_.weight_dtype());
  const Tensor host = host_float(name);
  Tensor dst = alloc_counted(be_.weight_dtype(), host.shape());
  be_.copy_weight(host, dst);
  return dst;
}

Tensor WeightLoader::get_f32(const std::string& name) {
  if (synthetic_) return synthetic_get(name, DType::kF32);
  const Tensor host = host_float(name);
  Tensor dst = alloc_counted(DType::kF32, host.shape());
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
  const int64_t cols = local_shape(groups[0][0]).at(1);
  int64_t rows = 0;
  for (const auto& n : groups[0]) rows += local_shape(n).at(0);
  const int64_t G = static_cast<int64_t>(groups.size());
  Tensor dst = alloc_counted(be_.weight_dtype(), {G * rows, cols});
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
  MX_CHECK(!gate_up_groups.empty() && gate_up_groups.size() == down_names.size());
  // A tensor-sliced rank keeps its MXFP4 slices packed too (gate/up rows and down's 32-element column blocks
  // cut out of the mapping: slice_stored reads only their byte ranges; a slice off the blocks is dequantized)
  // when MXSERVE_PACKED_EXPERT_SLICES=1: opt-in until a GPU run with a real checkpoint proves it (the synthetic
  // twin is proven by test_cuda_mxfp4_slices). Off: a sliced rank dequantizes (said once per rank).
  static const bool packed_slices_on = [] {
    const char* env = std::getenv("MXSERVE_PACKED_EXPERT_SLICES");
    return env != nullptr && std::string(env) == "1";
  }();
  if (experts_sliced() && !packed_slices_on && be_.supports_expert_format(backend::ExpertFormat::kMxfp4) &&
      !warned_sliced_dequant_) {
    warned_sliced_dequant_ = true;
    MX_LOG(kWarn) << rank_.describe() << ": the checkpoint's MXFP4 expert slices are dequantized to "
                  << dtype_name(be_.weight_dtype()) << " (4x their packed bytes); MXSERVE_PACKED_EXPERT_SLICES=1 keeps "
                  << "them packed (new, not yet proven on a GPU with a real checkpoint)";
  }
  if ((!experts_sliced() || packed_slices_on) && be_.supports_expert_format(backend::ExpertFormat::kMxfp4) &&
      checkpoint_experts_all_mxfp4(weights_, gate_up_groups, down_names)) {
    BoundWeights sliced;
    bool packed_slices = true;
    auto add_slice = [&](const std::string& n) {
      const parallel::ShardSlice* slice = slice_of(n);
      if (slice == nullptr) return sliced.add(n, weights_.at(n));
      auto part = slice_stored(weights_.at(n).stored, *slice);
      if (!part) {
        packed_slices = false;
        return;
      }
      sliced.add(n, BoundWeight(std::move(*part)));
    };
    for (const auto& g : gate_up_groups)
      for (const auto& n : g) add_slice(n);
    for (const auto& n : down_names) add_slice(n);
    const BoundWeights& src = packed_slices ? sliced : weights_;
    const std::string problem = packed_slices ? checkpoint_mxfp4_width_problem(src, gate_up_groups, down_names)
                                              : "a rank's slice does not fall on 32-element MXFP4 blocks";
    if (problem.empty()) return checkpoint_experts_mxfp4(be_, src, gate_up_groups, down_names, &stats_);
    MX_LOG(kWarn) << "mxfp4 experts cannot stay packed on " << be_.name() << ": " << problem
                  << ". Dequantizing this layer's experts to " << dtype_name(be_.weight_dtype())
                  << " (full-precision device memory, the bf16 expert kernels)";
  }
  backend::ExpertWeights ex;
  std::vector<std::vector<std::string>> down;
  for (const auto& n : down_names) down.push_back({n});
  ex.gate_up = stack(gate_up_groups);
  ex.down = stack(down);
  return ex;
}

Tensor WeightLoader::columns(const std::string& name, int64_t begin, int64_t end) {
  MX_CHECK_MSG(slice_of(name) == nullptr, name << ": a column range of a rank-sliced weight is not supported");
  if (synthetic_) {
    const Shape shape = synthetic_shape(name);
    MX_CHECK(shape.size() == 2 && 0 <= begin && begin < end && end <= shape[1]);
    Tensor dst = be_.alloc(be_.weight_dtype(), {shape[0], end - begin});
    synthetic_fill(name, dst, begin, end);
    return dst;
  }
  const BoundWeight& w = weights_.at(name);
  if (quant::is_float(w.precision()) && w.stored.data.ndim() == 2) {  // each row's window, out of the mapping
    const Tensor& d = w.stored.data;
    MX_CHECK(0 <= begin && begin < end && end <= d.dim(1));
    parallel::ShardSlice window;
    window.dim = 1, window.begin = begin, window.end = end, window.local_shape = {d.dim(0), end - begin};
    const Tensor part = copy_slice(d, window);
    stats_.tensors++;
    stats_.bytes_read += part.nbytes();
    stats_.bytes_share += part.nbytes();
    Tensor dst = alloc_counted(be_.weight_dtype(), part.shape());
    be_.copy_weight(part, dst);
    return dst;
  }
  const Tensor host = host_float(name);  // quantized: dequantized whole, then the window copied
  MX_CHECK(host.ndim() == 2 && 0 <= begin && begin < end && end <= host.dim(1));
  const int64_t rows = host.dim(0), width = end - begin;
  const int64_t esize = dtype_bits(host.dtype()) / 8;
  Tensor tmp = Tensor::empty(host.dtype(), {rows, width});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(tmp.raw()) + r * width * esize,
                static_cast<const char*>(host.raw()) + (r * host.dim(1) + begin) * esize, width * esize);
  Tensor dst = alloc_counted(be_.weight_dtype(), {rows, width});
  be_.copy_weight(tmp, dst);
  return dst;
}

}  // namespace mxserve::model
