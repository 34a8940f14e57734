// The shared-prefix (cascade) decode attention flags of `mxserve serve` (docs/kv-cache.md "Cascade (shared-prefix)
// decode attention"). ON by default: the CUDA backend takes the cascade path only where it pays -- eager steps whose
// decode rows' prefix groups save >= kernels::kCascadeMinSavedBytes of K/V reads per layer; decode graphs carry a
// group buffer per replay -- and the GPU suite's test_cuda_cascade_engine judges its greedy tokens against the
// per-sequence path (cli/greedy_divergence.h). --disable-cascade-attention turns it off; --enable-cascade-attention
// (opt-in before) is accepted as a no-op alias of the default. Asking for both is an error.
#pragma once

#include <set>
#include <string>

#include "cli/args.h"
#include "core/status.h"

namespace mxserve::cli {

inline const std::set<std::string> kCascadeBoolFlags = {"--enable-cascade-attention", "--disable-cascade-attention"};

inline Result<bool> parse_cascade_attention_flags(const Args& args) {
  const bool off = args.has("--disable-cascade-attention");
  if (off && args.has("--enable-cascade-attention"))
    return invalid_argument("--enable-cascade-attention contradicts --disable-cascade-attention: give one (cascade "
                            "attention is on by default)");
  return !off;
}

}  // namespace mxserve::cli
