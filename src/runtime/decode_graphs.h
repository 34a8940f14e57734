// DecodeGraphs: CUDA graphs of the target model's decode forward, one per (batch bucket, rows per sequence,
// context class), captured at start-up and replayed with the step's metadata. Rows per sequence q = 1 + N:
// q = 1 is a plain decode step, q > 1 a chain speculative verify step (x_last then N drafts per sequence, every
// row a logit row; docs/design/cuda-graphs.md "MTP draft and verify steps").
// Invariants (what makes a replay equal to the eager forward of the same rows):
//   - every input lives in a static device buffer of the graph, i32 [5, B q] (ids, positions, table row,
//     kv index, slot), written by one stream-ordered copy before the replay; the block tables are the KV
//     cache's persistent store (same device tensor for the graph's life);
//   - every temporary comes from the backend's graph-private pool (Backend::capture_graph);
//   - nothing captured depends on host values that change between replays: the attention split plan is the
//     one for the class's context bound (the kernels read each row's kv index from device memory), the MoE
//     and GEMM choices depend only on the bucket's row count;
//   - cascade graphs (q = 1, B >= 2, Backend::cascade_attention_enabled): the prefix groups live in a per-graph
//     i32 buffer of fixed capacity (B rows, the model's q heads per kv head, the class's context as the prefix
//     bound), rewritten before each replay with the groups the eager rule would take (forward_batch.cpp: enough
//     K/V bytes saved); no group = every row through the per-warp decode kernel's own splits, bit-identical;
//   - padded rows (sequences S..B-1 of a bucket) run token 0 at position 0 on the store's scratch row, whose
//     one block is the KV cache's scratch block: they write and read only the scratch slot, and their logits
//     and hidden rows are ignored;
//   - outputs go to two static buffers shared by every graph (one replay at a time): logits f32 [rows, V] and
//     the post-norm hidden states [rows, H]; a replay's views are valid until the next replay, so the engine
//     reads them (argmax, host logits, the MTP extend's gather) before its next target step.
// Tree verify steps (tree masks), mixed / prefill steps and MTP steps run eagerly (MTP continuation steps
// have their own graphs: runtime/mtp_graphs.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "kvcache/kv_cache.h"
#include "model/causal_lm.h"
#include "model/forward_batch.h"

namespace mxserve::runtime {

struct DecodeGraphLayout {
  int64_t max_batch = 0;      // largest bucket (the engine's max running sequences)
  int32_t max_drafts = 0;     // chain verify graphs for N = 1..max_drafts drafts per sequence (0: decode only)
  int64_t block_size = 16;
  int32_t scratch_row = -1;   // store row of padded rows (its column 0 holds scratch_block)
  int32_t scratch_block = -1;  // a KV block no sequence is ever given
};

// Batch buckets 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, then every 64, up to max_batch (always included).
std::vector<int64_t> decode_graph_buckets(int64_t max_batch);
// Context classes 128 (one attention split at most), 256, 512, ... doubling, the last one max_context.
std::vector<int64_t> decode_graph_contexts(int64_t max_context);

class DecodeGraphs {
 public:
  DecodeGraphs(model::CausalLM& model, backend::Backend& be, kvcache::KvCache& kv, const DecodeGraphLayout& layout);
  // Captures every (rows per sequence, bucket, context class); logs the count and the time taken.
  Status capture();
  // Whether the graphs run this batch: S sequences of q rows each (q - 1 in [0, max_drafts]), in order, every
  // row a logit row, store rows, KV indices consecutive (no override), no tree, at most max_batch sequences
  // within the largest context class. Hidden states may be wanted (always produced).
  bool covers(const model::ForwardBatch& batch) const;
  // Syncs the block tables, writes the inputs, replays the smallest fitting graph. logits [S q, V] and, when
  // batch.want_hidden, hidden [S q, H] (views of the static outputs: valid until the next replay).
  Result<model::ForwardOutput> run(const model::ForwardBatch& batch);
  int64_t n_graphs() const { return static_cast<int64_t>(graphs_.size()); }
  int64_t replays() const { return replays_; }
  int64_t verify_replays() const { return verify_replays_; }  // replays with q > 1 (chain verify steps)

 private:
  struct Graph {
    int64_t batch = 0;    // sequences (bucket)
    int64_t q = 1;        // rows per sequence
    int64_t context = 0;
    Tensor inputs;  // i32 [5, batch q]: ids, positions, table rows, kv indices, slots
    // Cascade (shared-prefix) decode attention, q = 1 graphs of >= 2 sequences where the backend runs it:
    // i32 [cascade_shape.n_ints()], the prefix groups of each replay's rows (kernels/cascade_attention.h).
    Tensor cascade;
    kernels::CascadeShape cascade_shape;
    std::unique_ptr<backend::DeviceGraph> graph;
  };
  const Graph* find(int64_t batch, int64_t q, int64_t context) const;

  model::CausalLM& model_;
  backend::Backend& be_;
  kvcache::KvCache& kv_;
  DecodeGraphLayout layout_;
  std::vector<Graph> graphs_;  // by (q, batch, context) ascending
  Tensor logits_;              // f32 [max_batch (1 + max_drafts), V]: every graph writes rows [0, batch q)
  Tensor hidden_;              // [max_batch (1 + max_drafts), H] activation dtype: the post-norm hidden rows
  std::vector<int32_t> host_;  // staging of one replay's inputs
  std::vector<int32_t> cascade_host_;  // staging of one replay's cascade buffer
  int64_t replays_ = 0;
  int64_t verify_replays_ = 0;
};

}  // namespace mxserve::runtime
