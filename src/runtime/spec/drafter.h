// Drafter: the MTP (NextN) draft stage of speculative decoding and its adaptive draft-length policy.
// Each step, after the target's forward:
//   1. extend: the MTP layer runs over every position p the target just computed, with token x_{p+1} and the
//      target's post-norm hidden state h_p (its own KV layer, the target's positions), so its KV stays caught
//      up; the last row of a decoding sequence proposes the first draft;
//   2. draft: chain mode (topk 1) runs N-1 more MTP steps, each fed the previous draft and the MTP layer's own
//      hidden state; tree mode (drafter_tree.cpp) expands the best topk frontier nodes per step (EAGLE-2).
//      Chain steps name each row's extend row (ForwardBatch::mtp_step, model/forward_batch.h), so a model with
//      index_share_for_mtp_iteration reuses that step's DSA top-k; tree steps do not (they recompute it).
// The drafts are picked from the draft logits processed like the target's (penalties, logit mask: sampler.h)
// and in the verifier's mode (verifier.h): greedy - the processed argmax; seeded - a draw with the very RNG
// counter the target's token uses (so a draft that agrees with the target is accepted); unseeded - a draw from
// q, kept for rejection sampling. MTP KV writes of drafts are tentative: the next extend rewrites them.
// Sequences get `drafts` (+ draft_q, draft_parents) for the next step; KV room is reserved through the
// scheduler (no room: that sequence decodes plainly this step).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/status.h"
#include "runtime/executor.h"
#include "runtime/scheduler.h"
#include "runtime/sequence.h"
#include "runtime/spec/speculative.h"

namespace mxserve::runtime {

// Positions the target just computed for one sequence, for the MTP layer to catch up over.
struct MtpRows {
  Sequence* seq;
  int32_t first_pos;          // positions [first_pos, last_pos]
  int32_t last_pos;
  int32_t first_row;          // row of first_pos in the target batch (hidden states)
  std::vector<int32_t> rows;  // tree verify: explicit hidden row per position (the accepted path); empty: consecutive
};

// The draft row `row` processed like the target's at the position after seq's output + `extra` (the drafts
// before it); nullopt when the row holds a NaN or allows no token (the drafter stops proposing there).
std::optional<std::vector<float>> processed_draft_row(const Sequence& seq, std::span<const float> row,
                                                      std::span<const int32_t> extra);

class Drafter {
 public:
  Drafter(const SpecConfig& config, int64_t token_budget, ModelExecutor& executor, Scheduler& scheduler);

  // Chooses N for the next step (the policy), extends the MTP layer over `rows` and drafts for the decoding
  // sequences among them. target_hidden: [T, H] the target forward's hidden states, on the backend.
  Status extend_and_draft(const std::vector<MtpRows>& rows, const Tensor& target_hidden);

  // Called at the start of every engine step (the step's timing starts afresh).
  void begin_step() { extend_seconds_ = 0; }
  // N the latest draft stage chose (verified by the next step); -1 before the first.
  int32_t current_steps() const { return last_n_; }
  // One verified sequence: `depth` positions judged, the first `accepted` accepted.
  void record_verdict(int32_t depth, int32_t accepted) { policy_.record(depth, accepted); }
  // One pure decode step's wall time, which verified `n_verified` drafts per sequence for `n_decoding` of them.
  void record_step(int32_t n_verified, int64_t n_decoding, double seconds) {
    policy_.record_step(n_verified, n_decoding, seconds, extend_seconds_);
  }
  const SpecPolicy& policy() const { return policy_; }

 private:
  // root_rows[i]: sequence i's logit row in `extend` (the MTP extend); root_hidden[i] its row in extend.hidden.
  Status draft_chain(const std::vector<Sequence*>& seqs, const std::vector<int32_t>& root_rows,
                     const std::vector<int32_t>& root_hidden, const ExecOutput& extend, int32_t n_steps);
  Status draft_tree(const std::vector<Sequence*>& seqs, const std::vector<int32_t>& root_rows,
                    const std::vector<int32_t>& root_hidden, const ExecOutput& extend, int32_t n_steps);

  SpecConfig config_;
  int64_t token_budget_;
  ModelExecutor& executor_;
  Scheduler& scheduler_;
  SpecPolicy policy_;
  int32_t last_n_ = -1;
  double extend_seconds_ = 0;  // this step's timed MTP extend at N = 0 (see SpecPolicy::record_step)
};

}  // namespace mxserve::runtime
