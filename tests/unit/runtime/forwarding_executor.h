// ForwardingExecutor: a test executor that forwards every ModelExecutor call to an inner one, so a wrapper
// overrides only what it observes or perturbs. (Wrappers that listed the calls by hand silently lost the
// block-table store and device sampling when those were added: they took the base class's no-op defaults.)
// ZeroedMtpExecutor: the test hook for a broken draft layer (its logits zeroed on the host, so it always
// proposes token 0): the speculative self-test must flag it.
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "runtime/executor.h"

namespace mxserve::runtime {

class ForwardingExecutor : public ModelExecutor {
 public:
  explicit ForwardingExecutor(std::unique_ptr<ModelExecutor> inner) : inner_(std::move(inner)) {}
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  Result<ExecOutput> execute(const model::ForwardBatch& b) override { return inner_->execute(b); }
  Result<std::vector<kernels::SampledRow>> sample(const ExecOutput& o, const kernels::SampleRowsInput& in) override {
    return inner_->sample(o, in);  // the inner executor keeps the device logits of its last execute()
  }
  bool has_mtp() const override { return inner_->has_mtp(); }
  Result<ExecOutput> execute_mtp(const model::ForwardBatch& b, const Tensor& h) override {
    return inner_->execute_mtp(b, h);
  }
  Tensor select_rows(const Tensor& h, const std::vector<int32_t>& rows) override { return inner_->select_rows(h, rows); }
  Status enable_block_tables(int64_t rows, int64_t width) override { return inner_->enable_block_tables(rows, width); }
  Status enable_decode_graphs(int64_t max_batch, const SpecGraphShapes& spec = {}) override {
    return inner_->enable_decode_graphs(max_batch, spec);
  }
  int64_t graph_replays() const override { return inner_->graph_replays(); }
  GraphReplayCounts graph_replay_counts() const override { return inner_->graph_replay_counts(); }
  Status check_block_table(int32_t row, uint64_t lease, const std::vector<int32_t>& t) override {
    return inner_->check_block_table(row, lease, t);
  }
  void synchronize() override { inner_->synchronize(); }
  Status copy_kv(const std::vector<int32_t>& src, const std::vector<int32_t>& dst) override {
    return inner_->copy_kv(src, dst);
  }
  Result<kvcache::BlockMover*> enable_host_tier(int64_t n_slots) override { return inner_->enable_host_tier(n_slots); }
  uint64_t kv_bytes_per_block() const override { return inner_->kv_bytes_per_block(); }

 protected:
  std::unique_ptr<ModelExecutor> inner_;
};

class ZeroedMtpExecutor final : public ForwardingExecutor {
 public:
  using ForwardingExecutor::ForwardingExecutor;
  Result<ExecOutput> execute_mtp(const model::ForwardBatch& b, const Tensor& h) override {
    model::ForwardBatch all = b;
    all.want_host_logits = true;  // zeroed on the host; the greedy drafts then come from these logits
    MX_ASSIGN_OR_RETURN(ExecOutput out, inner_->execute_mtp(all, h));
    if (out.logits.ndim() == 2) std::memset(out.logits.data<float>(), 0, sizeof(float) * out.logits.numel());
    out.argmax.clear();
    return out;
  }
};

}  // namespace mxserve::runtime
