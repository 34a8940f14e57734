#include <algorithm>
#include <set>
#include <string>

#include "core/check.h"
#include "core/logging.h"
#include "runtime/activation_watch.h"
#include "runtime/decode_graphs.h"
#include "runtime/mtp_graphs.h"
#include "kernels/cpu/sampling.h"
#include "runtime/executor.h"
#include "runtime/kv_host_mover.h"

namespace mxserve::runtime {
namespace {

class CausalLmExecutor final : public ModelExecutor {
 public:
  CausalLmExecutor(model::CausalLM& model, backend::Backend& be, int64_t n_blocks, int64_t block_size)
      : model_(model), be_(be), n_blocks_(n_blocks), block_size_(block_size) {
    // One block past the pool's: the scratch block padded rows of decode graphs write (never handed out).
    kv_ = std::make_unique<kvcache::KvCache>(model.kv_spec(n_blocks + 1, block_size),
                                             [&be](DType dt, Shape s) { return be.alloc(dt, std::move(s)); });
    kv_->set_pool_blocks(n_blocks);  // the last block is the graphs' scratch block, no DP rank's
  }
  int64_t vocab_size() const override { return model_.config().vocab_size; }
  Result<ExecOutput> execute(const model::ForwardBatch& batch) override { return run_target(batch, nullptr); }
  Result<ExecOutput> execute_and_sample(const model::ForwardBatch& batch, const kernels::SampleRowsInput& in) override {
    return run_target(batch, &in);
  }
  // sample: a decode graph with the sampling tail samples them in the replay (runtime/graph_sampler.h).
  Result<ExecOutput> run_target(const model::ForwardBatch& batch, const kernels::SampleRowsInput* sample) {
    std::string why;
    if (graphs_ && graphs_->covers(batch, &why)) {
      MX_RETURN_IF_ERROR(batch.validate(model_.config().vocab_size, n_blocks_, block_size_));
      MX_RETURN_IF_ERROR(settle_host_loads());  // a replay reads the cache without the per-layer gate
      GraphSampleOutput sampled;
      MX_ASSIGN_OR_RETURN(model::ForwardOutput out, graphs_->run(batch, sample, &sampled));
      last_logits_ = out.logits;  // the graph's static logits buffer: valid until the next replay
      return finish(batch, out, &sampled);
    }
    // Decode / verify-shaped steps (every row a logit row) without a bucket: said once per kind.
    if (graphs_ && static_cast<int64_t>(batch.logit_rows.size()) == batch.n_tokens()) say_eager("a target", why);
    const backend::MemoryInterval before = probe_memory();
    MX_ASSIGN_OR_RETURN(model::ForwardOutput out, model_.forward(batch, *kv_));
    check_activations(before, batch);
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
    std::string why;
    if (mtp_graphs_ && mtp_graphs_->covers(batch, hidden_in, &why)) {
      MX_RETURN_IF_ERROR(batch.validate(model_.config().vocab_size, n_blocks_, block_size_));
      MX_RETURN_IF_ERROR(settle_host_loads());  // a replay reads the cache without the per-layer gate
      MX_ASSIGN_OR_RETURN(model::ForwardOutput out, mtp_graphs_->run(batch, hidden_in));
      return finish(batch, out);
    }
    if (mtp_graphs_) say_eager("an MTP", why);
    const backend::MemoryInterval before = probe_memory();
    MX_ASSIGN_OR_RETURN(model::ForwardOutput out, model_.forward_mtp(batch, hidden_in, *kv_));
    check_activations(before, batch);
    return finish(batch, out);
  }
  void watch_activations(uint64_t reserve_bytes, MemoryProbe probe) override {
    watch_.set_reserve(reserve_bytes > 0 ? std::vector<uint64_t>{reserve_bytes} : std::vector<uint64_t>{});
    probe_ = probe ? std::move(probe) : MemoryProbe([this] { return backend::take_memory_interval(be_); });
  }
  int64_t activation_warnings() const override { return activation_warnings_; }
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
    MX_RETURN_IF_ERROR(settle_host_loads());
    const int64_t P = static_cast<int64_t>(src_slots.size());
    Tensor src = be_.upload(Tensor::view_of(const_cast<int32_t*>(src_slots.data()), DType::kI32, {P}));
    Tensor dst = be_.upload(Tensor::view_of(const_cast<int32_t*>(dst_slots.data()), DType::kI32, {P}));
    model_.copy_kv_slots(be_, src, dst, *kv_);  // every tensor of the model's cache layout (every rank's)
    return Status::ok();
  }

  void synchronize() override {
    const Status st = settle_host_loads();
    MX_CHECK_MSG(st.is_ok(), st.to_string());
    be_.synchronize();
  }

  // The mover issues a hit's loads per cached layer and installs itself as the cache's gate: the eager
  // forward waits per layer (decoder frame); what reads the cache without the gate settles first.
  Result<kvcache::BlockMover*> enable_host_tier(int64_t n_slots) override {
    if (n_slots <= 0) return invalid_argument("host KV tier: " + std::to_string(n_slots) + " slots");
    MX_ASSIGN_OR_RETURN(host_mover_, KvHostMover::make(be_, *kv_, n_slots));
    return static_cast<kvcache::BlockMover*>(host_mover_.get());
  }
  uint64_t kv_bytes_per_block() const override { return kv_->spec().bytes_per_block(); }

  Status enable_block_tables(int64_t max_rows, int64_t max_blocks_per_seq) override {
    if (max_rows <= 0 || max_blocks_per_seq <= 0)
      return invalid_argument("block-table store: " + std::to_string(max_rows) + " rows x " +
                              std::to_string(max_blocks_per_seq) + " blocks");
    // One row past the engine's: the scratch row of decode graphs' padded rows (its block: the scratch block).
    kv_->enable_block_tables(
        max_rows + 1, max_blocks_per_seq, [this](DType dt, Shape s) { return be_.alloc(dt, std::move(s)); },
        [this](Tensor& dst, int64_t offset, const Tensor& host) { be_.write_from_host(dst, offset, host); });
    scratch_row_ = static_cast<int32_t>(max_rows);
    const std::vector<int32_t> scratch = {static_cast<int32_t>(n_blocks_)};
    return kv_->block_tables()->sync(scratch_row_, kScratchLease, scratch);
  }

  int64_t graph_replays() const override { return graphs_ ? graphs_->replays() : 0; }
  GraphReplayCounts graph_replay_counts() const override {
    GraphReplayCounts c;
    if (graphs_) {
      c.verify = graphs_->verify_replays();
      c.tree_verify = graphs_->tree_replays();
      c.decode = graphs_->replays() - c.verify - c.tree_verify;
      c.sampled = graphs_->sampled_replays();
    }
    if (mtp_graphs_) {
      c.mtp = mtp_graphs_->replays(MtpGraphs::Family::kChain);
      c.extend = mtp_graphs_->replays(MtpGraphs::Family::kExtend);
      c.tree_draft = mtp_graphs_->replays(MtpGraphs::Family::kTree);
    }
    return c;
  }

  Status enable_decode_graphs(int64_t max_batch, const SpecGraphShapes& spec = {}) override {
    if (kv_->block_tables() == nullptr) return invalid_argument("decode graphs need the block-table store first");
    if (max_batch <= 0 || max_batch > scratch_row_)
      return invalid_argument("decode graphs: max batch " + std::to_string(max_batch) + " outside [1, " +
                              std::to_string(scratch_row_) + "]");
    MX_RETURN_IF_ERROR(settle_host_loads());  // never capture a wait on a copy event
    DecodeGraphLayout layout;
    layout.max_batch = max_batch;
    layout.block_size = block_size_;
    layout.scratch_row = scratch_row_;
    layout.scratch_block = static_cast<int32_t>(n_blocks_);
    layout.max_drafts = std::max(spec.chain_drafts, 0);
    layout.tree_rows = spec.tree_verify_rows;
    auto graphs = std::make_unique<DecodeGraphs>(model_, be_, *kv_, layout);
    MX_RETURN_IF_ERROR(graphs->capture());
    graphs_ = std::move(graphs);
    MtpGraphShapes shapes;
    shapes.chain = spec.chain_drafts >= 2;  // chain steps >= 2 exist: the continuation graphs
    shapes.extend_rows = std::max(spec.extend_rows, 0);
    shapes.tree_rows = std::max(spec.tree_draft_rows, 0);
    const bool mtp_shapes = model_.has_mtp() && (shapes.chain || shapes.extend_rows > 0 || shapes.tree_rows > 0);
    if (mtp_shapes && !graphs_->ran_short().empty()) {
      MX_LOG(kWarn) << "CUDA graphs: the MTP draft steps (extend, chain continuation, tree) run eagerly (slower "
                       "drafting): the device ran short of memory for the decode graphs already";
    } else if (mtp_shapes) {
      auto mtp = std::make_unique<MtpGraphs>(model_, be_, *kv_, layout, shapes);
      const Status st = mtp->capture();
      if (st.is_ok()) {
        mtp_graphs_ = std::move(mtp);
        MX_LOG(kInfo) << "CUDA graphs with " << (spec.tree_verify_rows.empty() ? "chain" : "tree")
                      << " MTP speculation: verify steps, the MTP extend and the draft steps replay graphs; steps "
                         "with prefill chunks run eagerly (each other eager kind is logged once)";
      } else {
        MX_LOG(kWarn) << "CUDA graphs: the MTP draft steps (extend, chain continuation, tree) run eagerly (slower "
                         "drafting): "
                      << st.to_string();
      }
    }
    return Status::ok();
  }

  Status check_block_table(int32_t row, uint64_t lease, const std::vector<int32_t>& table) override {
    kvcache::BlockTableStore* store = kv_->block_tables();
    if (store == nullptr || row < 0 || row >= store->max_rows() || store->lease(row) != lease) return Status::ok();
    const int64_t n = store->synced(row);
    if (n > static_cast<int64_t>(table.size()))
      return internal_error("block-table row " + std::to_string(row) + " holds " + std::to_string(n) +
                            " blocks, the host table " + std::to_string(table.size()));
    const Tensor host_row = be_.to_host(store->device().slice_rows(row, row + 1));
    const int32_t* dev = host_row.data<int32_t>();
    for (int64_t i = 0; i < n; ++i)
      if (dev[i] != table[i])
        return internal_error("block-table row " + std::to_string(row) + " column " + std::to_string(i) + ": device " +
                              std::to_string(dev[i]) + ", host " + std::to_string(table[i]));
    return Status::ok();
  }

 private:
  // Greedy ids are reduced on the device (R x 4 bytes back); the full logits cross only when asked for.
  // A replay with the sampling tail (tail->tail) brings its argmax, and maybe the sampled rows, along.
  ExecOutput finish(const model::ForwardBatch& batch, const model::ForwardOutput& out,
                    GraphSampleOutput* tail = nullptr) {
    ExecOutput r;
    r.hidden = out.hidden;
    // No logit rows (e.g. an MTP extend whose drafts are paused): the model leaves logits unset.
    const bool has_logits = out.logits.ndim() == 2;
    const int64_t R = has_logits ? out.logits.dim(0) : 0;
    if (tail != nullptr && tail->tail && R > 0) {
      MX_CHECK_EQ(static_cast<int64_t>(tail->argmax.size()), R);
      r.argmax = std::move(tail->argmax);
      r.sampled_in_forward = tail->sampled;
      r.sampled = std::move(tail->rows);
    } else if (R > 0) {
      Tensor ids = be_.alloc(DType::kI32, {R});
      be_.argmax_rows(out.logits, ids);
      Tensor host_ids = be_.to_host(ids);
      r.argmax.assign(host_ids.data<int32_t>(), host_ids.data<int32_t>() + R);
    }
    if (batch.want_host_logits && has_logits) r.logits = be_.to_host(out.logits);
    return r;
  }

  Status settle_host_loads() { return host_mover_ ? host_mover_->settle() : Status::ok(); }

  // A step the graphs do not serve runs eagerly: said once per kind of reason (its text up to the first digit,
  // so "extend step of 2 sequences x up to 57 rows ..." and "... of 3 sequences ..." are one kind).
  void say_eager(const char* what, const std::string& why) {  // what: "a target" | "an MTP"
    if (why.empty()) return;
    const std::string key = std::string(what) + ": " + why.substr(0, why.find_first_of("0123456789"));
    if (!said_.insert(key).second) return;
    MX_LOG(kInfo) << "CUDA graphs: " << what << " step runs eagerly (" << why
                  << "); said once for this kind of step: prefill chunks and shapes past the captured buckets "
                     "(--max-num-seqs, --speculative-num-steps / -num-draft-tokens, --max-model-len) always do";
  }

  // watch_activations: the allocator interval before an eager forward (unknown when not watched), then the
  // forward's peak above what was live before it against the reserve.
  backend::MemoryInterval probe_memory() { return watch_.reserve().empty() ? backend::MemoryInterval{} : probe_(); }
  void check_activations(const backend::MemoryInterval& before, const model::ForwardBatch& batch) {
    if (!before.known) return;
    const backend::MemoryInterval after = probe_();
    const uint64_t used = after.peak > before.in_use ? after.peak - before.in_use : 0;
    if (!watch_.over(0, used)) return;
    ++activation_warnings_;
    MX_LOG(kWarn) << activation_over_reserve_message(0, 1, used, watch_.reserve()[0], describe_step(batch));
  }

  static constexpr uint64_t kScratchLease = ~uint64_t{0};  // never handed out by TableRows

  model::CausalLM& model_;
  backend::Backend& be_;
  int64_t n_blocks_, block_size_;  // the pool's blocks (the cache holds one more: the scratch block)
  Tensor last_logits_;  // f32 [R, V] on the backend: the last execute()'s logit rows, for sample()
  std::unique_ptr<kvcache::KvCache> kv_;
  int32_t scratch_row_ = -1;
  std::unique_ptr<KvHostMover> host_mover_;  // the host KV tier's transport and load gate (enable_host_tier)
  std::unique_ptr<DecodeGraphs> graphs_;  // CUDA graphs of pure-decode steps (enable_decode_graphs)
  std::unique_ptr<MtpGraphs> mtp_graphs_;  // CUDA graphs of MTP draft steps (enable_decode_graphs)
  std::set<std::string> said_;             // kinds of eager fallback already logged (say_eager)
  ActivationWatch watch_;                  // watch_activations: one rank's reserve
  MemoryProbe probe_;
  int64_t activation_warnings_ = 0;
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
