// verify-fixture's CUDA-graph check: the fixture's prompts as greedy requests through two engines on the
// same model and backend, one replaying decode graphs (runtime/decode_graphs.h) and one eager; every
// request's tokens must be identical, and the graph engine must have replayed at least one step. With an MTP
// layer the same pair runs again with MTP speculation (chain, fixed draft length 2): tokens and accepted-draft
// counts identical on and off, and chain verify steps and MTP chain continuation steps replayed from graphs.
// Invariant: the check compares one backend with itself (exact equality, no tolerance); the fixture's own
// tokens are judged by verify_fixture_model, not here.
#pragma once

#include <string>

#include "backend/backend.h"
#include "core/status.h"
#include "model/causal_lm.h"

namespace mxserve::cli {

struct GraphCheckReport {
  int checks = 0;
  int failures = 0;
  int64_t replays = 0;  // decode steps replayed from graphs (plain run)
};

// dir: the fixture the model was loaded from; block_size: the KV block size of both engines.
// mtp_draft_graphs: the MTP pass must also replay MTP draft (chain continuation) graphs -- one rank only; a
// lockstep model over several ranks has no device-input MTP forward, so its draft steps run eagerly and the
// pass checks its verify steps' graphs (and the tokens) alone. dp_ranks: the engines' DP ranks (a DP model's
// layout: requests spread over every DP group; 1 puts them all in group 0).
Result<GraphCheckReport> verify_fixture_graphs(const std::string& dir, model::CausalLM& model, backend::Backend& be,
                                               int64_t block_size, bool mtp_draft_graphs = true, int dp_ranks = 1);

}  // namespace mxserve::cli
