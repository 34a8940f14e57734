// LogitConstraint: the runtime's view of a per-request decoding constraint (structured output). The
// runtime does not know grammars; it asks the constraint which tokens may come next (a bitmask over the
// vocabulary), masks the logits row with it before sampling or argmax, and reports every generated token.
// Implemented by src/structured/ (GrammarConstraint); runtime must not depend on that module.
// Invariant: terminators (EOS / stop ids) are allowed exactly when complete() is true; once complete()
// and no grammar token is allowed, only terminators are. One constraint per request; not thread-safe
// (the engine computes masks of different requests on different threads, never one request's twice).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace mxserve::runtime {

class LogitConstraint {
 public:
  virtual ~LogitConstraint() = default;
  // Sets bit t (word t / 32, bit t % 32) of `mask` for every token the constraint allows next, terminators
  // excluded; clears the others. mask has ceil(V / 32) words.
  virtual void fill_allowed(std::span<uint32_t> mask) = 0;
  // True when the output so far is complete, so a terminator may end it.
  virtual bool complete() = 0;
  // Advances by one generated (non-terminator) token; false, state unchanged, when it is not allowed.
  virtual bool accept(int32_t token) = 0;
  // An independent copy in the same state (speculative verification walks drafts on a copy).
  virtual std::unique_ptr<LogitConstraint> clone() const = 0;
};

inline int64_t mask_words(int64_t vocab) { return (vocab + 31) / 32; }
inline bool mask_has(std::span<const uint32_t> mask, int64_t t) { return (mask[t >> 5] >> (t & 31)) & 1u; }

// Sets every logit outside `allowed` (plus `terminators` when `complete`) to -inf. Returns the number of
// tokens left; 0 means the constraint allows nothing (the caller ends the request).
int64_t apply_token_mask(std::span<float> logits, std::span<const uint32_t> allowed, bool complete,
                         std::span<const int64_t> eos_ids, std::span<const int32_t> stop_ids);

}  // namespace mxserve::runtime
