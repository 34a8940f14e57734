// DecodeGraphs: CUDA graphs of the target model's decode forward, one per (batch bucket, rows per sequence,
// context class), captured at start-up and replayed with the step's metadata. Rows per sequence q = 1 + N:
// q = 1 is a plain decode step, q > 1 a speculative verify step (x_last then N drafts per sequence, every row
// a logit row; docs/design/cuda-graphs.md "MTP draft and verify steps"): chain buckets for N = 1..max_drafts,
// tree buckets (tree masks) for each tree size the speculation config can verify.
// Invariants (what makes a replay equal to the eager forward of the same rows):
//   - every input lives in a static device buffer of the graph, i32 [5, B q] (ids, positions, table row,
//     kv index, slot; tree buckets add the tree base row and an i64 [B q] mask buffer), written by stream-
//     ordered copies before the replay (runtime/graph_rows.h stages them); the block tables are the KV cache's
//     persistent store (same device tensor for the graph's life);
//   - every temporary comes from the backend's graph-private pool (Backend::capture_graph);
//   - nothing captured depends on host values that change between replays: the attention split plan is the
//     one for the class's context bound (the kernels read each row's kv index from device memory), the MoE
//     and GEMM choices depend only on the bucket's row count;
//   - a batch's rows are staged compactly into rows [0, T) (graph_rows.h), so a bucket (B, q) serves any
//     batch of <= B sequences of <= q rows each (uneven draft counts included); padding rows [T, B q) run
//     token 0 at position 0 on the store's scratch row, whose one block is the KV cache's scratch block: they
//     write and read only the scratch slot, and their logits and hidden rows are ignored;
//   - cascade graphs (q = 1, B >= 2, Backend::cascade_attention_enabled): the prefix groups live in a per-graph
//     i32 buffer of fixed capacity (B rows, the model's q heads per kv head, the class's context as the prefix
//     bound), rewritten before each replay with the groups the eager rule would take (forward_batch.cpp: enough
//     K/V bytes saved); no group = every row through the per-warp decode kernel's own splits, bit-identical;
//   - outputs go to two static buffers shared by every graph (one replay at a time): logits f32 [rows, V] and
//     the post-norm hidden states [rows, H]; a replay's views are valid until the next replay, so the engine
//     reads them (argmax, host logits, the MTP extend's gather) before its next target step.
// Under DP (the model's CausalLM::device_row_groups() = dp > 1; runtime/dp_graph_rows.h): a bucket (B, q) holds
// dp slot ranges of B q rows, one per DP group, each group's rows staged compactly in its own range and padded;
// the bucket is picked by the fullest group; after the replay the rows are gathered back into the batch's order
// (eager gathers: the logits / hidden returned are fresh tensors, not views of the static buffers); no cascade
// buffer.
//   - plain decode buckets (q = 1, no tree) end with the sampling tail when GraphSampler is on
//     (runtime/graph_sampler.h): the argmax of every row and the device sampler over the bucket's slots,
//     reading per-slot parameters the host writes before the replay like the input rows.
// Mixed / prefill steps run eagerly; MTP steps have their own graphs (runtime/mtp_graphs.h).
// Capture order: the graphs go into the device's memory outside the KV pool (launch/launch_memory.h), which a
// layout may fill before every shape has its graph (eight stand-in ranks at --gpu-memory-utilization 0.9). So
// they are captured covering-first (graph_capture_order: the longest context class, then the most rows per
// sequence, then the largest bucket), and a capture that runs out of memory after the first graph stops the
// capture and keeps what it has, said once, loudly: the first graph of a family serves every step of it (padded),
// each next one serves some steps tighter. Out of memory at the first graph: the graphs are off (the engine says
// so). The backend refuses an instantiation that would leave the device under its floor
// (backend/graph_memory_floor.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kvcache/kv_cache.h"
#include "model/causal_lm.h"
#include "model/forward_batch.h"
#include "runtime/graph_rows.h"
#include "runtime/graph_sampler.h"

namespace mxserve::runtime {

struct DecodeGraphLayout {
  int64_t max_batch = 0;      // largest bucket (the engine's max running sequences)
  int32_t max_drafts = 0;     // chain verify graphs for N = 1..max_drafts drafts per sequence (0: decode only)
  std::vector<int32_t> tree_rows;  // tree verify graphs: rows per sequence (1 + tree nodes) of each tree size
  int64_t block_size = 16;
  int32_t scratch_row = -1;   // store row of padded rows (its column 0 holds scratch_block)
  int32_t scratch_block = -1;  // a KV block no sequence is ever given
};

// Batch buckets 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, then every 64, up to max_batch (always included).
std::vector<int64_t> decode_graph_buckets(int64_t max_batch);
// Context classes 128 (one attention split at most), 256, 512, ... doubling, the last one max_context.
std::vector<int64_t> decode_graph_contexts(int64_t max_context);
// The keys of one family in capture order: contexts descending, then q descending, then buckets descending.
std::vector<GraphKey> graph_capture_order(const std::vector<int64_t>& qs, const std::vector<int64_t>& buckets,
                                          const std::vector<int64_t>& contexts);

class DecodeGraphs {
 public:
  DecodeGraphs(model::CausalLM& model, backend::Backend& be, kvcache::KvCache& kv, const DecodeGraphLayout& layout);
  // Captures every (rows per sequence, bucket, context class), chain then tree, in capture order; logs the count
  // and time. Out of device memory part-way: keeps the graphs captured (ran_short() names where it stopped).
  Status capture();
  // Empty when every planned graph was captured; else the shape at which the device ran out and why.
  const std::string& ran_short() const { return ran_short_; }
  // Whether the graphs run this batch: at most max_batch sequences in row order, store rows, each of at most
  // 1 + max_drafts rows (no tree) or at most the largest tree size (tree masks), every row a logit row in
  // order, within the largest context class. Hidden states may be wanted (always produced). Otherwise *why
  // (when given) names what has no bucket.
  bool covers(const model::ForwardBatch& batch, std::string* why = nullptr) const;
  // Syncs the block tables, writes the inputs, replays the smallest fitting graph. logits [T, V] and, when
  // batch.want_hidden, hidden [T, H] (views of the static outputs: valid until the next replay).
  // `sample`: the step's device-sampled rows (ModelExecutor::sample's input, logit rows = the batch's rows);
  // a graph with the sampling tail stages them and fills *sampled (argmax, and the rows when it took them).
  Result<model::ForwardOutput> run(const model::ForwardBatch& batch, const kernels::SampleRowsInput* sample = nullptr,
                                   GraphSampleOutput* sampled = nullptr);
  int64_t n_graphs() const { return static_cast<int64_t>(plain_.size() + tree_.size()); }
  int64_t replays() const { return replays_; }
  int64_t verify_replays() const { return verify_replays_; }  // chain buckets with q > 1 (chain verify steps)
  int64_t tree_replays() const { return tree_replays_; }      // tree buckets (tree verify steps)
  int64_t sampled_replays() const { return sampler_ ? sampler_->sampled_replays() : 0; }  // rows sampled in the graph

 private:
  struct Graph {
    GraphKey key;
    bool tree = false;
    Tensor inputs;  // i32 [5, batch q] (tree: [6, batch q]): ids, positions, table rows, kv indices, slots, tree base
    Tensor mask;    // tree buckets: i64 [batch q] tree masks
    // Cascade (shared-prefix) decode attention, q = 1 graphs of >= 2 sequences where the backend runs it:
    // i32 [cascade_shape.n_ints()], the prefix groups of each replay's rows (kernels/cascade_attention.h).
    Tensor cascade;
    kernels::CascadeShape cascade_shape;
    std::unique_ptr<backend::DeviceGraph> graph;
    bool tail = false;  // ends with the sampling tail (runtime/graph_sampler.h)
  };
  Status capture_one(bool tree, const GraphKey& key);
  static void sort_family(std::vector<Graph>& graphs, std::vector<GraphKey>& keys);

  model::CausalLM& model_;
  backend::Backend& be_;
  kvcache::KvCache& kv_;
  DecodeGraphLayout layout_;
  std::vector<Graph> plain_, tree_;           // by (q, batch, context) ascending
  std::vector<GraphKey> plain_keys_, tree_keys_;
  Tensor logits_;              // f32 [max rows, V]: every graph writes rows [0, batch q)
  Tensor hidden_;              // [max rows, H] activation dtype: the post-norm hidden rows
  std::vector<int32_t> host_;  // staging of one replay's inputs
  std::vector<int64_t> host_mask_;
  std::vector<int32_t> cascade_host_;  // staging of one replay's cascade buffer
  int dp_ = 1;                         // the model's DP groups (CausalLM::device_row_groups; dp_graph_rows.h)
  std::vector<int32_t> row_slot_;      // DP: the slot of each row of the replayed batch
  Tensor slots_;                       // DP: i32 [max rows] on the device, row_slot_ for the gathers
  std::unique_ptr<GraphSampler> sampler_;  // the sampling tail's buffers (null: MXSERVE_GRAPH_SAMPLING=0 / not CUDA)
  int64_t replays_ = 0;
  int64_t verify_replays_ = 0;
  int64_t tree_replays_ = 0;
  std::string ran_short_;  // capture(): where the device ran out of memory (empty: every graph captured)
};

}  // namespace mxserve::runtime
