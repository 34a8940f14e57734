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
    MX_CHECK_MSG(slice->held, w.name << ": " << rank_.describe()
                                     << " does not hold this expert (load routed experts through experts())");
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

// Expert parallel (ep > 1): only the experts this rank holds -- a contiguous range, whole (parallel/shard.h)
// -- are declared and loaded; the result records where that range sits among the layer's experts.
backend::ExpertWeights WeightLoader::experts(const ExpertDecls& decls) {
  const auto& gate_up_groups = decls.gate_up;
  const auto& down = decls.down;
  MX_CHECK(gate_up_groups.size() == down.size() && !down.empty());
  const int64_t n_global = static_cast<int64_t>(down.size());
  std::vector<std::vector<std::string>> gu_names;
  std::vector<std::string> down_names;
  int64_t first = -1;
  bool load = true;
  for (int64_t e = 0; e < n_global; ++e) {
    if (!recorder_ && rank_.ep > 1) {
      auto slice = shard_slice_of(down[e], rank_);
      MX_CHECK_MSG(slice.is_ok(), "loading " << rank_.describe() << ": " << slice.status().to_string());
      if (!slice->held) continue;
      MX_CHECK_MSG(first < 0 || first + static_cast<int64_t>(down_names.size()) == e,
                   down[e].name << ": the experts of " << rank_.describe() << " are not contiguous");
      if (first < 0) first = e;
    }
    gu_names.emplace_back();
    for (const WeightSpec& w : gate_up_groups[e]) {
      load = declare(w) && load;
      gu_names.back().push_back(w.name);
    }
    load = declare(down[e]) && load;
    down_names.push_back(down[e].name);
  }
  if (!load) return backend::ExpertWeights{};
  MX_CHECK_MSG(!down_names.empty(), down.front().name << ": " << rank_.describe() << " holds none of the "
                                                      << n_global << " experts");
  backend::ExpertWeights ex = experts(gu_names, down_names);
  if (first >= 0) {
    ex.first_expert = first;
    ex.global_experts = n_global;
  }
  return ex;
}

Tensor WeightLoader::columns(const WeightSpec& w, int64_t begin, int64_t end) {
  return declare(w) ? columns(w.name, begin, end) : Tensor();
}

}  // namespace mxserve::model
