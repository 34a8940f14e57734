// MtpGraphs: CUDA graphs of the MTP draft stage, captured at start-up beside the decode graphs
// (runtime/decode_graphs.h) and replayed by ModelExecutor::execute_mtp. Three families, each per (batch
// bucket, rows per sequence, context class):
//   - chain: the draft chain's continuation steps (chain steps >= 2: one row per sequence, each fed its previous
//     draft and the MTP layer's own previous hidden state);
//   - extend: the MTP extend (the first draft step: the MTP layer over every position the target just computed,
//     accepted + 1 rows per sequence, a different count per sequence), rows per sequence 1..extend_rows; its
//     body has no head: a separate head graph per batch bucket gathers the logit rows' hidden states and runs
//     lm_head, replayed only when the extend has logit rows (an extend at N = 0 keeps only the draft KV);
//   - tree: tree draft steps (the frontier's rows, at most topk per sequence, tree masks in device buffers).
// Invariants (what makes a replay equal to the eager forward_mtp of the same rows), beyond the decode graphs':
//   - inputs in static device buffers: i32 [fields, B q] staged by runtime/graph_rows.h (rows compact in the
//     batch's order, padding rows on the scratch row / slot), plus (chain) each row's first-step row, the
//     identity 0..B q-1, (tree) the i64 mask buffer; hidden_in [B q, H] per family, filled by one device gather
//     of the step's hidden rows into its rows [0, T);
//   - what a continuation row reuses from its chain's first step (glm_moe_dsa's index_share_for_mtp_iteration
//     top-k) is staged eagerly into the model's persistent buffer (CausalLM::stage_mtp_chain) before the replay;
//     an extend writes it into the model's persistent first-step buffer and commit_mtp_extend makes it current
//     after the replay (as an eager extend leaves it), so eager and replayed steps mix freely;
//   - padding rows (T..B q-1) run token 0 at position 0 on the scratch row / slot with a finite hidden_in row
//     (zeros, or an earlier step's): they write only the scratch slot of the MTP layer's cache;
//   - outputs: each family's static logits f32 [rows, V] and hidden [rows, H]; a replay's views are valid until
//     the next replay of that family (the drafter reads the argmax / host logits and gathers the hidden rows
//     before it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kvcache/kv_cache.h"
#include "model/causal_lm.h"
#include "model/forward_batch.h"
#include "runtime/decode_graphs.h"
#include "runtime/graph_rows.h"

namespace mxserve::runtime {

// Which MTP steps get graphs.
struct MtpGraphShapes {
  bool chain = false;        // chain continuation steps (chain speculation with >= 2 drafts)
  int32_t extend_rows = 0;   // extend graphs for 1..extend_rows rows per sequence (0: none)
  int32_t tree_rows = 0;     // tree draft-step graphs of up to this many rows per sequence (topk; 0: none)
};

class MtpGraphs {
 public:
  enum class Family { kChain = 0, kExtend, kTree };

  // layout: the decode graphs' (max_batch, block size, scratch row / block); max_drafts / tree_rows unused.
  MtpGraphs(model::CausalLM& model, backend::Backend& be, kvcache::KvCache& kv, const DecodeGraphLayout& layout,
            const MtpGraphShapes& shapes);
  // Reserves the model's persistent buffers, captures every family's (rows, bucket, context class) and the
  // extend's head graphs; logs the counts and time.
  Status capture();
  // Whether the graphs run this MTP forward: a chain continuation (batch.mtp_step names a first-step row per
  // row, one row per sequence), a tree step (tree masks, <= tree_rows rows per sequence) or an extend (no
  // mtp_step, no tree, <= extend_rows rows per sequence, logit rows any <= one per sequence); sequences in row
  // order on store rows, at most max_batch of them within the largest context class, hidden_in [T, H]; chain
  // and tree steps with every row a logit row in order. Otherwise *why (when given) names what has no bucket.
  bool covers(const model::ForwardBatch& batch, const Tensor& hidden_in, std::string* why = nullptr) const;
  // Syncs the block tables, writes the inputs, stages / commits the chain state, replays the smallest fitting
  // graph (and the extend's head graph when it has logit rows). logits [len(logit_rows), V] and hidden [T, H]:
  // views of the family's static outputs.
  Result<model::ForwardOutput> run(const model::ForwardBatch& batch, const Tensor& hidden_in);
  int64_t n_graphs() const;
  int64_t replays(Family f) const { return replays_[static_cast<int>(f)]; }

 private:
  struct Graph {
    GraphKey key;
    Tensor inputs;  // i32 [fields + extra, batch q] (graph_rows.h fields; chain: + first-step rows; + identity)
    Tensor mask;    // tree: i64 [batch q]
    std::unique_ptr<backend::DeviceGraph> graph;
  };
  struct Set {
    std::vector<Graph> graphs;  // by (q, batch, context) ascending
    std::vector<GraphKey> keys;
    Tensor hidden_in;           // [max rows, H]: the step's hidden rows, gathered before a replay
    Tensor logits;              // f32 [max rows, V] (extend: unused; its head writes head_logits_)
    Tensor hidden;              // [max rows, H]: the MTP layer's output hidden rows
  };
  struct HeadGraph {
    int64_t batch = 0;
    Tensor rows;  // i32 [batch]: the extend rows whose logits are wanted (padded with row 0)
    std::unique_ptr<backend::DeviceGraph> graph;
  };
  static int fields_of(Family f) { return f == Family::kTree ? kGraphTreeRowFields : kGraphRowFields; }
  static int extra_rows_of(Family f) { return f == Family::kChain ? 2 : 1; }  // (first-step rows,) identity
  std::string family_of(const model::ForwardBatch& batch, const Tensor& hidden_in, Family* family,
                        GraphBatchShape* shape, int64_t* index) const;
  Status capture_family(Family f, const std::vector<int64_t>& qs, const std::vector<int64_t>& buckets,
                        const std::vector<int64_t>& contexts);
  Status capture_heads(const std::vector<int64_t>& buckets);

  model::CausalLM& model_;
  backend::Backend& be_;
  kvcache::KvCache& kv_;
  DecodeGraphLayout layout_;
  MtpGraphShapes shapes_;
  Set sets_[3];
  std::vector<HeadGraph> heads_;  // by batch ascending
  Tensor head_logits_;            // f32 [max_batch, V]: the extend's logit rows
  std::vector<int32_t> host_;
  std::vector<int64_t> host_mask_;
  std::vector<int32_t> host_head_;
  int64_t replays_[3] = {0, 0, 0};
};

}  // namespace mxserve::runtime
