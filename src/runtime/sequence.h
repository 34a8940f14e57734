// Sequence: the engine's state of one request -- its tokens, how many have K/V in the cache, the blocks
// holding them, sampling state and timestamps. Owned by the Engine; scheduled by the Scheduler.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/penalty_tokens.h"
#include "runtime/request.h"
#include "runtime/sampler.h"

namespace mxserve::runtime {

enum class SeqState { kWaiting, kRunning, kFinished };

struct Sequence {
  RequestId id = 0;
  uint64_t admit_order = 0;          // FCFS order of submission; preempted sequences keep theirs
  std::vector<int32_t> tokens;       // prompt + generated
  int32_t prompt_len = 0;
  int32_t n_computed = 0;            // tokens [0, n_computed) have K/V in the cache
  std::vector<int32_t> block_table;  // blocks holding tokens [0, n_computed) (+ reserved room)
  // Its row of the device block-table store while running (kvcache/block_table_store.h); -1 otherwise.
  int32_t table_row = -1;
  uint64_t table_lease = 0;
  int32_t dp_rank = 0;               // the data-parallel rank it runs on (chosen at each admission)
  int32_t cached_tokens = -1;        // prefix-cache hit at first admission; -1 until admitted
  int32_t cached_host_tokens = 0;    // of which loaded back from the host KV tier (same admission)
  int32_t n_preemptions = 0;
  SamplingParams sampling;
  std::shared_ptr<LogitConstraint> constraint;  // structured output (runtime/logit_constraint.h); may be null
  uint64_t seed = 0;                 // per-request default seed (sampling.seed overrides)
  PenaltyTokens penalty_tokens;      // device sampling of penalized requests: the distinct tokens seen so far
  SeqState state = SeqState::kWaiting;
  RequestTimes times;
  EventCallback on_event;

  // Speculative decoding (MTP): the draft layer's KV covers positions [0, n_draft_computed); `drafts`
  // are proposals for the tokens after the last one, verified in the next step; draft_q their draft
  // distributions (sampling mode only).
  int32_t n_draft_computed = 0;
  std::vector<int32_t> drafts;
  std::vector<TokenDistribution> draft_q;
  // Tree mode: draft_parents[i] is the parent of drafts[i] (an earlier index, or -1: the last token);
  // empty in chain mode (drafts[i]'s parent is drafts[i - 1]).
  std::vector<int32_t> draft_parents;
  void clear_drafts() {
    drafts.clear();
    draft_q.clear();
    draft_parents.clear();
  }
  int64_t spec_drafted = 0;
  int64_t spec_accepted = 0;
  int64_t spec_drafts = 0;           // verify steps that carried drafts

  // Prompt logprobs (SamplingParams::prompt_logprobs >= 0): pending until the first token's event carries
  // them; while pending the prefix cache is not used (every prompt position's logits are computed).
  bool prompt_logprobs_pending = false;
  std::vector<PromptLogprob> prompt_lps;  // positions 1.. computed so far, in order

  int32_t n_generated() const { return static_cast<int32_t>(tokens.size()) - prompt_len; }
  int32_t n_remaining() const { return static_cast<int32_t>(tokens.size()) - n_computed; }
};

}  // namespace mxserve::runtime
