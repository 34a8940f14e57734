// transformers' fused expert tensors sliced per expert (hf_fused_experts.h has the layout).
#include "quant/hf_fused_experts.h"

#include <cstring>
#include <regex>

#include "quant/host_float.h"

namespace mxserve::quant {
namespace {

std::string desc(const io::TensorInfo& t) { return std::string(dtype_name(t.dtype)) + " " + shape_to_string(t.shape); }

// Rows [r0, r0 + n) of matrix e of a row-major [E, R, C] tensor: a contiguous range of the mapped file,
// returned as a non-owning [n, C] view (binding reads no byte; the loader reads only the rank's part).
Tensor view_rows(const Tensor& stacked, int64_t e, int64_t r0, int64_t n) {
  const int64_t R = stacked.dim(1), C = stacked.dim(2), esize = dtype_bits(stacked.dtype()) / 8;
  char* base = static_cast<char*>(stacked.raw());
  return Tensor::view_of(base + ((e * R + r0) * C) * esize, stacked.dtype(), {n, C});
}

}  // namespace

Result<std::optional<HfFusedSlice>> hf_fused_expert_slice(const io::Checkpoint& ckpt, const std::string& weight_name,
                                                          const DetectOptions& opts) {
  static const std::regex kExpert(R"(^(.*\.experts)\.([0-9]+)\.(gate|up|down)_proj\.weight$)");
  std::smatch m;
  if (!std::regex_match(weight_name, m, kExpert)) return std::optional<HfFusedSlice>();
  const std::string proj = m[3].str();
  const std::string fused = m[1].str() + (proj == "down" ? ".down_proj" : ".gate_up_proj");
  const io::CheckpointTensor* t = ckpt.find(fused);
  if (t == nullptr) return std::optional<HfFusedSlice>();
  const io::TensorInfo& info = *t->info;
  const bool fp8 = info.dtype == DType::kFP8E4M3;
  if (info.shape.size() != 3 || !(fp8 || is_plain_float(info.dtype)))
    return invalid_argument("tensor '" + fused + "' is " + desc(info) + ", expected float or fp8_e4m3 [E, " +
                            (proj == "down" ? "H, I" : "2I, H") + "] (transformers' fused experts)");
  const int64_t E = info.shape[0], rows = info.shape[1], cols = info.shape[2];
  const int64_t e = std::stoll(m[2].str());
  if (e >= E)
    return invalid_argument("'" + weight_name + "': expert " + std::to_string(e) + " is outside '" + fused + "' (" +
                            std::to_string(E) + " experts)");
  if (proj != "down" && rows % 2 != 0)
    return invalid_argument("tensor '" + fused + "' is " + desc(info) + ": gate/up halves need an even row count");
  const int64_t n = proj == "down" ? rows : rows / 2;
  const int64_t r0 = proj == "up" ? n : 0;

  HfFusedSlice s;
  s.consumed = {fused};
  StoredWeight& w = s.weight;
  w.name = weight_name;
  w.shape = {n, cols};
  const Tensor data = ckpt.view(*t);
  w.data = view_rows(data, e, r0, n);
  const std::string scale_name = fused + "_scale_inv";
  const io::CheckpointTensor* st = ckpt.find(scale_name);
  if (!fp8) {
    if (st != nullptr)
      return invalid_argument("tensor '" + fused + "' is " + desc(info) + " (unquantized) but its scale '" + scale_name +
                              "' is present");
    w.precision = info.dtype == DType::kF32 ? Precision::kF32 : info.dtype == DType::kBF16 ? Precision::kBF16
                                                                                            : Precision::kF16;
    return std::optional<HfFusedSlice>(std::move(s));
  }
  if (st == nullptr)
    return invalid_argument("tensor '" + fused + "' is " + desc(info) + " but its block scale '" + scale_name +
                            "' is missing");
  const int64_t br = opts.fp8_block_rows, bc = opts.fp8_block_cols;
  const Shape want = {E, (rows + br - 1) / br, (cols + bc - 1) / bc};
  if (st->info->dtype != DType::kF32 || st->info->shape != want)
    return invalid_argument("tensor '" + scale_name + "' (block scale of '" + fused + "' " + desc(info) + ") is " +
                            desc(*st->info) + ", expected f32 " + shape_to_string(want) + " (blocks of " +
                            std::to_string(br) + "x" + std::to_string(bc) + ")");
  if (proj != "down" && n % br != 0)
    return invalid_argument("tensor '" + fused + "' " + desc(info) + ": its gate/up halves (" + std::to_string(n) +
                            " rows each) do not fall on a " + std::to_string(br) +
                            "-row block boundary, so one scale block straddles gate and up");
  w.precision = Precision::kFp8Block;
  w.block_rows = br;
  w.block_cols = bc;
  w.scale_name = scale_name;
  w.scale = view_rows(ckpt.view(*st), e, r0 / br, (n + br - 1) / br);
  s.consumed.push_back(scale_name);
  return std::optional<HfFusedSlice>(std::move(s));
}

}  // namespace mxserve::quant
