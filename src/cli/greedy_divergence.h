// Two engine configurations' greedy outputs judged by the format bound (issue 31 item 2, issue 33 item 1). In exact
// arithmetic configuration A (e.g. plain decoding, per-sequence attention) and B (speculative decoding, cascade
// attention) give the same greedy tokens; on a bf16 backend they round differently, so where the reference's two
// best tokens are closer than bf16 rounding can resolve the two runs may legitimately part. For each request whose
// outputs differ, the FIRST differing token is judged on the CPU fp32 reference (the checkpoint in dir, teacher-
// forced over the prompt and the common output prefix): its logit margin between the two tokens against
// u x (sum_i |h_i W_ai| + sum_i |h_i W_bi|) (cli/fixture_decisions.h judge_token_flip). A token margin beyond that
// bound can still be rounding one step upstream: an MoE router (or DSA indexer) decision whose reference margin is
// below bf16 noise flips on one path and moves the hidden state by far more than the last matmul's rounding. So
// each run that chose the non-reference token is replayed through its configuration (the caller's GreedyReplay:
// the same requests, batches and engine), twice: as it ran, and with the reference's decisions forced on every row
// of the committed path (model/decisions.h: each flip judged by the whole set against the format bound given the
// reference's upstream decisions). The divergence is legitimate when the forced replay takes the reference's token
// (or one within the token bound) and every decision the replay flipped is within its format bound; otherwise it is
// a bug. Decisions are observed only in eager forwards: a configuration that runs CUDA graphs replays eagerly (its
// `reproduced` flag says whether that replay still makes the divergent choice; if not, the divergence is a bug).
//
// Committed path (CommittedPathTracker): a row is on it when its token is the committed token at its position AND
// its whole context is -- earlier rows of its batch span (tree rows: their mask's ancestors), the positions its
// sequence computed in earlier forwards, and, for a sequence that starts past position 0 (a prefix-cache hit),
// the cached KV slots, which must have been written by committed-path rows at the same positions. Sequences are
// told apart by their block-table lease (engine batches); a hand-built batch without one is one sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/causal_lm.h"
#include "model/forward_batch.h"

namespace mxserve::cli {

// One run replayed up to the divergent token, as it ran and with the reference's decisions forced on the committed
// path.
struct DecisionReplay {
  bool ran = false;             // replayed (only a run whose token is not the reference's argmax is)
  int32_t token_as_ran = -1;    // the replay's token at the divergence without forcing (should be the run's own)
  int32_t token_forced = -1;    // ... with the reference's decisions forced
  bool forced_within_token_bound = false;  // token_forced is the reference's, or within judge_token_flip's bound
  int64_t rows_compared = 0;    // committed-path rows x sites compared with the reference
  int64_t flips = 0;            // decisions that differed from the reference's (judged with upstream forced)
  int64_t flips_beyond = 0;     // ... of them beyond the format bound
  double worst_ratio = 0;       // max over flips of distance / bound (judge_row)
  bool reproduced = false;      // token_as_ran is the run's own token (the replay is faithful)
  std::string worst_flip;       // "routing layer 1 position 203: {2, 5} vs reference {2, 7}; ..."
  // The divergence is explained by decisions that rounding may flip.
  bool explained() const {
    return ran && reproduced && flips > 0 && flips_beyond == 0 && forced_within_token_bound;
  }
};

// The first divergence of one request between configurations A and B.
struct GreedyDivergence {
  std::string a_name = "A", b_name = "B";  // the configurations, for describe()
  size_t prompt = 0;         // the request
  int64_t index = 0;         // first generated token that differs
  int32_t a = -1, b = -1;    // each configuration's token there
  int32_t reference = -1;    // the reference's argmax at that point
  double margin = 0, bound = 0;  // the reference's logit margin between the two tokens, and the format bound
  DecisionReplay a_replay, b_replay;  // filled when margin > bound
  bool within_bound() const { return margin <= bound; }
  double ratio() const { return bound > 0 ? margin / bound : (margin <= 0 ? 0.0 : 1e30); }
  // Legitimate: within the token bound, or every run that left the reference's token is explained by flips of
  // decisions within their format bound.
  bool legitimate() const {
    if (within_bound()) return true;
    if (a != reference && !a_replay.explained()) return false;
    if (b != reference && !b_replay.explained()) return false;
    return true;
  }
};

// Reruns one configuration on `model` (the judge's decorator around the caller's model: it must be the model the
// engine runs, every forward through it) and returns the greedy tokens of request `request`. The rerun must
// submit the same requests in the same order as the judged run, so its batches are the same.
using GreedyReplay = std::function<Result<std::vector<int32_t>>(model::CausalLM& model, size_t request)>;

struct GreedyConfig {
  std::string name;                   // "plain", "cascade", ... (describe)
  model::CausalLM* model = nullptr;   // the model the configuration runs; its replays run the judge's decorator of it
  GreedyReplay replay;                // used only for a divergence beyond the token bound
};

// The first divergence of every request whose outputs under A and B differ, judged on the model in dir loaded on
// the CPU backend (f32) with unit roundoff u (bf16: model::kBf16UnitRoundoff). A divergence beyond the token bound
// replays each configuration whose token is not the reference's (see the header comment). Errors: outputs of
// different lengths that agree up to the shorter one, a reference that cannot be loaded, a replay that fails or
// generates fewer tokens than the divergence index.
Result<std::vector<GreedyDivergence>> judge_greedy_divergences(const std::string& dir,
                                                               const std::vector<std::vector<int32_t>>& prompts,
                                                               const std::vector<std::vector<int32_t>>& outputs_a,
                                                               const std::vector<std::vector<int32_t>>& outputs_b,
                                                               const GreedyConfig& a, const GreedyConfig& b, double u);

// One line per divergence: the tokens, the margin, the bound and their ratio, the replays, the verdict.
std::string describe(const GreedyDivergence& d);

// For each row of an engine batch: its position when the row's token is committed[position] and so are its
// ancestors in the batch (earlier rows of a causal span, the tree mask's ancestors of a tree row), else -1. Context
// outside the batch is not looked at (CommittedPathTracker does).
std::vector<int32_t> committed_path_positions(const model::ForwardBatch& b, const std::vector<int32_t>& committed);

// committed_path_positions over a whole run: also requires each row's context outside its batch to be on the
// committed path (see the header comment). Feed it every target forward of the run, in order.
class CommittedPathTracker {
 public:
  explicit CommittedPathTracker(const std::vector<int32_t>& committed) : committed_(committed) {}
  // Each row's position when it is on the committed path, else -1; records what the batch writes (block_size: the
  // KV cache's tokens per block).
  std::vector<int32_t> rows(const model::ForwardBatch& b, int64_t block_size);

 private:
  struct BlockMark {
    int64_t logical = -1;  // the block's index in the sequence whose committed-path rows wrote it
    int64_t filled = 0;    // leading slots written by committed-path rows at their positions
  };
  // How many leading KV positions of s's blocks (of the first n) hold committed-path content.
  int64_t cached_prefix(const model::SequenceSpan& s, int64_t n, int64_t block_size) const;
  void record_write(const model::SequenceSpan& s, int64_t kv_index, bool on_path, int64_t block_size);

  const std::vector<int32_t>& committed_;
  std::map<std::pair<int32_t, uint64_t>, int64_t> path_len_;  // (table row, lease) -> committed-path prefix length
  std::unordered_map<int32_t, BlockMark> blocks_;
};

}  // namespace mxserve::cli
