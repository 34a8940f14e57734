#include "io/safetensors_writer.h"

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace mxserve::io {

std::string safetensors_image(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    MX_CHECK_MSG(t.device().type == DeviceType::kCPU && t.is_contiguous(), name << " is not a host contiguous tensor");
    header[name] = {{"dtype", dtype_safetensors_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string json = header.dump();
  while ((8 + json.size()) % 8 != 0) json.push_back(' ');
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += json;
  for (const auto& [name, t] : tensors) out.append(static_cast<const char*>(t.raw()), t.nbytes());
  return out;
}

Status write_safetensors(const std::string& path, const NamedTensors& tensors,
                         const std::map<std::string, std::string>& metadata) {
  const std::string image = safetensors_image(tensors, metadata);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return internal_error(path + ": cannot open for writing");
  out.write(image.data(), static_cast<std::streamsize>(image.size()));
  if (!out) return internal_error(path + ": write failed");
  return Status::ok();
}

}  // namespace mxserve::io
