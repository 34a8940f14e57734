// A fake target (testing::FakeModel's context hash over a fake KV of token ids) with an oracle MTP layer:
// the MTP row (position p, token x_{p+1}) keeps its own fake KV (x_{p+1} at index p + 1) and predicts from
// the context it sees, exactly what the target would predict there. So a healthy draft accepts every greedy
// draft; draft_noise perturbs the MTP logits (a draft that is often, not always, right). Tree rows see only
// the keys their mask allows, exactly as the attention kernels do.
#pragma once

#include <cstdint>
#include <vector>

#include "fake_model.h"
#include "runtime/executor.h"

namespace mxserve::runtime::testing {

// The oracle's target logits after the context `ctx` (every token up to and including the row's).
inline std::vector<float> oracle_logits(std::span<const int32_t> ctx, int64_t vocab, float scale) {
  std::vector<float> l(vocab);
  fake_logits(context_hash(ctx), vocab, l.data());
  for (float& x : l) x *= scale;
  return l;
}

class OracleMtpModel final : public ModelExecutor {
 public:
  // scale sharpens the logits (the argmax is unchanged): a peaked draft ranks the greedy path first.
  OracleMtpModel(int64_t n_blocks, int64_t block_size, int64_t vocab, float scale = 1.f, float draft_noise = 0.f)
      : target_(n_blocks * block_size, -1), draft_(n_blocks * block_size, -1), bs_(block_size), vocab_(vocab),
        scale_(scale), noise_(draft_noise) {}
  Status copy_kv(const std::vector<int32_t>& src, const std::vector<int32_t>& dst) override {
    for (size_t i = 0; i < src.size(); ++i) {
      target_[dst[i]] = target_[src[i]];
      draft_[dst[i]] = draft_[src[i]];
    }
    ++copies_;
    return Status::ok();
  }
  int64_t copies() const { return copies_; }
  int64_t vocab_size() const override { return vocab_; }
  bool has_mtp() const override { return true; }
  Tensor select_rows(const Tensor& h, const std::vector<int32_t>&) override { return h; }
  Result<ExecOutput> execute(const model::ForwardBatch& b) override { return run(b, false); }
  Result<ExecOutput> execute_mtp(const model::ForwardBatch& b, const Tensor&) override { return run(b, true); }

 private:
  Result<ExecOutput> run(const model::ForwardBatch& batch, bool mtp) {
    MX_RETURN_IF_ERROR(batch.validate(vocab_, static_cast<int64_t>(target_.size()) / bs_, bs_));
    // Each row's token is stored at its KV index: target row j holds x_j, MTP row p holds x_{p+1}.
    for (const auto& s : batch.seqs)
      for (int32_t i = 0; i < s.n_tokens; ++i)
        (mtp ? draft_ : target_)[slot(s, s.kv_index_of(i))] = batch.token_ids[s.token_begin + i];
    Tensor logits = Tensor::empty(DType::kF32, {static_cast<int64_t>(batch.logit_rows.size()), vocab_});
    std::vector<int32_t> ctx;
    for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
      const int32_t row = batch.logit_rows[r];
      for (const auto& s : batch.seqs) {
        if (row < s.token_begin || row >= s.token_begin + s.n_tokens) continue;
        const int32_t i = row - s.token_begin;
        const int32_t pos = s.kv_index_of(i);
        auto visible = [&](int32_t k) {
          return s.tree_mask.empty() || k < s.tree_base || ((s.tree_mask[i] >> (k - s.tree_base)) & 1u) != 0;
        };
        ctx.clear();
        if (!mtp) {
          for (int32_t k = 0; k <= pos; ++k)
            if (visible(k)) ctx.push_back(target_[slot(s, k)]);
        } else {  // x_0 from the target's KV, x_1..x_p from the MTP layer's own, then the row's x_{p+1}
          ctx.push_back(target_[slot(s, 0)]);
          for (int32_t k = 0; k < pos; ++k)
            if (visible(k)) ctx.push_back(draft_[slot(s, k)]);
          ctx.push_back(batch.token_ids[row]);
        }
      }
      float* out = logits.data<float>() + r * vocab_;
      const uint64_t h = context_hash(ctx);
      fake_logits(h, vocab_, out);
      for (int64_t v = 0; v < vocab_; ++v) out[v] *= scale_;
      if (mtp && noise_ != 0.f) {
        std::vector<float> n(vocab_);
        fake_logits(h ^ 0x5bd1e995ull, vocab_, n.data());
        for (int64_t v = 0; v < vocab_; ++v) out[v] += noise_ * n[v];
      }
    }
    return ExecOutput{logits, {}, Tensor()};
  }
  int64_t slot(const model::SequenceSpan& s, int32_t j) const {
    return static_cast<int64_t>(s.blocks()[j / bs_]) * bs_ + j % bs_;
  }
  std::vector<int32_t> target_, draft_;
  int64_t bs_, vocab_;
  float scale_, noise_;
  int64_t copies_ = 0;
};

}  // namespace mxserve::runtime::testing
