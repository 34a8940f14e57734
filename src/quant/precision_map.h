// The per-layer precision map of a checkpoint (what `mxserve inspect` prints): for every layer, the
// detected precision of each group of Linear weights (self_attn, mlp, mlp.gate, mlp.experts,
// mlp.shared_experts, eh_proj, ...), with counts. Scale tensors are folded into their weights; 1-D
// tensors (norms, biases) are left out. Detection errors are reported per tensor, not hidden.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "quant/detect.h"

namespace mxserve::quant {

struct GroupPrecision {
  std::string group;                    // "mlp.experts"
  std::map<std::string, int64_t> count;  // precision name -> number of weights
};

struct LayerPrecision {
  int64_t layer = -1;  // -1: outside model.layers (embeddings, lm_head)
  bool is_mtp = false;
  std::vector<GroupPrecision> groups;  // in first-seen (checkpoint name) order
};

struct PrecisionMap {
  std::vector<LayerPrecision> layers;  // global first, then by layer index
  std::vector<std::string> errors;     // "tensor 'X' ...": weights whose storage could not be read
};

// n_layers: num_hidden_layers (layers >= it are MTP layers), or -1 when unknown.
PrecisionMap precision_map(const io::Checkpoint& ckpt, int64_t n_layers, const DetectOptions& opts);
std::string format_precision_map(const PrecisionMap& map);

// The precision column for one tensor of a listing: "bf16", "mxfp4", "scale of X.weight", "error".
std::string tensor_precision_label(const io::Checkpoint& ckpt, const std::string& name, const DetectOptions& opts);

}  // namespace mxserve::quant
