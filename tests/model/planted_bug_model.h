// Test double: a CausalLM that forwards to a real model with one planted bug in the batch it hands over -- the
// bugs the fixture checks must catch on every path and in every mode (tests/model/test_fixture_decisions.cpp):
//   kDecodePositionPlusOne:      every decode row (a sequence's single new token after a cached prefix) is run at
//                                position + 1 (an off-by-one decode position: RoPE and the indexer see it);
//   kFirstTwoRowsSwapPositions:  a batch's first two rows of one sequence trade positions (RoPE applied with
//                                another row's position).
// The KV layout (which cache slots rows write) is untouched: only what the model computes from positions.
#pragma once

#include <utility>

#include "model/causal_lm.h"
#include "model/forward_batch.h"

namespace mxserve::test {

enum class PlantedBug { kDecodePositionPlusOne, kFirstTwoRowsSwapPositions };

class PlantedBugModel final : public model::CausalLM {
 public:
  PlantedBugModel(model::CausalLM& inner, PlantedBug bug) : inner_(inner), bug_(bug) {}

  const model::ModelConfig& config() const override { return inner_.config(); }
  kvcache::KvCacheSpec kv_spec(int64_t n_blocks, int64_t block_size) const override {
    return inner_.kv_spec(n_blocks, block_size);
  }
  Status set_kv_cache_dtype(kvcache::KvCacheDtype dtype) override { return inner_.set_kv_cache_dtype(dtype); }
  kvcache::KvCacheDtype kv_cache_dtype() const override { return inner_.kv_cache_dtype(); }
  Result<model::ForwardOutput> forward(const model::ForwardBatch& batch, kvcache::KvCache& kv) override {
    return inner_.forward(planted(batch), kv);
  }
  bool has_mtp() const override { return inner_.has_mtp(); }
  Result<model::ForwardOutput> forward_mtp(const model::ForwardBatch& batch, const Tensor& hidden_in,
                                           kvcache::KvCache& kv) override {
    return inner_.forward_mtp(planted(batch), hidden_in, kv);
  }
  void copy_kv_slots(backend::Backend& be, const Tensor& src, const Tensor& dst, kvcache::KvCache& kv) override {
    inner_.copy_kv_slots(be, src, dst, kv);
  }

 private:
  model::ForwardBatch planted(const model::ForwardBatch& batch) const {
    model::ForwardBatch b = batch;
    for (const model::SequenceSpan& s : b.seqs) {
      if (bug_ == PlantedBug::kDecodePositionPlusOne && s.n_tokens == 1 && s.kv_len > 1) b.positions[s.token_begin] += 1;
      if (bug_ == PlantedBug::kFirstTwoRowsSwapPositions && s.n_tokens >= 2) {
        std::swap(b.positions[s.token_begin], b.positions[s.token_begin + 1]);
        break;
      }
    }
    return b;
  }
  model::CausalLM& inner_;
  PlantedBug bug_;
};

}  // namespace mxserve::test
