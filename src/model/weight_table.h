// The weight table: every tensor an architecture expects (name, expected shape, allowed precisions),
// and the binder that checks a checkpoint against it. The binder reports every problem at once --
// missing, unexpected and mismatched tensors, by name, with expected vs found -- never the first only.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/checkpoint.h"

namespace mxserve::model {

// Storage precision of one logical weight, detected from the tensors present (never guessed).
enum class Precision { kF32, kBF16, kF16 };
const char* precision_name(Precision p);

struct WeightSpec {
  std::string name;                  // HF on-disk name, e.g. "model.layers.3.mlp.gate.weight"
  Shape shape;                       // expected logical shape
  std::vector<Precision> allowed;    // precisions the engine can load for this tensor
  bool optional = false;             // may be absent (e.g. lm_head when tied)
};

struct BoundWeight {
  Tensor host;          // view into the mapped checkpoint
  Precision precision;
};

class BoundWeights {
 public:
  const BoundWeight* find(const std::string& name) const;
  const BoundWeight& at(const std::string& name) const;  // CHECKs presence (names come from the table)
  void add(const std::string& name, BoundWeight w) { map_[name] = std::move(w); }
  size_t size() const { return map_.size(); }

 private:
  std::unordered_map<std::string, BoundWeight> map_;
};

struct BindOptions {
  // Checkpoint tensors that are known and deliberately not used (e.g. the MTP layer's optional
  // shared_head.head / embed_tokens copies). Matched as exact names.
  std::vector<std::string> ignored;
  // Name prefixes that are ignored (e.g. the MTP layer when the config declares none).
  std::vector<std::string> ignored_prefixes;
};

// Checks every tensor; on success all non-optional specs are bound. Errors name checkpoint and tensors.
Result<BoundWeights> bind_weights(const io::Checkpoint& ckpt, const std::vector<WeightSpec>& table,
                                  const BindOptions& options);

// Precision of a single stored tensor, when it is a plain float tensor.
Result<Precision> detect_precision(DType stored_dtype, const std::string& tensor_name);

}  // namespace mxserve::model
