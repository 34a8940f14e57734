#include "core/check.h"
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
    return ExecOutput{be_.to_host(out.logits), out.hidden};
  }
  bool has_mtp() const override { return model_.has_mtp(); }
  Result<ExecOutput> execute_mtp(const model::ForwardBatch& batch, const Tensor& hidden_in) override {
    MX_ASSIGN_OR_RETURN(model::ForwardOutput out, model_.forward_mtp(batch, hidden_in, *kv_));
    return ExecOutput{be_.to_host(out.logits), out.hidden};
  }
  Tensor select_rows(const Tensor& hidden, const std::vector<int32_t>& rows) override {
    const int64_t R = static_cast<int64_t>(rows.size());
    Tensor idx = be_.upload(Tensor::view_of(const_cast<int32_t*>(rows.data()), DType::kI32, {R}));
    Tensor out = be_.alloc(hidden.dtype(), {R, hidden.dim(1)});
    be_.gather_rows(hidden, idx, out);
    return out;
  }

 private:
  model::CausalLM& model_;
  backend::Backend& be_;
  std::unique_ptr<kvcache::KvCache> kv_;
};

}  // namespace

std::unique_ptr<ModelExecutor> make_model_executor(model::CausalLM& model, backend::Backend& be, int64_t n_blocks,
                                                   int64_t block_size) {
  return std::make_unique<CausalLmExecutor>(model, be, n_blocks, block_size);
}

int64_t kv_blocks_for_bytes(const model::CausalLM& model, int64_t block_size, uint64_t bytes) {
  const kvcache::KvCacheSpec one = model.kv_spec(1, block_size);
  const uint64_t per_block = one.bytes();
  MX_CHECK_GT(per_block, 0u);
  return static_cast<int64_t>(bytes / per_block);
}

}  // namespace mxserve::runtime
