// Speculative vs plain greedy decoding, judged by the format bound (issue 31 item 2). Greedy speculation is lossless
// in exact arithmetic, but on a bf16 backend the verify forward (the drafted rows in one batch) and the plain decode
// (one row a step) round differently, so where the reference's two best tokens are closer than bf16 rounding can
// resolve the two runs may legitimately part. For each prompt whose outputs differ, the first differing token is
// judged on the CPU fp32 reference: its logit margin between the two tokens against u x (sum_i |h_i W_ai| +
// sum_i |h_i W_bi|) (cli/fixture_decisions.h judge_token_flip). A token margin beyond that bound can still be
// rounding one step upstream: an MoE router (or DSA indexer) decision whose reference margin is below bf16 noise
// flips on one path and moves the hidden state by far more than the last matmul's rounding. So the run that chose
// the non-reference token is replayed through the engine, with the same batches, twice: as it ran, and with the
// reference's decisions forced on every row of the committed path (model/decisions.h: judged like the fixture
// checks, each flip by the whole set against the format bound given the reference's upstream decisions). The
// divergence is legitimate when the forced replay takes the reference's token (or one within the token bound)
// and every decision the replay flipped is within its format bound; otherwise it is a bug.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"

namespace mxserve::cli {

// Greedy continuations of every prompt, one request at a time (batch 1) through the engine.
struct GreedyRuns {
  std::vector<std::vector<int32_t>> outputs;
  double decode_seconds = 0;  // after each request's first token
  int64_t decode_tokens = 0;
  runtime::SpecStats spec;
};
Result<GreedyRuns> generate_greedy_all(model::CausalLM& m, backend::Backend& be,
                                       const std::vector<std::vector<int32_t>>& prompts, const runtime::SpecConfig& spec,
                                       int64_t gen_tokens);

// One run (plain or speculative) replayed up to the divergent token, as it ran and with the reference's decisions
// forced on the committed path.
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

struct SpecDivergence {
  size_t prompt = 0;
  int64_t index = 0;         // first generated token that differs
  int32_t plain = -1, spec = -1;
  int32_t reference = -1;    // the reference's argmax at that point
  double margin = 0, bound = 0;  // the reference's logit margin between the two tokens, and the format bound
  DecisionReplay plain_replay, spec_replay;  // filled when margin > bound
  bool within_bound() const { return margin <= bound; }
  // Legitimate: within the token bound, or every run that left the reference's token is explained by flips of
  // decisions within their format bound.
  bool legitimate() const {
    if (within_bound()) return true;
    if (plain != reference && !plain_replay.explained()) return false;
    if (spec != reference && !spec_replay.explained()) return false;
    return true;
  }
};

// The first divergence of every prompt whose plain and speculative outputs differ, judged on the model in dir
// loaded on the CPU backend (f32), with unit roundoff u (bf16: model::kBf16UnitRoundoff). A divergence beyond the
// token bound is replayed on (m, be) with spec_on for the speculative run (see the header comment).
Result<std::vector<SpecDivergence>> judge_spec_divergences(const std::string& dir, model::CausalLM& m,
                                                           backend::Backend& be, const runtime::SpecConfig& spec_on,
                                                           const std::vector<std::vector<int32_t>>& prompts,
                                                           const std::vector<std::vector<int32_t>>& plain,
                                                           const std::vector<std::vector<int32_t>>& spec, double u);

// For each row of an engine batch of one sequence: its position when the row is on the committed path (its token is
// committed[position] and so are its ancestors in the batch: earlier rows of a causal span, the tree mask's ancestors
// of a tree row), else -1. Only those rows' decisions have a reference (a rejected draft's row carries another token).
std::vector<int32_t> committed_path_positions(const model::ForwardBatch& b, const std::vector<int32_t>& committed);

// One line per divergence.
std::string describe(const SpecDivergence& d);

}  // namespace mxserve::cli
