// Checkpoint: every tensor of a Hugging Face checkpoint directory, single-file or sharded
// (model.safetensors.index.json). Owns the mapped shards; hands out host views by tensor name.
// Invariant after open(): every tensor the index names exists in the shard it names, no tensor name
// appears twice, and every shard tensor is listed by the index.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "io/safetensors.h"

namespace mxserve::io {

struct CheckpointTensor {
  const TensorInfo* info;
  const SafetensorsFile* file;
};

class Checkpoint {
 public:
  // path: a directory (model.safetensors.index.json or model.safetensors) or one .safetensors file.
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& path);

  const std::vector<std::string>& names() const { return names_; }  // sorted
  const CheckpointTensor* find(const std::string& name) const;
  Tensor view(const CheckpointTensor& t) const { return t.file->view(*t.info); }
  const std::string& path() const { return path_; }
  size_t num_files() const { return files_.size(); }
  // Bytes of every tensor's data (the checkpoint's weights, headers excluded).
  uint64_t tensor_bytes() const;

 private:
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, CheckpointTensor> tensors_;
  std::vector<std::string> names_;
};

bool is_directory(const std::string& path);
bool file_exists(const std::string& path);

}  // namespace mxserve::io
