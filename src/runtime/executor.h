// ModelExecutor: runs one ForwardBatch and returns host logits for its logit rows. The engine talks to
// the model only through this, so the scheduler can be simulated with a fake model in tests.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "model/causal_lm.h"
#include "model/forward_batch.h"

namespace mxserve::runtime {

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;
  virtual int64_t vocab_size() const = 0;
  // Host f32 logits [len(batch.logit_rows), V].
  virtual Result<Tensor> execute(const model::ForwardBatch& batch) = 0;
};

// The real thing: a CausalLM over a paged KV cache of n_blocks x block_size tokens on its backend.
std::unique_ptr<ModelExecutor> make_model_executor(model::CausalLM& model, backend::Backend& be, int64_t n_blocks,
                                                   int64_t block_size);

// KV blocks that fit in `bytes` for this model (K and V of every layer, MTP layer included).
int64_t kv_blocks_for_bytes(const model::CausalLM& model, int64_t block_size, uint64_t bytes);

}  // namespace mxserve::runtime
