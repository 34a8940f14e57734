// Verifier: the pure judgement of one sequence's speculative drafts against the target's outputs. No engine
// state: drafts (a chain, or a tree in topological order) + the target's logit rows for [the last verified
// token, draft 1..M] + the request's sampling parameters and context -> the accepted path, the tokens to
// emit (accepted drafts, then the next token) with the row that predicted each, and the KV compaction moves.
// Invariant (lossless): each emitted token follows the target's processed distribution at its position with
// the accepted drafts before it in the context (penalties, logit mask: sampler.h), exactly as plain decoding:
//   greedy   - the processed argmax (the same tokens as plain decoding);
//   seeded   - the very token plain sampling draws there (same RNG counter: the same tokens);
//   unseeded - recursive rejection sampling (SpecInfer / EAGLE; exact in distribution).
// A chain is the tree whose node i has parent i - 1, so every mode is one walk from the root.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/status.h"
#include "runtime/request.h"
#include "runtime/sampler.h"

namespace mxserve::runtime {

enum class VerifyMode { kGreedy, kSeeded, kRejection };
VerifyMode verify_mode(const SamplingParams& p);

struct VerifyInput {
  std::span<const int32_t> drafts;               // [M] draft tokens
  std::span<const int32_t> parents;              // [M] tree parents (an earlier node, or -1: the root); empty: a chain
  std::span<const TokenDistribution> proposals;  // [M] chain drafts were drawn from these (kRejection); empty:
                                                 // deterministic picks (greedy, seeded, top-k tree candidates)
  const SamplingParams* sampling = nullptr;
  TokenContext context;                          // prompt + output before the root's next token
  uint64_t seed = 0;                             // sampling_seed(params, the request's default seed)
  std::optional<double> simulate_acceptance;     // benchmark mode: accept a path of this mean length - 1
};

struct TargetRows {
  int64_t vocab = 0;
  std::span<const float> logits;    // [M + 1, V] raw host logits: row 0 at the root, row 1 + i at draft i; may be
                                    // empty for greedy requests without logit processing
  std::span<const int32_t> argmax;  // [M + 1] the device's argmax of each row; may be empty (then from logits)
};

struct Verdict {
  std::vector<int32_t> path;    // accepted draft nodes, root to leaf
  std::vector<int32_t> tokens;  // emitted: the path's tokens, then the next token
  std::vector<int32_t> rows;    // [tokens.size()] the target row that predicted tokens[i] (its logprobs' row)
  int32_t depth = 0;            // positions judged: the chain's length or the tree's depth
  // Compaction of the accepted path's KV: (from, to) offsets from the root's position, in order; the node at
  // offset 1 + node moves to 1 + its depth - 1. Empty for chains (their path is already consecutive).
  std::vector<std::pair<int32_t, int32_t>> kv_moves;
  int32_t n_accepted() const { return static_cast<int32_t>(path.size()); }
};

// Errors: a NaN target logit, or a row where the logit mask / bias allows no token (check_logits).
Result<Verdict> verify_drafts(const VerifyInput& in, const TargetRows& target);

}  // namespace mxserve::runtime
