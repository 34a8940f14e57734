#include "quant/stream_writer.h"

#include <nlohmann/json.hpp>

namespace mxserve::quant {

uint64_t PlannedTensor::bytes() const { return dtype_bytes(dtype, static_cast<uint64_t>(shape_numel(shape))).value_or(0); }

Result<std::unique_ptr<SafetensorsStreamWriter>> SafetensorsStreamWriter::create(
    const std::string& path, std::vector<PlannedTensor> plan, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : plan) {
    header[t.name] = {{"dtype", dtype_safetensors_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  std::string json = header.dump();
  while ((8 + json.size()) % 8 != 0) json.push_back(' ');
  std::unique_ptr<SafetensorsStreamWriter> w(new SafetensorsStreamWriter());
  w->path_ = path;
  w->plan_ = std::move(plan);
  w->file_ = std::fopen(path.c_str(), "wb");
  if (w->file_ == nullptr) return internal_error(path + ": cannot open for writing");
  unsigned char len[8];
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
  if (std::fwrite(len, 1, 8, w->file_) != 8 || std::fwrite(json.data(), 1, json.size(), w->file_) != json.size())
    return internal_error(path + ": write failed");
  return w;
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

Status SafetensorsStreamWriter::append(const std::string& name, const Tensor& t) {
  if (next_ >= plan_.size()) return internal_error(path_ + ": tensor '" + name + "' appended after the planned ones");
  const PlannedTensor& p = plan_[next_];
  if (p.name != name || p.dtype != t.dtype() || p.shape != t.shape() || !t.is_contiguous() ||
      t.device().type != DeviceType::kCPU)
    return internal_error(path_ + ": appended '" + name + "' " + t.describe() + ", planned '" + p.name + "' " +
                          dtype_name(p.dtype) + shape_to_string(p.shape));
  if (std::fwrite(t.raw(), 1, t.nbytes(), file_) != t.nbytes()) return internal_error(path_ + ": write failed");
  ++next_;
  return Status::ok();
}

Status SafetensorsStreamWriter::finish() {
  if (next_ != plan_.size())
    return internal_error(path_ + ": " + std::to_string(plan_.size() - next_) + " planned tensors were not written");
  const bool ok = std::fclose(file_) == 0;
  file_ = nullptr;
  return ok ? Status::ok() : internal_error(path_ + ": close failed");
}

}  // namespace mxserve::quant
