#include "io/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

namespace mxserve::io {

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& path) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->path_ = path;
  if (!is_directory(path)) {
    MX_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(path));
    for (const auto& t : f->tensors()) ckpt->tensors_[t.name] = {&t, f.get()};
    ckpt->files_.push_back(std::move(f));
  } else {
    const std::string index_path = path + "/model.safetensors.index.json";
    const std::string single_path = path + "/model.safetensors";
    if (file_exists(index_path)) {
      MX_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
      auto index = nlohmann::json::parse(text, nullptr, false);
      if (index.is_discarded() || !index.is_object()) return data_loss(index_path + ": not a JSON object");
      auto wm = index.find("weight_map");
      if (wm == index.end() || !wm->is_object() || wm->empty())
        return data_loss(index_path + ": missing or empty object 'weight_map'");
      std::map<std::string, std::vector<std::string>> by_shard;
      for (auto it = wm->begin(); it != wm->end(); ++it) {
        if (!it.value().is_string())
          return data_loss(index_path + ": weight_map['" + it.key() + "'] is not a file name");
        const std::string shard = it.value().get<std::string>();
        if (shard.empty() || shard.find('/') != std::string::npos || shard.find("..") != std::string::npos)
          return data_loss(index_path + ": weight_map['" + it.key() + "'] = '" + shard +
                           "' is not a plain file name in the checkpoint directory");
        by_shard[shard].push_back(it.key());
      }
      for (const auto& [shard, names] : by_shard) {
        MX_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(path + "/" + shard));
        for (const auto& name : names) {
          const TensorInfo* info = f->find(name);
          if (info == nullptr)
            return data_loss(index_path + ": tensor '" + name + "' is mapped to " + shard + ", which does not hold it");
          ckpt->tensors_[name] = {info, f.get()};
        }
        for (const auto& t : f->tensors()) {
          auto listed = wm->find(t.name);
          if (listed == wm->end() || listed->get<std::string>() != shard)
            return data_loss(f->path() + ": tensor '" + t.name + "' is not mapped to this shard by " + index_path);
        }
        ckpt->files_.push_back(std::move(f));
      }
    } else if (file_exists(single_path)) {
      MX_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(single_path));
      for (const auto& t : f->tensors()) ckpt->tensors_[t.name] = {&t, f.get()};
      ckpt->files_.push_back(std::move(f));
    } else {
      return not_found(path + ": no model.safetensors.index.json or model.safetensors in this directory");
    }
  }
  for (const auto& [name, _] : ckpt->tensors_) ckpt->names_.push_back(name);
  std::sort(ckpt->names_.begin(), ckpt->names_.end());
  return ckpt;
}

const CheckpointTensor* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

uint64_t Checkpoint::tensor_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.info->end - t.info->begin;
  return n;
}

}  // namespace mxserve::io
