#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

namespace mxserve::io {
namespace {

using nlohmann::json;
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the safetensors format's own limit

std::string quote(const std::string& s) { return "'" + s + "'"; }

Status tensor_error(const std::string& file, const std::string& tensor, const std::string& what) {
  return data_loss(file + ": tensor " + quote(tensor) + ": " + what);
}

Result<uint64_t> read_u64(const json& v, const std::string& file, const std::string& tensor, const char* field) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return tensor_error(file, tensor, std::string(field) + " holds " + v.dump() + ", expected a non-negative integer");
}

Result<TensorInfo> parse_entry(const std::string& name, const json& entry, uint64_t data_len,
                               const std::string& file) {
  if (!entry.is_object()) return tensor_error(file, name, "entry is " + entry.dump() + ", expected an object");
  for (auto it = entry.begin(); it != entry.end(); ++it) {
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      return tensor_error(file, name, "unknown field " + quote(it.key()));
  }
  TensorInfo info;
  info.name = name;
  auto dt = entry.find("dtype");
  if (dt == entry.end() || !dt->is_string()) return tensor_error(file, name, "missing string field 'dtype'");
  auto parsed = dtype_from_safetensors(dt->get<std::string>());
  if (!parsed) return tensor_error(file, name, "unknown dtype " + quote(dt->get<std::string>()));
  info.dtype = *parsed;

  auto sh = entry.find("shape");
  if (sh == entry.end() || !sh->is_array()) return tensor_error(file, name, "missing array field 'shape'");
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : *sh) {
    MX_ASSIGN_OR_RETURN(uint64_t dim, read_u64(d, file, name, "shape"));
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
    if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 16 / dim) overflow = true;
    numel *= dim;
    info.shape.push_back(static_cast<int64_t>(dim));
  }
  if (overflow) return tensor_error(file, name, "shape " + sh->dump() + " overflows");

  auto off = entry.find("data_offsets");
  if (off == entry.end() || !off->is_array() || off->size() != 2)
    return tensor_error(file, name, "missing field 'data_offsets' [begin, end]");
  MX_ASSIGN_OR_RETURN(info.begin, read_u64((*off)[0], file, name, "data_offsets"));
  MX_ASSIGN_OR_RETURN(info.end, read_u64((*off)[1], file, name, "data_offsets"));
  if (info.begin > info.end)
    return tensor_error(file, name, "data_offsets [" + std::to_string(info.begin) + ", " +
                                        std::to_string(info.end) + "] end before begin");
  if (info.end > data_len)
    return tensor_error(file, name, "data_offsets end " + std::to_string(info.end) +
                                        " beyond the data section of " + std::to_string(data_len) + " bytes");
  auto bytes = dtype_bytes(info.dtype, numel);
  if (!bytes)
    return tensor_error(file, name, "shape " + shape_to_string(info.shape) + " has an odd number of " +
                                        dtype_name(info.dtype) + " elements (two per byte)");
  if (*bytes != info.end - info.begin)
    return tensor_error(file, name, "shape " + shape_to_string(info.shape) + " x " + dtype_name(info.dtype) +
                                        " needs " + std::to_string(*bytes) + " bytes, data_offsets give " +
                                        std::to_string(info.end - info.begin));
  return info;
}

}  // namespace

Result<std::vector<TensorInfo>> parse_safetensors_header(std::string_view header_json, uint64_t data_len,
                                                         const std::string& file,
                                                         std::map<std::string, std::string>* metadata) {
  json header = json::parse(header_json.begin(), header_json.end(), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return data_loss(file + ": header is not valid JSON");
  if (!header.is_object()) return data_loss(file + ": header is not a JSON object");
  std::vector<TensorInfo> tensors;
  tensors.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return data_loss(file + ": __metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string())
          return data_loss(file + ": __metadata__ value for " + quote(m.key()) + " is not a string");
        if (metadata) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    MX_ASSIGN_OR_RETURN(TensorInfo info, parse_entry(it.key(), it.value(), data_len, file));
    tensors.push_back(std::move(info));
  }
  // No two non-empty tensors may share bytes.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : tensors)
    if (t.end > t.begin) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      return data_loss(file + ": tensors " + quote(by_offset[i - 1]->name) + " and " + quote(by_offset[i]->name) +
                       " overlap (bytes " + std::to_string(by_offset[i]->begin) + ".." +
                       std::to_string(by_offset[i - 1]->end) + ")");
  }
  return tensors;
}

Result<std::vector<TensorInfo>> SafetensorsFile::validate_image(const uint8_t* data, uint64_t size,
                                                                const std::string& file,
                                                                std::map<std::string, std::string>* metadata) {
  if (size < 8)
    return data_loss(file + ": " + std::to_string(size) +
                     " bytes; a safetensors file starts with an 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];  // little-endian u64
  if (n > kMaxHeaderBytes)
    return data_loss(file + ": header length " + std::to_string(n) + " exceeds the 100 MiB limit");
  if (n > size - 8)
    return data_loss(file + ": header length " + std::to_string(n) + " runs past the end of the file (" +
                     std::to_string(size) + " bytes): truncated or not a safetensors file");
  if (n == 0 || data[8] != '{') return data_loss(file + ": header does not start with '{'");
  std::string_view header(reinterpret_cast<const char*>(data + 8), n);
  return parse_safetensors_header(header, size - 8 - n, file, metadata);
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  MX_ASSIGN_OR_RETURN(auto mapped, MappedFile::open(path));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  MX_ASSIGN_OR_RETURN(f->tensors_, validate_image(mapped->data(), mapped->size(), path, &f->metadata_));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | mapped->data()[i];
  f->data_start_ = 8 + n;
  f->file_ = std::move(mapped);
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_[f->tensors_[i].name] = i;
  return f;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Tensor SafetensorsFile::view(const TensorInfo& info) const {
  void* p = const_cast<uint8_t*>(file_->data() + data_start_ + info.begin);
  return Tensor::view_of(p, info.dtype, info.shape);
}

}  // namespace mxserve::io
