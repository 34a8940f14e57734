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
  Result<Tensor> execute(const model::ForwardBatch& batch) override {
    MX_ASSIGN_OR_RETURN(model::ForwardOutput out, model_.forward(batch, *kv_));
    return be_.to_host(out.logits);
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
