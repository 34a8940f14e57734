// Weight declarations for architecture and layer code: one WeightSpec per weight, written where the weight
// is bound (WeightLoader's declaring overloads), with its logical shape, the precisions it may be stored
// in, its quantization role and how it splits over ranks (parallel/shard.h).
#pragma once

#include <string>
#include <vector>

#include "model/weight_table.h"

namespace mxserve::model::decl {

// Plain float storage only (norms, biases, embeddings, the router's correction bias).
inline const std::vector<Precision>& float_precisions() {
  static const std::vector<Precision> k = {Precision::kBF16, Precision::kF32, Precision::kF16};
  return k;
}
// Linear weights may be stored quantized; they are dequantized on the host at load (weight_loader.h).
inline const std::vector<Precision>& linear_precisions() {
  static const std::vector<Precision> k = {Precision::kBF16,      Precision::kF32,       Precision::kF16,
                                           Precision::kMxfp4,     Precision::kFp8Block,  Precision::kFp8Tensor,
                                           Precision::kFp8Channel};
  return k;
}
// Routed experts may also come from gpt-oss style fused *_blocks / *_scales tensors (quant/gpt_oss.h).
inline const std::vector<Precision>& expert_precisions() {
  static const std::vector<Precision> k = {Precision::kBF16,        Precision::kF32,       Precision::kF16,
                                           Precision::kMxfp4,       Precision::kFp8Block,  Precision::kFp8Tensor,
                                           Precision::kFp8Channel,  Precision::kMxfp4GptOss};
  return k;
}

// A float vector / table, replicated on every rank (norm weights, embeddings).
inline WeightSpec replicated(std::string name, Shape shape) {
  return {std::move(name), std::move(shape), float_precisions()};
}
// A vocabulary table [V, H]: split by rows (vocabulary-parallel) over tp.
inline WeightSpec vocab_rows(std::string name, int64_t vocab, int64_t d_model) {
  return {std::move(name), {vocab, d_model}, float_precisions(), false, WeightRole::kNone, parallel::ShardAxis::kRow};
}
// A bias of a projection: split with its projection's output rows (kRow) or replicated (kNone).
inline WeightSpec bias(std::string name, int64_t n, parallel::ShardAxis shard) {
  return {std::move(name), {n}, float_precisions(), false, WeightRole::kNone, shard};
}
// A Linear weight [out, in].
inline WeightSpec linear(std::string name, int64_t out, int64_t in, parallel::ShardAxis shard) {
  return {std::move(name), {out, in}, linear_precisions(), false, WeightRole::kLinear, shard};
}
// The router's gate weight [E, H] (never quantized by quantization_config; replicated).
inline WeightSpec router(std::string name, int64_t n_experts, int64_t in) {
  return {std::move(name), {n_experts, in}, linear_precisions(), false, WeightRole::kRouter};
}
// A Linear weight [out, in] whose output rows are `heads` whole heads (q/k/v): split by heads over tp,
// one head per rank when tp is a multiple of `heads` (KV heads replicated).
inline WeightSpec head_linear(std::string name, int64_t heads, int64_t head_dim, int64_t in) {
  WeightSpec w{std::move(name), {heads * head_dim, in}, linear_precisions(), false, WeightRole::kLinear,
               parallel::ShardAxis::kRow};
  w.shard_groups = heads;
  return w;
}
// The bias of a head_linear.
inline WeightSpec head_bias(std::string name, int64_t heads, int64_t head_dim) {
  WeightSpec w{std::move(name), {heads * head_dim}, float_precisions(), false, WeightRole::kNone,
               parallel::ShardAxis::kRow};
  w.shard_groups = heads;
  return w;
}
// One routed expert's Linear weight [out, in]: expert `e` of `n_experts`, owned whole by one ep rank (ep > 1),
// or tensor-sliced along `tp_axis` on every rank (ep == 1: gate/up kRow, down kColumn; kNone: an
// architecture without tensor parallelism, which the launch refuses to run at tp > 1).
inline WeightSpec expert_linear(std::string name, int64_t out, int64_t in, int64_t e, int64_t n_experts,
                                parallel::ShardAxis tp_axis = parallel::ShardAxis::kNone) {
  WeightSpec w{std::move(name),       {out, in}, expert_precisions(), false, WeightRole::kLinear,
               parallel::ShardAxis::kExpert, e, n_experts};
  w.expert_tp = tp_axis;
  return w;
}

}  // namespace mxserve::model::decl
