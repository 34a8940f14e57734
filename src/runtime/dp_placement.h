// Data-parallel placement (docs/parallel.md "Placement"): which DP rank a request is admitted to. One
// scheduler owns one queue for every DP rank; each DP rank owns one range of the KV block pool
// (kvcache/block_pool.h) and its own prefix cache. Policy, in order:
//   1. the rank whose prefix cache holds the longest prefix of the request (> 0 tokens): reuse beats balance;
//   2. else the rank with the most free KV blocks;
//   3. ties by the fewest running sequences, then the lowest rank.
// Invariant: a pure function of the loads (deterministic; the unit tests pin each rule).
#pragma once

#include <cstdint>
#include <vector>

namespace mxserve::runtime {

struct DpRankLoad {
  int64_t prefix_hit_tokens = 0;  // tokens of the request its prefix cache would supply
  int64_t free_blocks = 0;        // free blocks of its KV range
  int64_t running = 0;            // sequences running on it
};

// The chosen rank (an index into ranks; ranks must not be empty).
int place_on_dp_rank(const std::vector<DpRankLoad>& ranks);

}  // namespace mxserve::runtime
