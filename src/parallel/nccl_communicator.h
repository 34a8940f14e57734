// The NCCL communicator: one rank's collectives over NCCL (libnccl.so.2, loaded at run time: nccl_api.h), on the
// rank's CUDA backend stream, on device tensors allocated from that backend. One communicator per rank of
// one parallel group; the ranks of this process share a group state, so abort() on one rank poisons the
// others (ncclCommAbort on every local communicator) and their pending and later collectives return an
// error naming the rank that failed.
// Init: in-process (id == nullptr: every rank of the group lives here; this call makes the ncclUniqueId and
// each rank's thread runs ncclCommInitRank with it) or one process per node (id from the TCP rendezvous,
// parallel/rendezvous.h; local_ranks are this node's ranks with their global rank numbers).
// Semantics (communicator.h): all_to_all exchanges the row counts first (an all-gather, then one host
// wait) and moves the rows with grouped ncclSend/ncclRecv; all_gather_columns gathers rank-major blocks and
// interleaves them with 2-D copies; barrier() is a one-element all-reduce the host waits for. Waits poll the
// stream, the group's poison flag and ncclCommGetAsyncError, and give up after the timeout (which poisons the
// group). Shapes are checked per rank; NCCL itself cannot see a rank that brings another shape (docs).
// In a build without CUDA every factory here returns "unsupported" (nccl_unavailable.cpp).
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "parallel/communicator.h"

namespace mxserve::parallel {

// ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES = 128), so callers need no NCCL header.
using NcclId = std::array<char, 128>;

struct NcclOptions {
  // How long a host wait (barrier, all_to_all's counts) lasts before the group is declared failed.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// A fresh ncclUniqueId (node 0 of a multi-node launch sends it to the others).
Result<NcclId> make_nccl_unique_id();

// One communicator per entry of local_ranks (all the same world size; backends[i] is local_ranks[i]'s CUDA
// backend, on local_ranks[i].device). id == nullptr: the whole world is local (in-process init). The group
// is the layouts' world (rank = layout.rank of layout.world()); a sub-group (the tp ranks of one dp replica)
// is made by a second call with layouts numbered within it. Ends with one grouped warm-up all-reduce, so
// NCCL's connections exist before any CUDA graph capture.
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(
    const std::vector<RankLayout>& local_ranks, const std::vector<backend::Backend*>& backends, const NcclId* id,
    const NcclOptions& options = {});

// CUDA devices visible to this process (0 without CUDA or a driver).
int visible_cuda_devices();
// Makes `device` the calling thread's current CUDA device (a rank's thread before it drives its backend);
// a no-op without CUDA.
void bind_thread_to_device(int device);

}  // namespace mxserve::parallel
