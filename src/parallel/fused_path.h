// Which all-reduce + residual add + RMSNorm a launch runs at tp > 1 (the decision only: launch/launch.cpp makes
// the groups, parallel/fused_add_norm.h has them). vLLM's rule: the custom (fused) all-reduce is the default on
// GPUs, --disable-custom-all-reduce turns it off.
//   --backend cuda, NCCL ranks (one GPU each)   peer: one-shot / two-shot through peer memory by size, NCCL
//                                               above the staging buffers (PeerAllReduce decides per call)
//   --backend cuda, shared-device stand-in      event-ordered: one kernel per rank reads every rank's input in
//                                               place, ordered by stream events (no device spin barrier)
//   --backend cpu                               off by default; the reference (three steps behind the seam)
//                                               when asked for (tests)
//   tp 1, --nnodes > 1, tp > kFusedMaxRanks     off (said why)
// Asked for (MXSERVE_FUSED_ALLREDUCE=1 / LaunchConfig::fused_allreduce) where it cannot run: an error naming the
// reason; by default there: off, with the reason in the start-up line. Pure (no CUDA): tested on the CPU.
#pragma once

#include <string>

#include "core/status.h"

namespace mxserve::parallel {

constexpr int kFusedMaxRanks = 8;  // ranks of one fused group (kernels/cuda/allreduce: kPeerMaxRanks)

enum class FusedAllReduceKind { kOff, kPeer, kEventOrdered, kReference };
const char* fused_allreduce_kind_name(FusedAllReduceKind k);

struct FusedAllReduceRequest {
  std::string backend = "cpu";  // cpu | cuda
  int tp = 1;
  bool shared_device = false;   // --communicator shared-device
  bool multinode = false;       // --nnodes > 1
  bool config_on = false;       // LaunchConfig::fused_allreduce (tests): asked for
  bool config_off = false;      // LaunchConfig::disable_custom_all_reduce
  const char* env = nullptr;    // MXSERVE_FUSED_ALLREDUCE: unset / "" (default), "1" (on), "0" (off)
};

struct FusedAllReduceChoice {
  FusedAllReduceKind kind = FusedAllReduceKind::kOff;
  bool required = false;  // asked for explicitly: a group that cannot be made is an error, not a fallback
  std::string why;        // the reason for the choice (the start-up line)
};

// An error names the culprit: MXSERVE_FUSED_ALLREDUCE's value, a contradiction (on and off both asked), or a
// layout where the fused path was asked for but cannot run.
Result<FusedAllReduceChoice> choose_fused_allreduce(const FusedAllReduceRequest& req);

// The start-up line: "all-reduce + add + RMSNorm at tp N: <path> (<why>)".
std::string describe_fused_allreduce(const FusedAllReduceChoice& c, int tp, int groups);

}  // namespace mxserve::parallel
