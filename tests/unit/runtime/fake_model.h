// A fake model for scheduler simulations: it keeps a fake KV cache of token ids (written through the
// block tables exactly like the real K/V) and makes each row's logits a hash of every token it can see
// through its block table. Any wrong block sharing, early free or stale prefix changes the output, so
// comparing with the greedy oracle (computed from the true token sequence) checks the KV bookkeeping.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/hash.h"
#include "runtime/executor.h"

namespace mxserve::runtime::testing {

inline uint64_t context_hash(std::span<const int32_t> tokens) {
  uint64_t h = 0x1234;
  for (int32_t t : tokens) h = mix64(h ^ static_cast<uint64_t>(t + 1));
  return h;
}

inline void fake_logits(uint64_t h, int64_t vocab, float* out) {
  for (int64_t v = 0; v < vocab; ++v) out[v] = static_cast<float>(mix64(h * 1315423911ull + v) >> 40) / 16777216.f;
}

inline int32_t fake_greedy_next(std::span<const int32_t> ctx, int64_t vocab) {
  std::vector<float> l(vocab);
  fake_logits(context_hash(ctx), vocab, l.data());
  int32_t best = 0;
  for (int64_t v = 1; v < vocab; ++v)
    if (l[v] > l[best]) best = static_cast<int32_t>(v);
  return best;
}

// Greedy continuation under the fake model, stopping after an EOS id (kept) or max_tokens.
inline std::vector<int32_t> fake_greedy(std::vector<int32_t> ctx, int32_t max_tokens, int64_t vocab,
                                        const std::vector<int64_t>& eos) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < max_tokens; ++i) {
    const int32_t t = fake_greedy_next(ctx, vocab);
    out.push_back(t);
    ctx.push_back(t);
    bool stop = false;
    for (int64_t e : eos) stop |= e == t;
    if (stop) break;
  }
  return out;
}

class FakeModel final : public ModelExecutor {
 public:
  FakeModel(int64_t n_blocks, int64_t block_size, int64_t vocab)
      : slots_(n_blocks * block_size, -1), block_size_(block_size), vocab_(vocab) {}
  int64_t vocab_size() const override { return vocab_; }
  Result<ExecOutput> execute(const model::ForwardBatch& batch) override {
    MX_RETURN_IF_ERROR(batch.validate(vocab_, static_cast<int64_t>(slots_.size()) / block_size_, block_size_));
    for (const auto& s : batch.seqs) {
      const int32_t first = s.kv_len - s.n_tokens;
      for (int32_t i = 0; i < s.n_tokens; ++i) slots_[slot(s, first + i)] = batch.token_ids[s.token_begin + i];
    }
    Tensor logits = Tensor::empty(DType::kF32, {static_cast<int64_t>(batch.logit_rows.size()), vocab_});
    std::vector<int32_t> ctx;
    for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
      const int32_t row = batch.logit_rows[r];
      for (const auto& s : batch.seqs) {
        if (row < s.token_begin || row >= s.token_begin + s.n_tokens) continue;
        const int32_t j = s.kv_len - s.n_tokens + (row - s.token_begin);
        ctx.clear();
        for (int32_t k = 0; k <= j; ++k) ctx.push_back(slots_[slot(s, k)]);
      }
      fake_logits(context_hash(ctx), vocab_, logits.data<float>() + r * vocab_);
    }
    ++steps_;
    tokens_ += batch.n_tokens();
    return ExecOutput{logits, {}, Tensor()};
  }
  Tensor select_rows(const Tensor& hidden, const std::vector<int32_t>&) override { return hidden; }
  int64_t steps() const { return steps_; }
  int64_t tokens() const { return tokens_; }

 private:
  int64_t slot(const model::SequenceSpan& s, int32_t j) const {
    return static_cast<int64_t>(s.blocks()[j / block_size_]) * block_size_ + j % block_size_;
  }
  std::vector<int32_t> slots_;
  int64_t block_size_;
  int64_t vocab_;
  int64_t steps_ = 0;
  int64_t tokens_ = 0;
};

}  // namespace mxserve::runtime::testing
