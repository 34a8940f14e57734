// The CPU thread-group communicator: the N ranks of one world run as N threads of this process and
// exchange host tensors through shared memory (the CPU reference backend's tensors live on the host).
// Every collective is a rendezvous: each rank posts its input, all wait at a barrier, each computes its
// result from every rank's input, and a second barrier keeps inputs alive until all have read them.
// Invariants:
//  - Deterministic: reductions add (or max) the ranks' inputs in rank order 0..N-1, so every rank gets the
//    same bits and a run is bitwise reproducible (lockstep ranks then make identical routing decisions).
//  - No hang: a rank that fails calls abort() and poisons the group; a wait that outlasts the timeout
//    poisons it too. Every pending and later collective then returns an error naming the rank at fault.
//  - Checked: every rank must call the same collective with matching dtypes and shapes; a mismatch is an
//    error (the same one on every rank) naming the op, the ranks and the shapes.
// f32 only for reductions (the CPU activation dtype); gathers and all-to-all copy bytes of any dtype.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace mxserve::parallel {

struct CpuGroupOptions {
  // How long one rank waits at a collective for the others before the group is declared failed.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// One communicator per layout (rank order, layouts[r].rank == r), sharing one group. Each must be used by
// exactly one thread at a time (its rank's); the group lives until the last communicator is destroyed.
Result<std::vector<std::unique_ptr<Communicator>>> make_cpu_communicators(const std::vector<RankLayout>& layouts,
                                                                          const CpuGroupOptions& options = {});

}  // namespace mxserve::parallel
