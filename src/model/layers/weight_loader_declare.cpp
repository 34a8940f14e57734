// WeightLoader's declaring overloads and the recording loader (weight_loader.h). A recording loader runs an
// architecture's load code and keeps every WeightSpec it is handed -- the weight table -- without reading,
// generating or allocating anything; the other loaders check that the declared name is the one loaded and
// forward to the name-based calls.
// Invariant: a name declared twice (eh_proj split into two column ranges) is recorded once, and both
// declarations must agree on shape (a disagreement is a bug in the architecture code: CHECK).
#include <unordered_map>

#include "core/check.h"
#include "model/layers/weight_loader.h"

namespace mxserve::model {

struct WeightLoader::Recorder {
  std::vector<WeightSpec> specs;
  std::unordered_map<std::string, size_t> index;  // name -> position in specs
};

WeightLoader WeightLoader::recording() {
  WeightLoader wl(std::shared_ptr<backend::Backend>(backend::make_cpu_backend()), no_weights());
  wl.recorder_ = std::make_shared<Recorder>();
  return wl;
}

const std::vector<WeightSpec>& WeightLoader::recorded() const {
  MX_CHECK_MSG(recorder_ != nullptr, "WeightLoader::recorded() on a loader that does not record");
  return recorder_->specs;
}

void WeightLoader::declare_unused(WeightSpec w) {
  w.optional = true;
  declare(w);
}

void WeightLoader::ignore(const std::string& name) { ignored_.push_back(name); }
void WeightLoader::ignore_prefix(const std::string& prefix) { ignored_prefixes_.push_back(prefix); }

bool WeightLoader::declare(const WeightSpec& w) {
  if (!recorder_) {
    if (rank_.world() == 1) return true;
    // The launch sharded the whole table before loading (an uneven split was reported there): a failure
    // here is a bug in the declaration.
    auto slice = shard_slice_of(w, rank_);
    MX_CHECK_MSG(slice.is_ok(), "loading " << rank_.describe() << ": " << slice.status().to_string());
    MX_CHECK_MSG(slice->held, w.name << ": expert-parallel loading (ep > 1) is not implemented yet");
    if (slice->dim >= 0) slices_[w.name] = *slice;
    return true;
  }
  auto [it, inserted] = recorder_->index.emplace(w.name, recorder_->specs.size());
  if (inserted) {
    recorder_->specs.push_back(w);
  } else {
    MX_CHECK_MSG(recorder_->specs[it->second].shape == w.shape,
                 "weight " << w.name << " declared twice with shapes " << shape_to_string(recorder_->specs[it->second].shape)
                           << " and " << shape_to_string(w.shape));
  }
  return false;
}

Tensor WeightLoader::get(const WeightSpec& w) { return declare(w) ? get(w.name) : Tensor(); }

Tensor WeightLoader::get_f32(const WeightSpec& w) { return declare(w) ? get_f32(w.name) : Tensor(); }

Tensor WeightLoader::concat_rows(const std::vector<WeightSpec>& parts) {
  std::vector<std::string> names;
  bool load = true;
  for (const WeightSpec& w : parts) {
    load = declare(w) && load;
    names.push_back(w.name);
  }
  return load ? concat_rows(names) : Tensor();
}

backend::ExpertWeights WeightLoader::experts(const ExpertDecls& decls) {
  const auto& gate_up_groups = decls.gate_up;
  const auto& down = decls.down;
  std::vector<std::vector<std::string>> gu_names;
  std::vector<std::string> down_names;
  bool load = true;
  for (const auto& group : gate_up_groups) {
    gu_names.emplace_back();
    for (const WeightSpec& w : group) {
      load = declare(w) && load;
      gu_names.back().push_back(w.name);
    }
  }
  for (const WeightSpec& w : down) {
    load = declare(w) && load;
    down_names.push_back(w.name);
  }
  return load ? experts(gu_names, down_names) : backend::ExpertWeights{};
}

Tensor WeightLoader::columns(const WeightSpec& w, int64_t begin, int64_t end) {
  return declare(w) ? columns(w.name, begin, end) : Tensor();
}

}  // namespace mxserve::model
