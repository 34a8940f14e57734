// Self-test of the host KV tier (--kv-cache-host-memory; docs/kv-cache.md "Host-memory tier"): one prompt is
// served three times through a throwaway engine with the tier on -- A computes it, B hits its blocks in the
// device prefix cache, then every cached block is forced out to the host tier, another prompt of the same
// length reuses (overwrites) the freed device blocks and is evicted in turn, and C hits the prompt's blocks in
// the host tier (copied back into blocks that held the other prompt). B and C compute the same rows over the same cached KV, so the target's logits of every step, the MTP
// draft's logits and the accepted drafts must be identical bit for bit when every cache tensor made the round
// trip (on any backend: the bytes are the same). A tensor left behind (e.g. the DSA indexer keys) shows up as a
// difference.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "runtime/executor.h"

namespace mxserve::runtime {

struct KvTierSelfTestReport {
  int64_t prompt_tokens = 0;
  int64_t cached_device = 0;   // B: prompt tokens served from the device prefix cache
  int64_t cached_host = 0;     // C: prompt tokens served (copied back) from the host tier
  int64_t offloaded_blocks = 0;
  int64_t logit_values = 0;    // target logits compared (all steps of the continuation)
  int64_t mtp_logit_values = 0;
  int64_t accepted_device = 0, drafted_device = 0;  // B's speculative counters
  int64_t accepted_host = 0, drafted_host = 0;      // C's
  bool identical = false;
  std::string mismatch;  // the first difference, when not identical
  std::string summary() const;
};

// Runs the test on `executor` (a pool of 64 blocks of block_size and a host tier of 128, destroyed afterwards);
// spec_steps > 0 drafts with the model's MTP layer (it must have one). The prompt: prompt_blocks whole blocks
// and a 3-token tail (two such prompts and their outputs must fit the pool). Errors only when the test cannot
// run; a mismatch is a report with identical == false.
Result<KvTierSelfTestReport> run_kv_tier_self_test(std::unique_ptr<ModelExecutor> executor, int64_t block_size,
                                                   int32_t spec_steps, int32_t max_tokens = 12,
                                                   int64_t prompt_blocks = 4);

}  // namespace mxserve::runtime
