// SafetensorsFile: one memory-mapped .safetensors file, validated completely at open.
// Checks: header length within the file, JSON object header, known dtypes, non-negative shapes without
// overflow, data_offsets in bounds, shape x dtype size == byte length, no two tensors overlapping.
// Every error names the file and, where one is involved, the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/mapped_file.h"

namespace mxserve::io {

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // byte offsets within the data section
  uint64_t end = 0;
};

// Parses and validates a header (the JSON text) against a data section of data_len bytes.
// Exposed separately so the fuzz test can drive it without files.
Result<std::vector<TensorInfo>> parse_safetensors_header(std::string_view header_json, uint64_t data_len,
                                                         const std::string& file_name,
                                                         std::map<std::string, std::string>* metadata);

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // Validates an in-memory image of a file (used by tests and the fuzzer).
  static Result<std::vector<TensorInfo>> validate_image(const uint8_t* data, uint64_t size,
                                                        const std::string& file_name,
                                                        std::map<std::string, std::string>* metadata = nullptr);

  const std::string& path() const { return file_->path(); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;
  // A non-owning host view of the tensor's bytes (valid while this file lives).
  Tensor view(const TensorInfo& info) const;

 private:
  std::unique_ptr<MappedFile> file_;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace mxserve::io
