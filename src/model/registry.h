// The architecture registry: the one table where an HF `architectures` string becomes code. Each
// architecture is one registered unit (model/archs/<arch>.cpp): its config extension, its construction --
// which is also its weight declaration (run against WeightLoader::recording() it yields the weight table:
// names, shapes, precisions, shard axes) -- and, through the model it builds, its KV cache layout
// (CausalLM::kv_spec), what it supports (Capabilities: the launch checks them instead of naming
// architectures) and the cost model of its attention (bench-model). Parameter / byte accounting is derived
// from the declared weights (weight_stats.h). Loading is one path over this table (causal_lm.cpp): nothing
// else switches on an architecture.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "model/layer_cost.h"

namespace mxserve::backend {
class Backend;
}

namespace mxserve::model {

struct ModelConfig;
class CausalLM;
class WeightLoader;

struct ArchitectureDef {
  const char* hf_name = "";     // config.json "architectures"[0]
  const char* model_type = "";  // config.json "model_type"
  // transformers' default when config.json gives no partial_rotary_factor.
  double default_partial_rotary_factor = 1.0;
  // Typed config extension: reads this architecture's own fields from the whole config.json object after
  // the common ones (model/config.cpp), e.g. into a struct held by ModelConfig::extension. May be null.
  Status (*parse_config)(const nlohmann::json& json, ModelConfig& cfg) = nullptr;
  // Construction = weight declaration: binds every weight through wl's declaring overloads (and names the
  // checkpoint tensors it deliberately leaves unused through wl.ignore*). Never null.
  Result<std::unique_ptr<CausalLM>> (*build)(const ModelConfig& cfg, WeightLoader& wl, backend::Backend& be,
                                             bool include_mtp) = nullptr;
  // What the launch may ask of the model it builds (launch/launch.cpp refuses the rest, naming the flag and
  // the architectures that have it). CUDA graphs, an FP8 KV cache and MTP are probed on the built model
  // instead (CausalLM::forward_device, set_kv_cache_dtype, has_mtp).
  struct Capabilities {
    bool tensor_parallel = false;  // its forward runs the tp group's collectives (--tensor-parallel-size)
    bool expert_parallel = false;  // its MoE blocks sum partial outputs of E / ep whole experts (--ep-size)
    bool dp_attention = false;     // its MoE blocks run the DP-attention token exchange (--enable-dp-attention)
  } capabilities;
  // The bytes / FLOPs of one layer's attention part (bench-model). May be null: bench-model refuses.
  AttentionCost (*attention_cost)(const ModelConfig& cfg, const CostUnits& units) = nullptr;
};

// Every registered architecture (registry.cpp holds the list: one line per model/archs/<arch>.cpp).
const std::vector<const ArchitectureDef*>& architectures();
// The entry for an HF name; the error names the source file and lists the supported names.
Result<const ArchitectureDef*> find_architecture(const std::string& hf_name, const std::string& source);
// The HF names of the registered architectures with a capability, in registry order ("A and B", "A, B and C").
std::string architectures_with(bool ArchitectureDef::Capabilities::*capability);

}  // namespace mxserve::model
