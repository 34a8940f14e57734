// Decision-aware fixture checks (issue 31 item 1): a bf16 backend may legitimately pick another expert, another
// indexer key or another greedy token where the fp32 reference's decision is closer to a tie than bf16 rounding
// can resolve, and one flipped decision moves a whole row. So, for every path a fixture case runs (one ragged
// batch of all cases, chunked prefill through the paged cache, greedy decode step by step, the MTP layer):
//   1. the reference -- the CPU fp32 model, within 1e-4 of transformers -- runs each case once, teacher-forced over
//      input_ids + greedy, and its routing and index top-k decisions go into a book keyed by (site, layer,
//      case, position) (model/decisions.h DecisionBook), with every candidate's score and sensitivity;
//   2. each path runs with the reference's decisions forced row by row through that book (PositionalForcer):
//      whatever the batching, a row at position p of case c takes the reference's choice at (c, p); every
//      ordinary check (logits within the tolerance, greedy tokens, MTP logits) runs under forcing, nothing is
//      switched off;
//   3. the model's own choice at every site and row (made before forcing, from its own scores with all upstream
//      decisions equal to the reference's) is judged against the reference's whole set by the format bound
//      (model::judge_row): a legitimate flip when rounding the scores' inputs to the activation format can
//      explain the set, else a failure of that path;
//   4. greedy decode: where the model's token differs from the fixture's, the flip is legitimate when the
//      reference's logit margin between the two tokens is within u x (sum_i |h_i W_ai| + sum_i |h_i W_bi|) (h the
//      reference's final hidden row, W the output embedding; the same format bound), and decoding continues
//      with the fixture's token so every later step is still checked; beyond the bound it fails.
// The bound is the format's (u = 2^-8 for bf16 activations), never a backend's measured error.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "core/status.h"
#include "model/causal_lm.h"
#include "model/decisions.h"

namespace mxserve::cli {

// Per path and case: the decision rows the model made and how they compare with the reference's.
struct DecisionTally {
  int64_t rows = 0;          // decision rows compared (every site, layer and batch row)
  int flips = 0;             // disagreements within the format bound
  int beyond_bound = 0;      // disagreements beyond it: a bug
  double max_bound_use = 0;  // max over compared rows of model::bound_use (how much of the bound bf16 used)
  void add(const DecisionTally& o);
};

struct GreedyJudgement {
  double margin = 0;  // reference logit(want) - logit(got)
  double bound = 0;   // u x (S_want + S_got)
  bool within_bound() const { return margin <= bound; }
};

// The output embedding [V, H] of the checkpoint in dir as host f32 (lm_head.weight, or the tied input embedding).
Result<Tensor> read_output_embedding(const std::string& dir, const model::ModelConfig& cfg);

// A token flip judged by the format bound: the reference's logits row [V] and final hidden row [H] (post-norm,
// the lm_head input), the output embedding [V, H]; `got` where the reference's row prefers `want`.
GreedyJudgement judge_token_flip(const float* ref_logits, const float* ref_hidden, const Tensor& out_embed,
                                 int32_t got, int32_t want, double unit_roundoff);

// The reference side of a fixture: the decision book of every case (target and MTP layer), the reference's
// teacher-forced logits and final hidden rows, and the output embedding for the greedy bound.
class DecisionReference {
 public:
  static Result<DecisionReference> make(const std::string& dir, model::CausalLM& reference, backend::Backend& ref_be,
                                        const std::vector<FixtureCase>& cases, int64_t block_size);
  const model::DecisionBook& book() const { return *book_; }
  // The reference's teacher-forced logits of case c: host f32 [T + N - 1, V] over input_ids + greedy[:-1].
  const Tensor& logits(size_t c) const { return logits_[c]; }
  // Greedy step at row `row` of case c's teacher-forced sequence (input_ids + greedy): the model chose `got`
  // where the fixture has `want`.
  GreedyJudgement judge_greedy(size_t c, int64_t row, int32_t got, int32_t want, double unit_roundoff) const;
  // Judges the observations of one path (label for the log) of case c (c < 0: every case), printing every
  // disagreement.
  DecisionTally judge(const std::vector<model::ObservedDecision>& observed, int path, int32_t c, double unit_roundoff,
                      const char* label, std::FILE* log) const;

 private:
  std::unique_ptr<model::DecisionBook> book_;
  std::vector<Tensor> logits_, hidden_;  // per case: host f32 [L, V] and [L, H] (L = T + N - 1)
  Tensor out_embed_;                     // host f32 [V, H]
};

}  // namespace mxserve::cli
