// WeightLoader: moves bound checkpoint tensors onto a backend in the layouts the kernels want
// (fused gate|up rows, experts stacked to [E, ...], column slices). Names come from the weight table.
// Quantized weights (MXFP4, FP8) are dequantized on the host to f32 here, one tensor at a time, and then
// handed to Backend::copy_weight like any float weight -- except the routed experts of an MXFP4 checkpoint
// on a backend that runs them packed (Backend::supports_expert_format(kMxfp4), the CUDA backend): experts()
// keeps their E2M1 codes + E8M0 scales as stacked u8 tensors (backend::ExpertWeights) for the fused MXFP4
// MoE kernels. NOTE: every other quantized weight (FP8 projections, MXFP4 non-expert linears) still costs
// full-precision device memory; widths that are not multiples of 32 fall back to dequantized experts with
// a warning naming the tensor.
// Synthetic source (model/synthetic_weights.h): the same calls generate every tensor on the backend
// (Backend::fill_synthetic) instead of copying a host tensor -- no host image of the model; helpers
// named synthetic_* hold that branch.
// Declarations: architecture code calls the overloads taking a WeightSpec (name, shape, precisions, shard
// axis written once, where the weight is bound). A recording loader (WeightLoader::recording()) runs the
// same load code without loading anything and returns the specs in call order: that is the weight
// table the binder, the synthetic source and the parameter accounting use (weight_loader_declare.cpp).
// Ranks: a loader loads for one rank (set_rank; default the single rank). Each declared weight is sliced per
// its shard axis (parallel/shard.h, WeightSpec) as it is read: the returned tensors have the rank's local
// shapes (weight_loader_shard.cpp). Expert parallel (ep > 1): experts() loads only the rank's experts, whole.
// Rank-sliced reading: bound weights are views of the mapped checkpoint (fused HF expert stacks included),
// and a sliced float weight is copied out of the mapping as its byte ranges only (a row shard: one contiguous
// range; a column shard: each row's window; pread from the file, io/mapped_read.h), so the host memory a rank
// touches is its share. stats()
// counts it: bytes read from the checkpoint vs the stored bytes of the rank's share (a quantized weight that
// is sliced is still dequantized whole, and counted whole: NOTE below), and the bytes put on the backend.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "model/synthetic_weights.h"
#include "model/weight_table.h"
#include "parallel/communicator.h"

namespace mxserve::parallel {
class FusedAddNorm;
}  // namespace mxserve::parallel

namespace mxserve::model {

class WeightLoader {
 public:
  // A loader that records declarations and loads nothing: its tensors are empty placeholders.
  static WeightLoader recording();
  WeightLoader(WeightLoader&&) = default;
  bool is_recording() const { return recorder_ != nullptr; }
  // The declarations recorded so far (first declaration of each name, in call order); recording loaders only.
  const std::vector<WeightSpec>& recorded() const;
  // A weight a checkpoint may carry and the model does not load (a tied lm_head copy): declared optional,
  // so the binder checks it when present and does not miss it when absent.
  void declare_unused(WeightSpec w);
  // Checkpoint tensors the architecture knows and deliberately leaves unused (exact names / prefixes).
  void ignore(const std::string& name);
  void ignore_prefix(const std::string& prefix);
  const std::vector<std::string>& ignored() const { return ignored_; }
  const std::vector<std::string>& ignored_prefixes() const { return ignored_prefixes_; }

  // The rank this loader loads for, and the communicator of its tp group (nullptr: a world of one), which
  // the model built from this loader uses at its parallel seams; moe_comm: under DP attention the world its
  // MoE blocks exchange tokens over (model/layers/dp_moe.h). Call before the first weight.
  void set_rank(const parallel::RankLayout& rank, parallel::Communicator* comm,
                parallel::Communicator* moe_comm = nullptr) {
    rank_ = rank;
    comm_ = comm;
    moe_comm_ = moe_comm;
  }
  const parallel::RankLayout& rank() const { return rank_; }
  // Whether routed experts are tensor-sliced on this rank (tp > 1 without expert parallelism); else each
  // expert this rank holds is whole (and an MXFP4 one may stay packed).
  bool experts_sliced() const { return rank_.tp > 1 && rank_.ep == 1; }
  parallel::Communicator* communicator() const { return comm_; }

  // What this loader read (checkpoint sources; a synthetic loader counts backend_bytes only; a recording loader nothing).
  struct LoadStats {
    uint64_t bytes_read = 0;      // checkpoint bytes copied / dequantized out of the mapping
    uint64_t bytes_share = 0;     // stored bytes of this rank's share of the weights it loaded
    uint64_t backend_bytes = 0;   // bytes of the tensors it allocated on the backend (weights)
    int64_t tensors = 0;          // checkpoint tensors (logical weights) read
  };
  const LoadStats& stats() const { return stats_; }
  parallel::Communicator* moe_communicator() const { return moe_comm_; }
  // The fused all-reduce + add + RMSNorm of this rank's tp group (nullptr: the three steps separately).
  void set_fused_add_norm(parallel::FusedAddNorm* f) { fused_add_norm_ = f; }
  parallel::FusedAddNorm* fused_add_norm() const { return fused_add_norm_; }

  // ---- declaring overloads (architecture code): same as the name-based calls below ----
  Tensor get(const WeightSpec& w);
  Tensor get_f32(const WeightSpec& w);
  Tensor concat_rows(const std::vector<WeightSpec>& parts);
  struct ExpertDecls {  // one struct, so a braced list of names never converts to it
    std::vector<std::vector<WeightSpec>> gate_up;  // gate_up[e] = {gate_proj, up_proj} of expert e
    std::vector<WeightSpec> down;                  // down[e] = down_proj of expert e
  };
  backend::ExpertWeights experts(const ExpertDecls& decls);
  Tensor columns(const WeightSpec& w, int64_t begin, int64_t end);
  // The rank's rows of w [rows, cols] followed by one zero row: [rows + 1, cols] (a vocabulary-parallel
  // embedding looks ids of other ranks up as that zero row).
  Tensor rows_and_zero_row(const WeightSpec& w);

  // ---- name-based calls (the mechanics; tests and the declaring overloads use them) ----
  WeightLoader(backend::Backend& be, const BoundWeights& weights) : be_(be), weights_(weights) {}
  WeightLoader(std::shared_ptr<backend::Backend> owned, const BoundWeights& weights)
      : owned_be_(std::move(owned)), be_(*owned_be_), weights_(weights) {}
  // Synthetic weights generated on the backend (no checkpoint tensors); `synthetic` must outlive the loader.
  WeightLoader(backend::Backend& be, const SyntheticSource& synthetic)
      : be_(be), weights_(no_weights()), synthetic_(&synthetic) {}

  // One tensor in the backend's weight dtype.
  Tensor get(const std::string& name);
  // One tensor kept in f32 on every backend (e_score_correction_bias).
  Tensor get_f32(const std::string& name);
  // Tensors of equal trailing shape concatenated along dim 0: [sum rows, cols].
  Tensor concat_rows(const std::vector<std::string>& names);
  // Per-expert groups: group g (concatenated along rows) becomes slice g of a [G, rows, cols] tensor.
  Tensor stack(const std::vector<std::vector<std::string>>& groups);
  // The routed experts of one MoE layer: gate_up_groups[e] = {gate_proj, up_proj} names of expert e,
  // down_names[e] = its down_proj. Stored in the backend's float weight dtype, or kept as MXFP4 when the
  // checkpoint (or synthetic plan) stores them so and the backend runs that format
  // (Backend::supports_expert_format); see backend::ExpertWeights for the layouts.
  backend::ExpertWeights experts(const std::vector<std::vector<std::string>>& gate_up_groups,
                                 const std::vector<std::string>& down_names);
  // Columns [begin, end) of a 2-D tensor: [rows, end - begin].
  Tensor columns(const std::string& name, int64_t begin, int64_t end);
  bool has(const std::string& name) const {
    return synthetic_ ? synthetic_->shapes.count(name) > 0 : weights_.find(name) != nullptr;
  }
  backend::Backend& backend() { return be_; }

 private:
  // The weight as a host float tensor of its (rank-local) shape: a view for whole float weights, a
  // dequantized f32 copy for quantized ones, a copy of the rank's slice for sharded ones.
  // Counts the bytes read (stats_).
  Tensor host_float(const std::string& name);
  // be_.alloc, counted in stats_.backend_bytes.
  Tensor alloc_counted(DType dtype, Shape shape);
  // ---- rank slicing (weight_loader_shard.cpp) ----
  // The rank's slice of a declared weight, when it holds less than the whole tensor.
  const parallel::ShardSlice* slice_of(const std::string& name) const;
  Shape local_shape(const std::string& name) const;  // checkpoint weights
  static Tensor copy_slice(const Tensor& host, const parallel::ShardSlice& slice);
  // A quantized weight's slice as a stored weight of the local shape (packed data + scale byte ranges only),
  // when the slice falls on the format's blocks; nullopt otherwise (then it is dequantized whole).
  static std::optional<quant::StoredWeight> slice_stored(const quant::StoredWeight& w,
                                                         const parallel::ShardSlice& slice);
  // Synthetic weights: generates the rank's slice of `name` (whole rows or whole columns) into dst.
  void synthetic_fill_slice(const std::string& name, const parallel::ShardSlice& slice, Tensor& dst);
  // The generator window of the rank's slice of `name` (rows: whole rows at an offset; columns: a window).
  kernels::SyntheticFill synthetic_slice_params(const std::string& name, const parallel::ShardSlice& slice) const;
  // Packed MXFP4 codes [rows, cols/2] + scales [rows, cols/32] of `name` (the rank's slice when it holds one;
  // the slice must fall on 32-element blocks, else an error naming the weight and the flag).
  void synthetic_fill_mxfp4(const std::string& name, Tensor& codes, Tensor& scales);

  // ---- synthetic branch (weight_loader_synthetic.cpp) ----
  Shape synthetic_shape(const std::string& name) const;
  // Generates columns [begin, end) of tensor `name` into dst [rows, end - begin] in dst's dtype, per the plan.
  void synthetic_fill(const std::string& name, Tensor& dst, int64_t begin, int64_t end);
  Tensor synthetic_get(const std::string& name, DType dtype);
  Tensor synthetic_stack(const std::vector<std::vector<std::string>>& groups);
  backend::ExpertWeights synthetic_experts(const std::vector<std::vector<std::string>>& gate_up_groups,
                                           const std::vector<std::string>& down_names);

  static const BoundWeights& no_weights() {
    static const BoundWeights empty;
    return empty;
  }

  struct Recorder;
  // Records w (recording loaders: false = load nothing) or checks it names a weight (others: true).
  bool declare(const WeightSpec& w);

  std::shared_ptr<backend::Backend> owned_be_;  // recording loaders: a CPU backend nothing is loaded onto
  backend::Backend& be_;
  const BoundWeights& weights_;
  const SyntheticSource* synthetic_ = nullptr;  // set: every tensor is generated (synthetic_* helpers)
  std::shared_ptr<Recorder> recorder_;          // set: a recording loader
  std::vector<std::string> ignored_, ignored_prefixes_;
  parallel::RankLayout rank_;
  parallel::Communicator* comm_ = nullptr;
  parallel::Communicator* moe_comm_ = nullptr;
  parallel::FusedAddNorm* fused_add_norm_ = nullptr;
  std::unordered_map<std::string, parallel::ShardSlice> slices_;  // declared weights this rank holds part of
  LoadStats stats_;
  bool warned_whole_dequant_ = false;
  bool warned_sliced_dequant_ = false;  // MXFP4 expert slices dequantized (MXSERVE_PACKED_EXPERT_SLICES off)
};

}  // namespace mxserve::model
