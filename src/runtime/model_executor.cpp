#include <algorithm>

#include "core/check.h"
#include "kernels/cpu/sampling.h"
#include "runtime/executor.h"

namespace mxserve::runtime {
namespace {

class CausalLmExecutor final : public ModelExecutor {
 public:
  CausalLmExecutor(model::CausalLM& model, backend::Backend& be, int64_t n_blocks, int64_t block_size)
      : model_(model), be_(be) {
    kv_ = std::make_unique<kvcache::KvCache>(model.kv_spec(n_blocks, block_size),
                                             [&be](DType dt, Shape s) { return be.alloc(dt, std::move(s)); });
  }
  int64_t vocab_size() const override { return model_.config().vocab_size; }
  Result<ExecOutput> execute(const model::ForwardBatch& batch) override {
    MX_ASSIGN_OR_RETURN(model::ForwardOutput out, model_.forward(batch, *kv_));
    last_logits_ = out.logits;
    return finish(batch, out);
  }
  Result<std::vector<kernels::SampledRow>> sample(const ExecOutput&, const kernels::SampleRowsInput& in) override {
    if (in.rows.empty()) return std::vector<kernels::SampledRow>{};
    if (last_logits_.ndim() != 2) return internal_error("sample: the last forward produced no logit rows");
    return be_.sample_rows(last_logits_, in);
  }
  bool has_mtp() const override { return model_.has_mtp(); }
  Result<ExecOutput> execute_mtp(const model::ForwardBatch& batch, const Tensor& hidden_in) override {
    MX_ASSIGN_OR_RETURN(model::ForwardOutput out, model_.forward_mtp(batch, hidden_in, *kv_));
    return finish(batch, out);
  }
  Tensor select_rows(const Tensor& hidden, const std::vector<int32_t>& rows) override {
    const int64_t R = static_cast<int64_t>(rows.size());
    Tensor idx = be_.upload(Tensor::view_of(const_cast<int32_t*>(rows.data()), DType::kI32, {R}));
    Tensor out = be_.alloc(hidden.dtype(), {R, hidden.dim(1)});
    be_.gather_rows(hidden, idx, out);
    return out;
  }
  Status copy_kv(const std::vector<int32_t>& src_slots, const std::vector<int32_t>& dst_slots) override {
    if (src_slots.size() != dst_slots.size()) return invalid_argument("copy_kv: slot lists differ in length");
    if (src_slots.empty()) return Status::ok();
    const int64_t n_slots = kv_->spec().n_blocks * kv_->spec().block_size;
    for (size_t i = 0; i < src_slots.size(); ++i)
      if (src_slots[i] < 0 || src_slots[i] >= n_slots || dst_slots[i] < 0 || dst_slots[i] >= n_slots)
        return invalid_argument("copy_kv: slot pair " + std::to_string(i) + " outside the cache");
    const int64_t P = static_cast<int64_t>(src_slots.size());
    Tensor src = be_.upload(Tensor::view_of(const_cast<int32_t*>(src_slots.data()), DType::kI32, {P}));
    Tensor dst = be_.upload(Tensor::view_of(const_cast<int32_t*>(dst_slots.data()), DType::kI32, {P}));
    be_.kv_copy(src, dst, kv_->all_tensors());  // every tensor of the model's cache layout
    return Status::ok();
  }

  void synchronize() override { be_.synchronize(); }

 private:
  // Greedy ids are reduced on the device (R x 4 bytes back); the full logits cross only when asked for.
  ExecOutput finish(const model::ForwardBatch& batch, const model::ForwardOutput& out) {
    ExecOutput r;
    r.hidden = out.hidden;
    // No logit rows (e.g. an MTP extend whose drafts are paused): the model leaves logits unset.
    const bool has_logits = out.logits.ndim() == 2;
    const int64_t R = has_logits ? out.logits.dim(0) : 0;
    if (R > 0) {
      Tensor ids = be_.alloc(DType::kI32, {R});
      be_.argmax_rows(out.logits, ids);
      Tensor host_ids = be_.to_host(ids);
      r.argmax.assign(host_ids.data<int32_t>(), host_ids.data<int32_t>() + R);
    }
    if (batch.want_host_logits && has_logits) r.logits = be_.to_host(out.logits);
    return r;
  }

  model::CausalLM& model_;
  backend::Backend& be_;
  Tensor last_logits_;  // f32 [R, V] on the backend: the last execute()'s logit rows, for sample()
  std::unique_ptr<kvcache::KvCache> kv_;
};

}  // namespace

std::unique_ptr<ModelExecutor> make_model_executor(model::CausalLM& model, backend::Backend& be, int64_t n_blocks,
                                                   int64_t block_size) {
  return std::make_unique<CausalLmExecutor>(model, be, n_blocks, block_size);
}

Result<std::vector<kernels::SampledRow>> ModelExecutor::sample(const ExecOutput& out,
                                                               const kernels::SampleRowsInput& in) {
  if (in.rows.empty()) return std::vector<kernels::SampledRow>{};
  if (out.logits.ndim() != 2)
    return internal_error("sample: this executor has no device sampler and returned no host logits");
  return kernels::cpu::sample_rows_f32(out.logits.data<float>(), out.logits.dim(0), out.logits.dim(1), in);
}

int32_t ExecOutput::greedy_token(int64_t r) const {
  if (!argmax.empty()) return argmax.at(static_cast<size_t>(r));
  MX_CHECK_MSG(logits.numel() > 0, "ExecOutput: neither argmax nor logits for row " << r);
  const int64_t V = logits.dim(1);
  const float* p = logits.data<float>() + r * V;
  return static_cast<int32_t>(std::max_element(p, p + V) - p);
}

int64_t kv_blocks_for_bytes(const model::CausalLM& model, int64_t block_size, uint64_t bytes) {
  const uint64_t per_block = model.kv_spec(1, block_size).bytes_per_block();
  MX_CHECK_GT(per_block, 0u);
  return static_cast<int64_t>(bytes / per_block);
}

}  // namespace mxserve::runtime
