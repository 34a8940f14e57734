// Rank layout: how a launch spreads one model over ranks (one rank = one backend on one device).
// world = tp * dp ranks; rank r has dp_rank = r / tp and tp_rank = r % tp (tensor-parallel groups are
// consecutive ranks, so they share a host). Expert parallelism runs over the same ranks: ep is 1, tp (each
// tp group partitions the experts) or the world, and rank r holds the experts of ep_rank = r % ep (expert e
// of E on ep rank e / (E / ep), whole; parallel/shard.h). Data parallelism: the dp groups (one per dp_rank,
// tp consecutive ranks each) serve different requests; plain DP replicates the whole model per group, DP
// attention (dp_attention) replicates attention / dense layers per group and spreads the MoE blocks over the
// whole world (the "MoE group": moe_tp() ranks, index moe_tp_rank()). Invariant: every RankLayout produced
// by ParallelConfig::ranks() passed validate(), and device = first_device + rank.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace mxserve::parallel {

struct RankLayout {
  int tp = 1, ep = 1, dp = 1;  // group sizes
  int rank = 0;                // 0 .. world() - 1
  int device = 0;              // the accelerator index this rank's backend uses
  bool dp_attention = false;   // --enable-dp-attention: MoE blocks run over the world, attention per dp group
  int world() const { return tp * dp; }
  int tp_rank() const { return rank % tp; }
  int dp_rank() const { return rank / tp; }
  int ep_rank() const { return rank % ep; }
  // The ranks a MoE block's partial sums are spread over: the world under DP attention, else the tp group.
  int moe_tp() const { return dp_attention ? world() : tp; }
  int moe_tp_rank() const { return dp_attention ? rank : tp_rank(); }
  std::string describe() const;  // "rank 0/1 (tp 0/1, ep 0/1, dp 0/1) on device 0"
};

// What a user asks for (--tensor-parallel-size and friends); validate() names the offending flag.
struct ParallelConfig {
  int tp = 1, ep = 1, dp = 1;
  bool dp_attention = false;  // --enable-dp-attention (needs dp > 1)
  int first_device = 0;
  int world() const { return tp * dp; }
  Status validate() const;
  // One layout per rank, in rank order (validate() first).
  Result<std::vector<RankLayout>> ranks() const;
};

}  // namespace mxserve::parallel
