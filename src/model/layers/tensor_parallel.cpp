#include "model/layers/tensor_parallel.h"

#include <cstring>

#include "core/check.h"
#include "model/layers/weight_decl.h"

namespace mxserve::model {

std::atomic<int64_t> TensorParallel::replica_checks_passed_{0};

void TensorParallel::load_vocab(WeightLoader& wl, const ModelConfig& cfg) {
  vocab_ = cfg.vocab_size;
  d_model_ = cfg.d_model;
  const WeightSpec embed = decl::vocab_rows("model.embed_tokens.weight", vocab_, d_model_);
  if (comm_ != nullptr) {  // this rank's vocabulary rows + a zero row that other ranks' ids look up
    embed_lookup_ = wl.rows_and_zero_row(embed);
    if (embed_lookup_.defined() && embed_lookup_.ndim() == 2)
      embed_ = embed_lookup_.slice_rows(0, embed_lookup_.dim(0) - 1);
  } else {
    embed_ = wl.get(embed);
    embed_lookup_ = embed_;
  }
  // A tied checkpoint may still carry an lm_head copy (unused); an untied one must have it.
  const WeightSpec lm_head = decl::linear("lm_head.weight", vocab_, d_model_, parallel::ShardAxis::kRow);
  if (cfg.tie_word_embeddings) wl.declare_unused(lm_head);
  lm_head_ = cfg.tie_word_embeddings ? embed_ : wl.get(lm_head);
  // The device-input forward's tables (CUDA graphs at tp > 1; the CPU reference runs the same body in tests):
  // made here, since a graph body may not upload. V x 4 bytes.
  if (comm_ != nullptr && rank_.tp > 1 && embed_lookup_.defined()) {
    const int64_t part = vocab_ / rank_.tp, begin = rank_.tp_rank() * part;
    Tensor map = Tensor::empty(DType::kI32, {vocab_, 1});
    for (int64_t id = 0; id < vocab_; ++id)
      map.data<int32_t>()[id] = static_cast<int32_t>(id >= begin && id < begin + part ? id - begin : part);
    vocab_map_ = be_.upload(map);
    Tensor iota = Tensor::empty(DType::kI32, {kDeviceMaxRows});
    for (int64_t i = 0; i < kDeviceMaxRows; ++i) iota.data<int32_t>()[i] = static_cast<int32_t>(i);
    iota_ = be_.upload(iota);
  }
}

Status TensorParallel::embed_device(const Tensor& ids, Tensor& x) {
  if (!splits()) return embed(ids, x);
  if (!vocab_map_.defined())
    return unsupported("forward_device at tp > 1: no device vocabulary map (the model was not loaded for a rank)");
  const int64_t T = ids.numel();
  Tensor local = be_.alloc(DType::kI32, {T, 1});
  be_.gather_rows(vocab_map_, ids, local);  // each id's row of this rank's table, or its zero row
  return embed(local.reshape({T}), x);
}

Status TensorParallel::head_device(const Tensor& x_normed, Tensor& logits) {
  if (!splits()) {
    be_.linear(x_normed, lm_head_, nullptr, logits);
    return Status::ok();
  }
  const int64_t T = x_normed.dim(0);
  if (!iota_.defined() || T > kDeviceMaxRows)
    return unsupported("forward_device at tp > 1: " + std::to_string(T) + " rows (at most " +
                       std::to_string(kDeviceMaxRows) + ")");
  Tensor part = be_.alloc(DType::kF32, {T, lm_head_.dim(0)});
  be_.linear(x_normed, lm_head_, nullptr, part);
  MX_ASSIGN_OR_RETURN(Tensor all, comm_->all_gather_columns(part));  // [T, V / tp] per rank -> [T, V]
  be_.gather_rows(all, iota_.slice_rows(0, T), logits);                // into the caller's static buffer
  return Status::ok();
}

Tensor TensorParallel::upload_ids(const ForwardBatch& batch) const {
  const int64_t T = batch.n_tokens();
  if (comm_ == nullptr)
    return be_.upload(Tensor::view_of(const_cast<int32_t*>(batch.token_ids.data()), DType::kI32, {T}));
  const int64_t part = vocab_ / rank_.tp, begin = rank_.tp_rank() * part;
  Tensor local = Tensor::empty(DType::kI32, {T});
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = batch.token_ids[t];
    local.data<int32_t>()[t] = static_cast<int32_t>(id >= begin && id < begin + part ? id - begin : part);
  }
  return be_.upload(local);
}

Status TensorParallel::embed(const Tensor& ids, Tensor& x) {
  be_.embedding(embed_lookup_, ids, x);
  return reduce_partial(x);  // each token's row came from one rank, zeros from the others
}

Result<ForwardOutput> TensorParallel::head(const ForwardBatch& batch, const Tensor& x_normed) {
  ForwardOutput out;
  const int64_t R = static_cast<int64_t>(batch.logit_rows.size());
  if (R > 0) {
    Tensor rows = be_.upload(Tensor::view_of(const_cast<int32_t*>(batch.logit_rows.data()), DType::kI32, {R}));
    Tensor picked = be_.alloc(be_.activation_dtype(), {R, x_normed.dim(1)});
    be_.gather_rows(x_normed, rows, picked);
    out.logits = be_.alloc(DType::kF32, {R, lm_head_.dim(0)});
    be_.linear(picked, lm_head_, nullptr, out.logits);
    if (comm_ != nullptr) {  // vocabulary-parallel head: [R, V / tp] per rank -> [R, V]
      MX_ASSIGN_OR_RETURN(out.logits, comm_->all_gather_columns(out.logits));
    }
  }
  if (batch.want_hidden) out.hidden = x_normed;
  return out;
}

Status TensorParallel::check_replicated(const Tensor& t, const std::string& what) {
  if (comm_ == nullptr || t.numel() == 0) return Status::ok();
  const Tensor rows = t.ndim() >= 1 ? t : t.reshape({1});
  MX_ASSIGN_OR_RETURN(Tensor gathered, comm_->all_gather(rows));
  const Tensor host = be_.to_host(gathered);
  // The host copy's element size (to_host widens bf16 to f32 on CUDA), not the device tensor's.
  const int64_t esize = dtype_bits(host.dtype()) / 8, bytes = rows.numel() * esize;
  const char* base = static_cast<const char*>(host.raw());
  const char* mine = base + static_cast<int64_t>(comm_->rank()) * bytes;
  for (int r = 0; r < comm_->size(); ++r) {
    const char* theirs = base + static_cast<int64_t>(r) * bytes;
    if (std::memcmp(mine, theirs, bytes) == 0) continue;
    int64_t i = 0;
    while (std::memcmp(mine + i * esize, theirs + i * esize, esize) == 0) ++i;
    return internal_error(what + " differs between ranks " + std::to_string(comm_->rank()) + " and " +
                          std::to_string(r) + " (first at element " + std::to_string(i) + " of " +
                          rows.describe() + "): a replicated input is not bit-identical across the "
                          "tensor-parallel group (docs/parallel.md)");
  }
  ++replica_checks_passed_;
  return Status::ok();
}

}  // namespace mxserve::model
