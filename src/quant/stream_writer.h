// SafetensorsStreamWriter: writes one .safetensors file whose tensor list is known up front, one tensor
// at a time, so a quantizer never holds more than the tensor in hand. The header (8-byte aligned, like
// io/safetensors_writer) is written at create(); append() must then supply exactly the planned tensors,
// in order, with the planned dtype and shape; finish() checks that all were written.
#pragma once

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace mxserve::quant {

struct PlannedTensor {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t bytes() const;
};

class SafetensorsStreamWriter {
 public:
  static Result<std::unique_ptr<SafetensorsStreamWriter>> create(const std::string& path,
                                                                 std::vector<PlannedTensor> plan,
                                                                 const std::map<std::string, std::string>& metadata);
  ~SafetensorsStreamWriter();
  // t: host, contiguous, matching plan[next] (checked: a mismatch is a bug in the caller, reported).
  Status append(const std::string& name, const Tensor& t);
  Status finish();

 private:
  SafetensorsStreamWriter() = default;
  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<PlannedTensor> plan_;
  size_t next_ = 0;
};

}  // namespace mxserve::quant
