// Precision detection (detect.h). FP8 block scales are accepted as the [ceil(out/br), ceil(in/bc)] grid or
// that grid with its size-1 dimensions dropped (how transformers' FineGrainedFP8 saves per-expert scales).
#include "quant/detect.h"

#include "quant/host_float.h"
#include "quant/mxfp4.h"

namespace mxserve::quant {
namespace {

std::string base_of(const std::string& name) {
  const std::string w = ".weight";
  if (name.size() > w.size() && name.compare(name.size() - w.size(), w.size(), w) == 0)
    return name.substr(0, name.size() - w.size());
  return name;
}

std::string desc(const io::TensorInfo& t) { return std::string(dtype_name(t.dtype)) + " " + shape_to_string(t.shape); }

// The shape without its size-1 dimensions (torch's squeeze()).
Shape squeeze(const Shape& shape) {
  Shape out;
  for (int64_t d : shape)
    if (d != 1) out.push_back(d);
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<std::string> scale_names_for(const std::string& weight_name) {
  const std::string base = base_of(weight_name);
  return {base + ".weight_scale", base + ".weight_scale_inv"};
}

Result<StoredWeight> detect_weight(const io::Checkpoint& ckpt, const std::string& name, const DetectOptions& opts) {
  const io::CheckpointTensor* t = ckpt.find(name);
  if (t == nullptr) return not_found(ckpt.path() + ": tensor '" + name + "' is missing");
  const io::TensorInfo& info = *t->info;
  const auto scale_names = scale_names_for(name);
  const io::CheckpointTensor* mx_scale = ckpt.find(scale_names[0]);
  const io::CheckpointTensor* inv_scale = ckpt.find(scale_names[1]);
  StoredWeight w;
  w.name = name;
  w.data = ckpt.view(*t);

  if (is_plain_float(info.dtype)) {
    for (const auto* s : {mx_scale, inv_scale})
      if (s != nullptr)
        return invalid_argument("tensor '" + name + "' is " + desc(info) + " (unquantized) but its scale '" +
                                s->info->name + "' (" + desc(*s->info) + ") is present: a quantized weight " +
                                "must be stored packed (mxfp4: u8) or as fp8_e4m3");
    w.precision = info.dtype == DType::kF32 ? Precision::kF32 : info.dtype == DType::kBF16 ? Precision::kBF16
                                                                                            : Precision::kF16;
    w.shape = info.shape;
    return w;
  }

  if (info.dtype == DType::kU8) {
    if (mx_scale == nullptr)
      return invalid_argument("tensor '" + name + "' is " + desc(info) + " (a packed MXFP4 weight?) but its scale '" +
                              scale_names[0] + "' is missing");
    if (inv_scale != nullptr)
      return invalid_argument("tensor '" + name + "' has both '" + scale_names[0] + "' and '" + scale_names[1] +
                              "': ambiguous precision");
    const io::TensorInfo& s = *mx_scale->info;
    if (info.shape.size() != 2)
      return invalid_argument("tensor '" + name + "' is " + desc(info) + ": a packed MXFP4 weight must be 2-D [out, in/2]");
    const int64_t out = info.shape[0], k = 2 * info.shape[1];
    const Shape want_scale = {out, mx_scale_cols(k)};
    if (s.dtype != DType::kU8 && s.dtype != DType::kE8M0)
      return invalid_argument("tensor '" + s.name + "' (scale of MXFP4 weight '" + name + "') is " + desc(s) +
                              ", expected u8 or e8m0 " + shape_to_string(want_scale));
    if (s.shape != want_scale)
      return invalid_argument("tensor '" + s.name + "' (scale of MXFP4 weight '" + name + "' " + desc(info) +
                              ") has shape " + shape_to_string(s.shape) + ", expected " +
                              shape_to_string(want_scale) + " (one E8M0 scale per 32 input elements)");
    w.precision = Precision::kMxfp4;
    w.scale_name = s.name;
    w.scale = ckpt.view(*mx_scale);
    w.shape = {out, k};
    return w;
  }

  if (info.dtype == DType::kFP8E4M3) {
    if (info.shape.size() != 2)
      return invalid_argument("tensor '" + name + "' is " + desc(info) + ": an FP8 weight must be 2-D [out, in]");
    const int64_t out = info.shape[0], in = info.shape[1];
    w.shape = info.shape;
    if (inv_scale != nullptr && mx_scale != nullptr)
      return invalid_argument("tensor '" + name + "' has both '" + scale_names[0] + "' and '" + scale_names[1] +
                              "': ambiguous precision");
    if (inv_scale != nullptr) {
      const io::TensorInfo& s = *inv_scale->info;
      const int64_t br = opts.fp8_block_rows, bc = opts.fp8_block_cols;
      const Shape want = {(out + br - 1) / br, (in + bc - 1) / bc};
      // transformers' FineGrainedFP8 writes per-expert grids squeezed ([1, 2] as [2]); same element order.
      const bool squeezed = s.shape != want && s.shape == squeeze(want);
      if (s.dtype != DType::kF32 || (s.shape != want && !squeezed))
        return invalid_argument("tensor '" + s.name + "' (block scale of FP8 weight '" + name + "' " + desc(info) +
                                ") is " + desc(s) + ", expected f32 " + shape_to_string(want) + " (blocks of " +
                                std::to_string(br) + "x" + std::to_string(bc) +
                                " from quantization_config.weight_block_size, partial edge blocks included)");
      w.precision = Precision::kFp8Block;
      w.scale_name = s.name;
      w.scale = ckpt.view(*inv_scale).reshape(want);
      w.block_rows = br;
      w.block_cols = bc;
      return w;
    }
    if (mx_scale != nullptr) {
      const io::TensorInfo& s = *mx_scale->info;
      const bool per_tensor = shape_numel(s.shape) == 1 && s.shape.size() <= 1;
      const bool per_channel = s.shape == Shape{out, 1} || s.shape == Shape{out};
      if (!is_plain_float(s.dtype) || !(per_tensor || per_channel))
        return invalid_argument("tensor '" + s.name + "' (scale of FP8 weight '" + name + "' " + desc(info) + ") is " +
                                desc(s) + ", expected a float [1] (per tensor) or " + shape_to_string({out, 1}) +
                                " (per output channel)");
      w.precision = per_tensor ? Precision::kFp8Tensor : Precision::kFp8Channel;
      w.scale_name = s.name;
      w.scale = ckpt.view(*mx_scale);
      return w;
    }
    return invalid_argument("tensor '" + name + "' is " + desc(info) + " but neither its block scale '" +
                            scale_names[1] + "' nor a per-tensor '" + scale_names[0] + "' is present");
  }
  return invalid_argument("tensor '" + name + "' has dtype " + dtype_name(info.dtype) +
                          ", which is not a weight precision (f32, bf16, f16, mxfp4 u8 + weight_scale, fp8_e4m3 + scale)");
}

bool is_gpt_oss_blocks_name(const std::string& name) { return ends_with(name, "_blocks"); }

Result<StoredWeight> detect_gpt_oss_blocks(const io::Checkpoint& ckpt, const std::string& blocks_name) {
  const io::CheckpointTensor* t = ckpt.find(blocks_name);
  if (t == nullptr) return not_found(ckpt.path() + ": tensor '" + blocks_name + "' is missing");
  const io::TensorInfo& b = *t->info;
  const std::string scales_name = blocks_name.substr(0, blocks_name.size() - 7) + "_scales";
  const io::CheckpointTensor* st = ckpt.find(scales_name);
  if (b.dtype != DType::kU8 || b.shape.size() < 2 || b.shape.back() != 16)
    return invalid_argument("tensor '" + blocks_name + "' is " + desc(b) + ", expected u8 [..., in/32, 16] (gpt-oss MXFP4 blocks)");
  if (st == nullptr)
    return invalid_argument("tensor '" + blocks_name + "' is " + desc(b) + " (gpt-oss MXFP4 blocks) but its scales '" +
                            scales_name + "' are missing");
  Shape want(b.shape.begin(), b.shape.end() - 1);
  if ((st->info->dtype != DType::kU8 && st->info->dtype != DType::kE8M0) || st->info->shape != want)
    return invalid_argument("tensor '" + scales_name + "' (scales of '" + blocks_name + "') is " + desc(*st->info) +
                            ", expected u8 " + shape_to_string(want));
  StoredWeight w;
  w.precision = Precision::kMxfp4GptOss;
  w.name = blocks_name;
  w.data = ckpt.view(*t);
  w.scale_name = scales_name;
  w.scale = ckpt.view(*st);
  w.shape = want;
  w.shape.back() *= kMxBlock;
  return w;
}

}  // namespace mxserve::quant
