// Rank layout: how a launch spreads one model over ranks (one rank = one backend on one device).
// world = tp * dp ranks; rank r has dp_rank = r / tp and tp_rank = r % tp (tensor-parallel groups are
// consecutive ranks, so they share a host). Expert parallelism runs over the same ranks: ep is 1, tp (each
// tp group partitions the experts) or the world, and rank r holds the experts of ep_rank = r % ep (expert e
// of E on ep rank e / (E / ep), whole; parallel/shard.h). Invariant: every RankLayout produced by
// ParallelConfig::ranks() passed validate(), and device = first_device + rank.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace mxserve::parallel {

struct RankLayout {
  int tp = 1, ep = 1, dp = 1;  // group sizes
  int rank = 0;                // 0 .. world() - 1
  int device = 0;              // the accelerator index this rank's backend uses
  int world() const { return tp * dp; }
  int tp_rank() const { return rank % tp; }
  int dp_rank() const { return rank / tp; }
  int ep_rank() const { return rank % ep; }
  std::string describe() const;  // "rank 0/1 (tp 0/1, ep 0/1, dp 0/1) on device 0"
};

// What a user asks for (--tensor-parallel-size and friends); validate() names the offending flag.
struct ParallelConfig {
  int tp = 1, ep = 1, dp = 1;
  int first_device = 0;
  int world() const { return tp * dp; }
  Status validate() const;
  // One layout per rank, in rank order (validate() first).
  Result<std::vector<RankLayout>> ranks() const;
};

}  // namespace mxserve::parallel
