#include "quant/weight_format.h"

#include "core/check.h"
#include "quant/fp8.h"
#include "quant/host_float.h"
#include "quant/mxfp4.h"

namespace mxserve::quant {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kF32: return "f32";
    case Precision::kBF16: return "bf16";
    case Precision::kF16: return "f16";
    case Precision::kMxfp4: return "mxfp4";
    case Precision::kFp8Block: return "fp8-block";
    case Precision::kFp8Tensor: return "fp8-tensor";
    case Precision::kFp8Channel: return "fp8-channel";
    case Precision::kMxfp4GptOss: return "mxfp4-gptoss";
  }
  return "?";
}

bool is_float(Precision p) { return p == Precision::kF32 || p == Precision::kBF16 || p == Precision::kF16; }
bool is_quantized(Precision p) { return !is_float(p); }

namespace {
std::string suffix_after_base(const std::string& name, const std::string& base) {
  return name.rfind(base, 0) == 0 ? name.substr(base.size()) : name;
}
std::string base_of(const std::string& name) {
  const std::string w = ".weight";
  if (name.size() > w.size() && name.compare(name.size() - w.size(), w.size(), w) == 0)
    return name.substr(0, name.size() - w.size());
  return name;
}
}  // namespace

std::string StoredWeight::describe() const {
  if (is_float(precision)) return std::string(precision_name(precision)) + " " + shape_to_string(data.shape());
  const std::string base = base_of(name);
  return std::string(precision_name(precision)) + " (" + suffix_after_base(name, base + ".") + " " +
         dtype_name(data.dtype()) + " " + shape_to_string(data.shape()) + " + " + suffix_after_base(scale_name, base + ".") +
         " " + dtype_name(scale.dtype()) + " " + shape_to_string(scale.shape()) + ")";
}

std::string expected_storage(Precision p, const Shape& s, int64_t br, int64_t bc) {
  if (is_float(p) || s.size() != 2) return std::string(precision_name(p)) + " " + shape_to_string(s);
  const int64_t out = s[0], in = s[1];
  switch (p) {
    case Precision::kMxfp4:
      return "mxfp4 (weight u8 " + shape_to_string({out, in / 2}) + " + weight_scale u8 " +
             shape_to_string({out, mx_scale_cols(in)}) + ")";
    case Precision::kFp8Block:
      return "fp8-block (weight fp8_e4m3 " + shape_to_string(s) + " + weight_scale_inv f32 " +
             shape_to_string({(out + br - 1) / br, (in + bc - 1) / bc}) + ")";
    case Precision::kFp8Tensor:
      return "fp8-tensor (weight fp8_e4m3 " + shape_to_string(s) + " + weight_scale f32 [1])";
    case Precision::kFp8Channel:
      return "fp8-channel (weight fp8_e4m3 " + shape_to_string(s) + " + weight_scale f32 " +
             shape_to_string({out, 1}) + ")";
    default: return std::string(precision_name(p)) + " " + shape_to_string(s);
  }
}

Tensor to_host_f32(const StoredWeight& w) {
  switch (w.precision) {
    case Precision::kF32:
    case Precision::kBF16:
    case Precision::kF16: {
      Tensor out = Tensor::empty(DType::kF32, w.data.shape());
      read_f32(w.data, 0, w.data.numel(), out.data<float>());
      return out;
    }
    case Precision::kMxfp4: return dequantize_mxfp4(w.data, w.scale, w.shape.back());
    case Precision::kMxfp4GptOss: {
      const int64_t k = w.shape.back(), rows = shape_numel(w.shape) / k;
      Tensor flat = dequantize_mxfp4(w.data.reshape({rows, k / 2}), w.scale.reshape({rows, k / kMxBlock}), k);
      return flat.reshape(w.shape);
    }
    case Precision::kFp8Block: return dequantize_fp8(w.data, w.scale, w.block_rows, w.block_cols);
    case Precision::kFp8Tensor:
    case Precision::kFp8Channel: return dequantize_fp8_rows(w.data, w.scale);
  }
  MX_CHECK_MSG(false, "unhandled precision");
  return {};
}

}  // namespace mxserve::quant
