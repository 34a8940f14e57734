// RecoverableGroup: what a communicator offers (reach it with dynamic_cast, as FusedReduceAddNorm) to bring
// its group back after a failure that leaves every rank alive -- a device out-of-memory mid-step: the failing
// rank aborted the group (Communicator::abort), the others' collectives returned "the rank group failed".
// Contract: the caller calls reset_after_abort() on EVERY rank's communicator of the group, from one thread,
// at a quiet point: no rank is inside a collective of the group, and every rank's stream is synchronized
// (launch/lockstep_model.h: after the failed step's workers all returned). reset_after_abort() then clears the
// abort and any half-done exchange (posts, barrier counts), so the next collective starts afresh on every rank.
// It is an error (and the group stays failed) when the group cannot come back: a rank lost for good (a wait
// timeout), ranks in other processes (NCCL multi-node: they cannot be re-initialised from here), or a
// re-initialisation that fails. Implemented by the CPU thread group, the device group (the shared-device
// stand-in and its CPU twin) and NCCL with every rank in this process (fresh ncclGetUniqueId, ncclCommInitRank
// of every local rank: ncclCommAbort is terminal).
#pragma once

#include "core/status.h"

namespace mxserve::parallel {

class RecoverableGroup {
 public:
  virtual ~RecoverableGroup() = default;
  // ok when the group is healthy afterwards (also when it was never aborted).
  virtual Status reset_after_abort() = 0;
};

}  // namespace mxserve::parallel
