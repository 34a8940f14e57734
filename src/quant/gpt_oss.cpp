#include "quant/gpt_oss.h"

#include <cstring>
#include <regex>

#include "quant/detect.h"
#include "quant/mxfp4.h"

namespace mxserve::quant {

Result<std::optional<GptOssSlice>> gpt_oss_expert_slice(const io::Checkpoint& ckpt, const std::string& weight_name) {
  static const std::regex kExpert(R"(^(.*\.experts)\.([0-9]+)\.(gate|up|down)_proj\.weight$)");
  std::smatch m;
  if (!std::regex_match(weight_name, m, kExpert)) return std::optional<GptOssSlice>();
  const std::string prefix = m[1].str(), proj = m[3].str();
  const int64_t e = std::stoll(m[2].str());
  const std::string blocks = prefix + (proj == "down" ? ".down_proj_blocks" : ".gate_up_proj_blocks");
  if (ckpt.find(blocks) == nullptr) return std::optional<GptOssSlice>();
  MX_ASSIGN_OR_RETURN(StoredWeight fused, detect_gpt_oss_blocks(ckpt, blocks));
  if (fused.shape.size() != 3)
    return invalid_argument("tensor '" + blocks + "' is " + fused.describe() + ", expected [E, rows, in/32, 16]");
  const int64_t E = fused.shape[0], rows = fused.shape[1], k = fused.shape[2];
  if (e >= E)
    return invalid_argument("'" + weight_name + "': expert " + std::to_string(e) + " is outside '" + blocks + "' (" +
                            std::to_string(E) + " experts)");
  if (proj != "down" && rows % 2 != 0)
    return invalid_argument("tensor '" + blocks + "' has " + std::to_string(rows) +
                            " rows: gate/up interleaving needs an even count");
  // Rows of this expert: all (down), even rows (gate), odd rows (up).
  const int64_t out_rows = proj == "down" ? rows : rows / 2;
  const int64_t row_bytes = k / 2, scale_cols = k / kMxBlock;
  GptOssSlice s;
  s.weight.precision = Precision::kMxfp4GptOss;
  s.weight.name = weight_name;
  s.weight.scale_name = fused.scale_name;
  s.weight.data = Tensor::empty(DType::kU8, {out_rows, row_bytes});
  s.weight.scale = Tensor::empty(DType::kU8, {out_rows, scale_cols});
  s.weight.shape = {out_rows, k};
  const auto* src = static_cast<const uint8_t*>(fused.data.raw()) + e * rows * row_bytes;
  const auto* ssrc = static_cast<const uint8_t*>(fused.scale.raw()) + e * rows * scale_cols;
  for (int64_t r = 0; r < out_rows; ++r) {
    const int64_t from = proj == "down" ? r : 2 * r + (proj == "up" ? 1 : 0);
    std::memcpy(s.weight.data.data<uint8_t>() + r * row_bytes, src + from * row_bytes, row_bytes);
    std::memcpy(s.weight.scale.data<uint8_t>() + r * scale_cols, ssrc + from * scale_cols, scale_cols);
  }
  s.consumed = {blocks, fused.scale_name};
  return std::optional<GptOssSlice>(std::move(s));
}

}  // namespace mxserve::quant
