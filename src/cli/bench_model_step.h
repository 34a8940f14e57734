// bench_model_step: the truncated model's decode step as `mxserve bench-model` times it, on two paths:
//   - eager: CausalLM::forward + Backend::argmax_rows on the device + the ids to the host (what the engine's
//     eager step and its device sampler do);
//   - graph: the engine's CUDA-graph path (runtime::DecodeGraphs, laid out as runtime/model_executor.cpp does:
//     buckets up to the largest batch, context classes up to the step's context, one block-table store row past
//     the bench's rows as the scratch row whose one block is the cache's scratch block), replayed with
//     DecodeGraphs::run and the ids taken as ModelExecutor's finish() takes them (from the graph's sampling tail
//     when it has one, else argmax_rows + one download after the replay).
// Each: 3 warm-up steps, then the median of 10 host-timed steps (every step ends with the ids on the host).
// Invariants: the bench's sequences use blocks [0, pool_blocks) and store rows [0, max_batch); block pool_blocks
// and store row max_batch belong to the graphs' padded rows only (checked per batch: validate() against
// pool_blocks, as the engine validates a batch before a replay).
// Owns: the step's batches, block-table rows and timing loops. Does not own: the byte / FLOP roofline
// (cmd_bench_model.cpp), the graphs (runtime/decode_graphs.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "kvcache/kv_cache.h"
#include "model/causal_lm.h"
#include "model/forward_batch.h"
#include "runtime/decode_graphs.h"

namespace mxserve::cli {

constexpr int kStepWarmup = 3, kStepTimed = 10;  // steps per path and batch: warm-up, then timed (median)

// b sequences with n_tokens rows each, ending at KV length ctx, blocks laid out consecutively from block 0;
// token ids below min(vocab, 1000). shared_blocks > 0 (--shared-prefix): sequences s of group s / prefix_group
// share their first shared_blocks blocks (as the radix cache hands a cached prefix to every request that hits
// it). Blocks used: n_groups x shared_blocks + b x (blocks - shared_blocks) <= b x ceil(ctx / block_size).
model::ForwardBatch make_bench_batch(int64_t b, int64_t ctx, int64_t n_tokens, int64_t block_size, bool logits,
                                     int64_t vocab, int64_t shared_blocks = 0, int64_t prefix_group = 1);

// What the step's cascade (shared-prefix) rule decides for a batch: the groups model::cascade_groups finds
// among its decode rows and whether they save enough K/V reads per layer (Backend::cascade_attention_min_saved_
// bytes; the bf16 bytes per key both the eager batch builder and DecodeGraphs::run count). A host-side
// prediction from the same functions the two paths call: neither path reports what it took.
struct CascadeDecision {
  bool enabled = false;  // Backend::cascade_attention_enabled() and a shape the cascade kernels serve
  std::string off_reason;  // why not enabled
  int64_t groups = 0, members = 0, shared_keys = 0;  // groups, rows in them, the largest group's shared keys
  int64_t saved_bytes = 0, min_saved_bytes = 0;      // per layer
  bool taken = false;    // enabled, >= 2 rows, groups that pay
  std::string describe() const;
};
CascadeDecision cascade_decision(const model::ForwardBatch& fb, const backend::Backend& be,
                                 const model::ModelConfig& c, int64_t block_size);

// Host calls of the CUDA cascade attention kernel so far (kernels/cuda/attention/cascade_attention.h: an eager
// step counts one per attention layer that took it, a graph capture once, replays not); -1 without CUDA.
int64_t cascade_kernel_launches();

struct EagerStepInfo {
  double ms = 0;                  // median step
  int64_t cascade_launches = -1;  // cascade kernel calls over the warm-up + timed steps (-1: not a CUDA build)
};

struct GraphStepInfo {
  double ms = 0;                  // median step
  bool tail = false;              // the ids came from the graph's sampling tail (else argmax after the replay)
  int64_t replays = 0;            // DecodeGraphs::replays() added by this batch's steps
  int64_t ids_equal_eager = -1;   // rows whose greedy id equals the eager step's (-1: not compared)
};

class DecodeStepBench {
 public:
  // max_batch: the largest batch timed; step_ctx: the step's KV length; pool_blocks: the blocks sequences may
  // use (the cache holds pool_blocks + 1: the last is the graphs' scratch block).
  DecodeStepBench(model::CausalLM& lm, backend::Backend& be, kvcache::KvCache& kv, int64_t max_batch,
                  int64_t step_ctx, int64_t block_size, int64_t pool_blocks);
  // The cache's block-table store: max_batch rows + the scratch row (synced to the scratch block).
  Status enable_block_tables();
  // runtime::DecodeGraphs over the store; logs the graphs captured and the seconds taken (stderr).
  Status capture_graphs();
  bool has_graphs() const { return graphs_ != nullptr; }
  // Cascade kernel calls while capturing (the graphs whose attention holds the kernel; -1: not a CUDA build).
  int64_t capture_cascade_launches() const { return capture_cascade_launches_; }

  // Gives fb's sequences store rows 0..b-1 under a fresh lease (host_table: each span's own block_table, so
  // fb must not be copied or moved afterwards) and checks it: at most max_batch sequences, every block in
  // [0, pool_blocks) (never the scratch block), ForwardBatch::validate against the pool as the engine does.
  Status assign_rows(model::ForwardBatch& fb);
  // The eager step; *ids (when given): the last step's greedy ids.
  Result<EagerStepInfo> time_eager(const model::ForwardBatch& fb, std::vector<int32_t>* ids = nullptr);
  // The graph step; an error naming why when DecodeGraphs::covers refuses the batch. eager_ids (when given):
  // compared with the replay's ids (GraphStepInfo::ids_equal_eager).
  Result<GraphStepInfo> time_graph(const model::ForwardBatch& fb, const std::vector<int32_t>* eager_ids = nullptr);

 private:
  model::CausalLM& lm_;
  backend::Backend& be_;
  kvcache::KvCache& kv_;
  int64_t max_batch_, step_ctx_, block_size_, pool_blocks_;
  uint64_t lease_ = 0;
  int64_t capture_cascade_launches_ = -1;
  std::unique_ptr<runtime::DecodeGraphs> graphs_;
};

}  // namespace mxserve::cli
