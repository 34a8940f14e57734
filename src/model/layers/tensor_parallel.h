// TensorParallel: the tensor-parallel pieces every architecture's forward shares (docs/parallel.md): the
// vocabulary-parallel embedding and lm_head (each rank holds vocabulary rows [r V/tp, (r+1) V/tp)), the
// all-reduce of a rank's partial sum, and the bitwise check that a decision every rank computes from
// replicated inputs (the DSA indexer's top-k) is the same on every rank; the all-reduce + residual add +
// RMSNorm seam (reduce_add_norm), fused into one kernel per rank where the launch gave a FusedAddNorm.
// Invariant: at tp == 1 (no communicator) every call is exactly the one-rank computation: no collective,
// no copy, the whole vocabulary.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/layers/weight_loader.h"
#include "parallel/communicator.h"
#include "parallel/fused_add_norm.h"

namespace mxserve::model {

class TensorParallel {
 public:
  // comm: the tensor-parallel group; used when rank.tp > 1, or in a one-rank world when given (the launch's
  // NCCL one-rank test switch: every collective runs as the identity). nullptr: one rank, no collective.
  TensorParallel(backend::Backend& be, const parallel::RankLayout& rank, parallel::Communicator* comm)
      : be_(be), rank_(rank), comm_(rank.tp > 1 || rank.world() == 1 ? comm : nullptr) {}

  bool active() const { return comm_ != nullptr; }
  bool splits() const { return rank_.tp > 1; }  // the weights are sliced over several ranks

  // Binds model.embed_tokens.weight and lm_head.weight (the embedding's rows when tie_word_embeddings; an
  // lm_head copy in a tied checkpoint is declared unused), this rank's vocabulary rows of each.
  void load_vocab(WeightLoader& wl, const ModelConfig& cfg);
  const Tensor& embedding() const { return embed_; }  // [V / tp, H]
  const Tensor& lm_head() const { return lm_head_; }  // [V / tp, H]

  // The batch's token ids on the backend, as rows of this rank's embedding table (other ranks' ids ->
  // the zero row at index V / tp).
  Tensor upload_ids(const ForwardBatch& batch) const;
  // x [T, H] = embedding rows of ids (from upload_ids, or device ids at tp 1), summed over the ranks.
  Status embed(const Tensor& ids, Tensor& x);
  // o holds this rank's partial sum (its heads / its slice of a width): sum it over the group.
  Status reduce_partial(Tensor& o) {
    return comm_ == nullptr ? Status::ok() : comm_->all_reduce(o, parallel::ReduceOp::kSum);
  }
  // The fused seam (parallel/fused_add_norm.h), used at tp > 1 only; nullptr: the three steps below.
  void set_fused_add_norm(parallel::FusedAddNorm* f) { fused_ = comm_ != nullptr && rank_.tp > 1 ? f : nullptr; }
  bool fused() const { return fused_ != nullptr; }
  // The fused calls of this step completed without a device-side failure (a no-op when not fused).
  Status check_fused() { return fused_ != nullptr ? fused_->check() : Status::ok(); }
  // o: this rank's partial sum (clobbered); x += o summed over the group; h = rmsnorm(x) * w. Fused: one call
  // (the residual rounded once from the f32 sum); else all-reduce, then add + RMSNorm (Backend::add_rmsnorm, the sum
  // rounded first).
  Status reduce_add_norm(Tensor& o, Tensor& x, const Tensor& w, float eps, Tensor& h) {
    if (fused_ != nullptr) return fused_->allreduce_add_rmsnorm(o, x, w, eps, h);
    MX_RETURN_IF_ERROR(reduce_partial(o));
    be_.add_rmsnorm(o, x, w, eps, h);  // one kernel where the backend fuses it (bit for bit add then rmsnorm)
    return Status::ok();
  }
  // Logits of batch.logit_rows of x_normed [T, H] (f32 [R, V], gathered along the vocabulary at tp > 1)
  // and, when batch.want_hidden, x_normed itself.
  Result<ForwardOutput> head(const ForwardBatch& batch, const Tensor& x_normed);

  // Device-input forms for CUDA graphs (forward_device): no host<->device copy, so capturable at any tp.
  // embed_device: ids i32 [T] (vocabulary ids on the device) -> x [T, H]; at tp > 1 each id is mapped to this
  // rank's row (or the zero row) by a device gather through vocab_map_, then summed over the ranks.
  Status embed_device(const Tensor& ids, Tensor& x);
  // logits f32 [T, V] = x_normed [T, H] x lm_head^T, gathered along the vocabulary at tp > 1 (T <=
  // kDeviceMaxRows there: the gathered rows are copied into `logits` through iota_).
  Status head_device(const Tensor& x_normed, Tensor& logits);
  static constexpr int64_t kDeviceMaxRows = 8192;

  // t (any shape, the same on every rank by construction) is compared bit for bit with every other rank's
  // copy; a difference fails every rank with an internal error naming `what`, the rank and the element.
  // tp 1: nothing to compare. Cost: an all-gather of t per call.
  Status check_replicated(const Tensor& t, const std::string& what);
  // Calls of check_replicated that compared tp > 1 copies and found them equal, process-wide (tests
  // assert the check ran).
  static int64_t replica_checks_passed() { return replica_checks_passed_.load(); }

 private:
  backend::Backend& be_;
  parallel::RankLayout rank_;
  parallel::Communicator* comm_;  // nullptr: one rank
  parallel::FusedAddNorm* fused_ = nullptr;
  int64_t vocab_ = 0, d_model_ = 0;
  Tensor embed_, lm_head_;  // this rank's vocabulary rows [V / tp, H]
  Tensor embed_lookup_;     // embed_, plus (tp > 1) a zero row at index V / tp for ids of other ranks
  Tensor vocab_map_;        // tp > 1: i32 [V, 1], id -> this rank's row of embed_lookup_ (other ranks' ids: V / tp)
  Tensor iota_;             // tp > 1: i32 [kDeviceMaxRows] = 0, 1, 2, ...
  static std::atomic<int64_t> replica_checks_passed_;
};

}  // namespace mxserve::model
