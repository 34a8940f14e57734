// MtpGraphs: CUDA graphs of the MTP draft chain's continuation steps (chain steps >= 2: one row per sequence,
// each fed its previous draft and the MTP layer's own previous hidden state), one per (batch bucket, context
// class), captured at start-up beside the decode graphs (runtime/decode_graphs.h) and replayed by
// ModelExecutor::execute_mtp. The first draft step (the MTP extend: accepted + 1 rows per sequence, a
// different count per sequence) and tree draft steps run eagerly.
// Invariants (what makes a replay equal to the eager forward_mtp of the same rows), beyond the decode graphs':
//   - inputs in static device buffers: i32 [7, B] (ids, positions, table row, kv index, slot, the row's
//     first-step row, the identity 0..B-1) and hidden_in [B, H], filled before the replay by one host write
//     and one device gather (the step's hidden rows into hidden_in's rows [0, S));
//   - what a row reuses from its chain's first step (glm_moe_dsa's index_share_for_mtp_iteration top-k) is
//     staged eagerly into the model's persistent buffer (CausalLM::stage_mtp_chain, one gather) before the
//     replay; the graph reads only that buffer, never the first step's per-forward tensors;
//   - padded rows (S..B-1) run token 0 at position 0 on the scratch row / slot with a finite hidden_in row
//     (zeros, or an earlier step's): they write only the scratch slot of the MTP layer's cache;
//   - outputs: logits f32 [max_batch, V] and hidden [max_batch, H], static, shared by these graphs; a
//     replay's views are valid until the next MTP replay (the drafter reads the argmax / host logits and
//     gathers the hidden rows before it).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "kvcache/kv_cache.h"
#include "model/causal_lm.h"
#include "model/forward_batch.h"
#include "runtime/decode_graphs.h"

namespace mxserve::runtime {

class MtpGraphs {
 public:
  // layout: the decode graphs' (max_batch, block size, scratch row / block); max_drafts is not used.
  MtpGraphs(model::CausalLM& model, backend::Backend& be, kvcache::KvCache& kv, const DecodeGraphLayout& layout);
  // Reserves the model's chain buffers, captures every (bucket, context class); logs the count and time.
  Status capture();
  // Whether the graphs run this MTP forward: a chain continuation (batch.mtp_step names a first-step row per
  // row), one row per sequence in order, every row a logit row, store rows, no tree / KV-index override, at
  // most max_batch sequences within the largest context class, hidden_in [S, H].
  bool covers(const model::ForwardBatch& batch, const Tensor& hidden_in) const;
  // Syncs the block tables, writes the inputs, stages the chain state, replays the smallest fitting graph.
  // logits [S, V] and hidden [S, H]: views of the static outputs.
  Result<model::ForwardOutput> run(const model::ForwardBatch& batch, const Tensor& hidden_in);
  int64_t n_graphs() const { return static_cast<int64_t>(graphs_.size()); }
  int64_t replays() const { return replays_; }

 private:
  struct Graph {
    int64_t batch = 0;
    int64_t context = 0;
    Tensor inputs;     // i32 [7, batch]
    Tensor hidden_in;  // [batch, H] activation dtype
    std::unique_ptr<backend::DeviceGraph> graph;
  };
  const Graph* find(int64_t batch, int64_t context) const;

  model::CausalLM& model_;
  backend::Backend& be_;
  kvcache::KvCache& kv_;
  DecodeGraphLayout layout_;
  std::vector<Graph> graphs_;  // by (batch, context) ascending
  Tensor logits_;              // f32 [max_batch, V]
  Tensor hidden_;              // [max_batch, H]: the MTP layer's output hidden rows
  std::vector<int32_t> host_;
  int64_t replays_ = 0;
};

}  // namespace mxserve::runtime
