#include "cli/bench_model_step.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "kernels/cascade_attention.h"
#include "runtime/graph_sampler.h"
#ifdef MXSERVE_HAVE_CUDA
#include "kernels/cuda/attention/cascade_attention.h"
#endif

namespace mxserve::cli {
namespace {

constexpr uint64_t kScratchLease = ~uint64_t{0};  // the scratch row's (as runtime/model_executor.cpp)

// Median ms of kStepTimed host-timed calls after kStepWarmup; stops at the first error.
Result<double> median_ms(const std::function<Status()>& step) {
  for (int i = 0; i < kStepWarmup; ++i) MX_RETURN_IF_ERROR(step());
  std::vector<double> v;
  for (int i = 0; i < kStepTimed; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    MX_RETURN_IF_ERROR(step());
    v.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int64_t cascade_kernel_launches() {
#ifdef MXSERVE_HAVE_CUDA
  return kernels::cuda::cascade_attention_launches();
#else
  return -1;
#endif
}

model::ForwardBatch make_bench_batch(int64_t b, int64_t ctx, int64_t n_tokens, int64_t block_size, bool logits,
                                     int64_t vocab, int64_t shared_blocks, int64_t prefix_group) {
  model::ForwardBatch fb;
  const int64_t blocks = (ctx + block_size - 1) / block_size;
  const int64_t n_groups = (b + prefix_group - 1) / prefix_group, own = blocks - shared_blocks;
  for (int64_t s = 0; s < b; ++s) {
    model::SequenceSpan span;
    span.token_begin = fb.n_tokens();
    span.n_tokens = static_cast<int32_t>(n_tokens);
    span.kv_len = static_cast<int32_t>(ctx);
    for (int64_t k = 0; k < blocks; ++k)
      span.block_table.push_back(static_cast<int32_t>(
          k < shared_blocks ? (s / prefix_group) * shared_blocks + k : n_groups * shared_blocks + s * own + k - shared_blocks));
    for (int64_t i = 0; i < n_tokens; ++i) {
      if (logits) fb.logit_rows.push_back(fb.n_tokens());
      fb.token_ids.push_back(static_cast<int32_t>((s * 7919 + i) % std::min<int64_t>(vocab, 1000)));
      fb.positions.push_back(static_cast<int32_t>(ctx - n_tokens + i));
    }
    fb.seqs.push_back(span);
  }
  return fb;
}

std::string CascadeDecision::describe() const {
  char b[320];
  if (!enabled) return "cascade attention off (" + off_reason + ")";
  if (groups == 0) return "no prefix groups (no rows share >= 4 leading blocks)";
  std::snprintf(b, sizeof(b), "%lld prefix groups over %lld rows (up to %lld shared keys) save %.1f MiB of K/V reads "
                "per layer (threshold %.1f MiB): %s", static_cast<long long>(groups), static_cast<long long>(members),
                static_cast<long long>(shared_keys), saved_bytes / 1048576.0, min_saved_bytes / 1048576.0,
                taken ? "the cascade path is taken" : "below the threshold: per-sequence attention");
  return b;
}

CascadeDecision cascade_decision(const model::ForwardBatch& fb, const backend::Backend& be,
                                 const model::ModelConfig& c, int64_t block_size) {
  CascadeDecision d;
  const bool shape_ok = model::cascade_shape_served(c.n_heads, c.n_kv_heads, c.head_dim);  // MLA: none
  d.enabled = be.cascade_attention_enabled() && shape_ok;
  if (!be.cascade_attention_enabled())
    d.off_reason = be.name() == "cuda" ? "--disable-cascade-attention" : "backend " + be.name() + " has none";
  else if (!shape_ok)
    d.off_reason = "not a shape the cascade kernels serve (" + std::to_string(c.n_heads) + " / " +
                   std::to_string(c.n_kv_heads) + " heads x " + std::to_string(c.head_dim) + ")";
  const int32_t n = model::leading_decode_rows(fb);
  if (!d.enabled || n < 2) return d;
  const kernels::CascadeLayout layout = model::cascade_groups(fb, n, block_size);
  d.groups = static_cast<int64_t>(layout.groups.size());
  d.members = static_cast<int64_t>(layout.members.size());
  for (const kernels::CascadeGroup& g : layout.groups)
    d.shared_keys = std::max(d.shared_keys, layout.shared_keys(g, static_cast<int32_t>(block_size)));
  d.saved_bytes = model::cascade_saved_kv_bytes(layout, block_size, c.n_kv_heads, c.head_dim);
  d.min_saved_bytes = be.cascade_attention_min_saved_bytes();
  d.taken = model::cascade_pays(layout, block_size, c.n_kv_heads, c.head_dim, be);  // the rule both paths apply
  return d;
}

DecodeStepBench::DecodeStepBench(model::CausalLM& lm, backend::Backend& be, kvcache::KvCache& kv, int64_t max_batch,
                                 int64_t step_ctx, int64_t block_size, int64_t pool_blocks)
    : lm_(lm), be_(be), kv_(kv), max_batch_(max_batch), step_ctx_(step_ctx), block_size_(block_size),
      pool_blocks_(pool_blocks) {}

Status DecodeStepBench::enable_block_tables() {
  if (kv_.spec().n_blocks != pool_blocks_ + 1)
    return internal_error("bench-model: the KV cache holds " + std::to_string(kv_.spec().n_blocks) +
                          " blocks, expected the pool's " + std::to_string(pool_blocks_) + " + 1 scratch block");
  kv_.set_pool_blocks(pool_blocks_);
  const int64_t step_blocks = (step_ctx_ + block_size_ - 1) / block_size_;
  // As the engine's executor: one row past the bench's, the scratch row of the graphs' padded rows.
  kv_.enable_block_tables(
      max_batch_ + 1, step_blocks, [this](DType dt, Shape s) { return be_.alloc(dt, std::move(s)); },
      [this](Tensor& dst, int64_t offset, const Tensor& host) { be_.write_from_host(dst, offset, host); });
  const std::vector<int32_t> scratch = {static_cast<int32_t>(pool_blocks_)};
  return kv_.block_tables()->sync(static_cast<int32_t>(max_batch_), kScratchLease, scratch);
}

Status DecodeStepBench::capture_graphs() {
  runtime::DecodeGraphLayout layout;
  layout.max_batch = max_batch_;
  layout.block_size = block_size_;
  layout.scratch_row = static_cast<int32_t>(max_batch_);
  layout.scratch_block = static_cast<int32_t>(pool_blocks_);
  auto graphs = std::make_unique<runtime::DecodeGraphs>(lm_, be_, kv_, layout);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t launches0 = cascade_kernel_launches();
  MX_RETURN_IF_ERROR(graphs->capture());
  if (launches0 >= 0) capture_cascade_launches_ = cascade_kernel_launches() - launches0;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "decode graphs: captured %lld graphs in %.2f s (batch buckets up to %lld, context classes up "
               "to %lld; the engine's layout)\n", static_cast<long long>(graphs->n_graphs()), secs,
               static_cast<long long>(max_batch_), static_cast<long long>(kv_.block_tables()->max_blocks_per_seq() * block_size_));
  graphs_ = std::move(graphs);
  return Status::ok();
}

Status DecodeStepBench::assign_rows(model::ForwardBatch& fb) {
  if (static_cast<int64_t>(fb.seqs.size()) > max_batch_)
    return invalid_argument("bench-model: a step of " + std::to_string(fb.seqs.size()) + " sequences, store rows for " +
                            std::to_string(max_batch_));
  ++lease_;  // a new batch layout: every row re-syncs once
  for (size_t s = 0; s < fb.seqs.size(); ++s) {
    model::SequenceSpan& span = fb.seqs[s];
    for (int32_t blk : span.block_table)
      if (blk < 0 || blk >= pool_blocks_)
        return internal_error("bench-model: sequence " + std::to_string(s) + " uses block " + std::to_string(blk) +
                              " outside the pool [0, " + std::to_string(pool_blocks_) + ") (block " +
                              std::to_string(pool_blocks_) + " is the graphs' scratch block)");
    span.table_row = static_cast<int32_t>(s);
    span.table_lease = lease_;
    span.host_table = &span.block_table;
  }
  return fb.validate(lm_.config().vocab_size, pool_blocks_, block_size_);
}

Result<EagerStepInfo> DecodeStepBench::time_eager(const model::ForwardBatch& fb, std::vector<int32_t>* ids) {
  const int64_t b = static_cast<int64_t>(fb.logit_rows.size());
  Tensor picked = be_.alloc(DType::kI32, Shape{b});  // i32 [b]
  Tensor host;
  auto step = [&]() -> Status {
    MX_ASSIGN_OR_RETURN(model::ForwardOutput out, lm_.forward(fb, kv_));
    be_.argmax_rows(out.logits, picked);  // f32 [b, V] -> i32 [b], on the device
    host = be_.to_host(picked);           // b ids: the step's only download (it synchronizes)
    return Status::ok();
  };
  EagerStepInfo info;
  const int64_t launches0 = cascade_kernel_launches();
  MX_ASSIGN_OR_RETURN(info.ms, median_ms(step));
  if (launches0 >= 0) info.cascade_launches = cascade_kernel_launches() - launches0;
  if (ids != nullptr) ids->assign(host.data<int32_t>(), host.data<int32_t>() + b);
  return info;
}

Result<GraphStepInfo> DecodeStepBench::time_graph(const model::ForwardBatch& fb, const std::vector<int32_t>* eager_ids) {
  if (graphs_ == nullptr) return internal_error("bench-model: decode graphs were not captured");
  std::string why;
  if (!graphs_->covers(fb, &why))
    return invalid_argument("bench-model --cuda-graph: the decode graphs do not serve the step of " +
                            std::to_string(fb.seqs.size()) + " sequences at context " + std::to_string(step_ctx_) +
                            ": " + why);
  const int64_t b = static_cast<int64_t>(fb.logit_rows.size());
  Tensor picked = be_.alloc(DType::kI32, Shape{b});  // i32 [b]: the argmax after a replay without the tail
  GraphStepInfo info;
  std::vector<int32_t> ids;
  const int64_t replays0 = graphs_->replays();
  // As runtime/model_executor.cpp's run_target + finish: the replay, then the ids from the graph's sampling
  // tail (one download) or from argmax_rows + one download when the graph has no tail.
  auto step = [&]() -> Status {
    runtime::GraphSampleOutput sampled;
    MX_ASSIGN_OR_RETURN(model::ForwardOutput out, graphs_->run(fb, nullptr, &sampled));
    info.tail = sampled.tail;
    if (sampled.tail) {
      ids = std::move(sampled.argmax);
    } else {
      be_.argmax_rows(out.logits, picked);
      const Tensor host = be_.to_host(picked);
      ids.assign(host.data<int32_t>(), host.data<int32_t>() + b);
    }
    return Status::ok();
  };
  MX_ASSIGN_OR_RETURN(info.ms, median_ms(step));
  info.replays = graphs_->replays() - replays0;
  if (eager_ids != nullptr && eager_ids->size() == ids.size()) {
    info.ids_equal_eager = 0;
    for (size_t i = 0; i < ids.size(); ++i) info.ids_equal_eager += ids[i] == (*eager_ids)[i];
  }
  return info;
}

}  // namespace mxserve::cli
