// MappedFile: a read-only memory map of a whole file. Errors name the path and the failing call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace mxserve::io {

class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Reads a whole (small) text file, e.g. config.json.
Result<std::string> read_text_file(const std::string& path);

}  // namespace mxserve::io
