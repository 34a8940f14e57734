// The weight table: every tensor an architecture expects (name, expected logical shape, allowed
// precisions, quantization role), and the binder that checks a checkpoint against it. The binder reports
// every problem at once -- missing, unexpected and mismatched tensors, by name, with expected vs found --
// never the first only.
// Precision is detected per tensor from the tensors present (quant/detect.h: u8 weight + weight_scale is
// MXFP4, fp8_e4m3 + weight_scale_inv is FP8 block, ...), then checked against the table's allowed set and
// against quantization_config when there is one. Scale tensors are consumed with their weight.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/checkpoint.h"
#include "parallel/rank_layout.h"
#include "parallel/shard.h"
#include "quant/quant_config.h"
#include "quant/weight_format.h"

namespace mxserve::model {

// Storage precision of one logical weight, detected from the tensors present (never guessed).
using quant::Precision;
using quant::precision_name;
using quant::WeightRole;

struct WeightSpec {
  std::string name;                  // HF on-disk name, e.g. "model.layers.3.mlp.gate.weight"
  Shape shape;                       // expected logical shape ([out, in] even when stored packed)
  std::vector<Precision> allowed;    // precisions the engine can load for this tensor
  bool optional = false;             // may be absent (e.g. lm_head when tied)
  WeightRole role = WeightRole::kNone;  // what quantization_config says about it (Linear / router / never)
  parallel::ShardAxis shard = parallel::ShardAxis::kNone;  // how it splits over ranks (parallel/shard.h)
  int64_t expert = -1;     // kExpert: this tensor's expert index within its layer
  int64_t n_experts = 0;   // kExpert: the layer's routed experts
  // kExpert: the axis the weight is tensor-sliced along when experts are not partitioned (ep == 1, tp > 1).
  parallel::ShardAxis expert_tp = parallel::ShardAxis::kNone;
  int64_t shard_groups = 0;  // kRow: dim 0 is this many heads, split whole (replicated when tp > heads)
  bool moe_group = false;    // part of a MoE block (shared experts): sliced over the MoE group (parallel/shard.h)
};

// The part of `spec` the rank holds (parallel::shard_slice with every field of the spec).
Result<parallel::ShardSlice> shard_slice_of(const WeightSpec& spec, const parallel::RankLayout& rank);

// The table as one rank holds it: every spec's shape replaced by its local shard, and expert weights of
// other ep ranks dropped. A weight that does not split evenly is an error naming it. With one rank the
// table comes back unchanged.
Result<std::vector<WeightSpec>> shard_weight_table(const std::vector<WeightSpec>& table,
                                                   const parallel::RankLayout& rank);

struct BoundWeight {
  BoundWeight() = default;
  explicit BoundWeight(quant::StoredWeight s) : host(s.data), stored(std::move(s)) {}
  // A plain float host tensor (synthetic weights, tests): precision f32, bf16 or f16.
  BoundWeight(Tensor host, Precision p);

  Tensor host;                 // the stored data tensor (== stored.data; packed u8 for MXFP4)
  quant::StoredWeight stored;  // views into the mapped checkpoint (data + scale) and the precision
  Precision precision() const { return stored.precision; }
  const Shape& shape() const { return stored.shape; }  // logical
};

class BoundWeights {
 public:
  const BoundWeight* find(const std::string& name) const;
  const BoundWeight& at(const std::string& name) const;  // CHECKs presence (names come from the table)
  void add(const std::string& name, BoundWeight w) { map_[name] = std::move(w); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, w] : map_) out.push_back(n);
    return out;
  }
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
  // config.json's quantization_config: every Linear weight's detected precision must agree with it.
  std::optional<quant::QuantizationConfig> quant;
};

// Checks every tensor; on success all non-optional specs are bound. Errors name checkpoint and tensors.
Result<BoundWeights> bind_weights(const io::Checkpoint& ckpt, const std::vector<WeightSpec>& table,
                                  const BindOptions& options);

}  // namespace mxserve::model
