// Decision-aware fixture checks (issue 16 item 6): a bf16 backend may legitimately pick another expert, another
// indexer key or another greedy token where the fp32 reference's decision margin is below bf16 noise, and one
// flipped decision moves a whole row. For one fixture case (teacher-forced over input_ids + greedy tokens):
//   1. the reference -- the CPU fp32 model, which matches transformers within 1e-4 (the fixtures store only
//      logits and tokens, not router / indexer scores, so the reference decisions and their margins are
//      recomputed by that run) -- records every routing and index top-k decision with its margin;
//   2. the model under test runs with every reference decision forced (model/decisions.h DecisionForcer); at each
//      site it still makes its own choice first, from its own scores with all upstream decisions equal to the
//      reference's, and that choice is compared with the reference's;
//   3. a disagreement is a legitimate flip when the reference margin is within the bound below, else a failure;
//   4. the forced run's logits (and MTP logits) must match the fixture within the usual tolerance; its greedy
//      rows' argmax must equal the fixture's tokens unless the reference's top-2 logit margin is within the bound.
// The bound. A flip between candidates a and b needs |err_a| + |err_b| >= margin, so it is explainable when
// margin <= 2 x (the larger score error), the score error being modelled as rho x scale: scale is the row's
// DecisionRows::scale for the two candidates (4 standard deviations of uncorrelated noise on the products the
// score sums, per unit relative input error; decisions.h), greedy: 4 x the rms of the reference logit row; rho is
// the relative error of a bf16 backend's activations: kBf16DecisionRelError = 1.5e-2, twice the worst measured
// target-logit rel-L2 of the CUDA backend on the fixtures without a flip (7.1e-3, glm4_moe_tiny_a, docs/cuda.md).
// Measured use of the bound, printed per case: over the rows whose decisions agree, max |margin(test) -
// margin(reference)| / bound (the margin moves by at most the two scores' errors), so the GPU run shows how much of
// the bound bf16 actually uses; --decision-rel-error overrides rho.
#pragma once

#include <cstdio>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "core/status.h"
#include "model/causal_lm.h"

namespace mxserve::cli {

constexpr double kBf16DecisionRelError = 1.5e-2;

struct DecisionCheckOptions {
  double rel_error = kBf16DecisionRelError;  // rho of the bound
  double max_rel_l2 = 1e-4;                  // the forced run against the fixture
  int64_t block_size = 16;
};

struct CaseDecisions {
  int64_t sites = 0, rows = 0;    // decision sites (per layer and forward) and rows compared
  int flips = 0;                  // site disagreements within the bound
  int beyond_bound = 0;           // site disagreements beyond it: a bug
  int greedy_flips = 0, greedy_beyond_bound = 0;
  int unforced_disagreements = 0;  // rows whose decisions differ when nothing is forced (information)
  double unforced_rel_l2 = 0;      // the unforced teacher-forced logits against the fixture (information)
  double forced_rel_l2 = 0, forced_mtp_rel_l2 = -1;  // -1: no MTP comparison
  double max_bound_use = 0;  // max over agreeing rows of |margin(test) - margin(ref)| / bound
  bool forced_ok = true;     // forced logits (and MTP logits) within max_rel_l2
  bool ok() const { return beyond_bound == 0 && greedy_beyond_bound == 0 && forced_ok; }
  bool any_flip() const { return flips + greedy_flips + unforced_disagreements > 0; }
};

// Runs the checks of one case on `model` (any backend) against `reference` (the same fixture on the CPU
// backend), printing every disagreement to `log`.
Result<CaseDecisions> check_case_decisions(model::CausalLM& model, backend::Backend& be, model::CausalLM& reference,
                                           backend::Backend& ref_be, const FixtureCase& c,
                                           const DecisionCheckOptions& opt, std::FILE* log);

}  // namespace mxserve::cli
