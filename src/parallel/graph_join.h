// GraphJoin: CUDA graphs over the ranks of ONE device (the shared-device stand-in, --communicator shared-device):
// every rank's part of a decode step captured into ONE graph, launched on rank 0's stream.
// Why one graph and not one per rank: the stand-in's collectives order the ranks with stream events, and an
// event names its latest record, not "the record of step k". Per-rank graphs replayed independently would make
// rank 0's wait resolve to whatever rank 1 recorded last (the previous step, or the next), so a replay could read
// a peer's input before it is written; and device spin barriers (the peer kernels) may deadlock on one device
// (docs/parallel.md "CUDA graphs at tp > 1"). Inside one capture the same record / wait calls become graph edges,
// exact at every replay.
// How: rank 0's stream is being captured (Backend::capture_graph on the engine's thread); fork() records an event
// on it, each other rank's stream waits for it (so it joins the capture) in enter(r), the ranks enqueue their
// forwards from their own threads (their collectives' events become edges), leave(r) records where each ended,
// and join() makes rank 0's stream wait for all of them, so the capture can end. enter / leave also switch that
// rank's backend to its graph-private pool (backend/cuda_backend.h). Outside a capture (the warm-up run) the
// same calls just order the streams.
// Eager steps around replays: a replay runs every rank's part on rank 0's stream, which the other ranks' streams
// know nothing of; order_ranks_after_root() (before an eager step) and order_root_after_ranks() (after it) keep
// every rank's stream behind the replays and every replay behind the ranks' eager work.
// Invariant: every rank is on one device; enter / leave run on rank r's thread between fork() and join().
// Built in CUDA builds; otherwise make() says the build has no CUDA.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace mxserve::parallel {

class GraphJoin {
 public:
  virtual ~GraphJoin() = default;
  virtual bool root_capturing() = 0;  // rank 0's stream is being captured now
  virtual Status fork() = 0;          // engine thread, before the ranks' work
  virtual Status enter(int rank) = 0;  // rank's thread, before its work (rank 0: nothing to join)
  virtual Status leave(int rank) = 0;  // rank's thread, after its work
  virtual Status join() = 0;           // engine thread, after every rank's leave()
  virtual Status order_ranks_after_root() = 0;
  virtual Status order_root_after_ranks() = 0;
};

// backends[0] is rank 0's (the root); every backend a CUDA backend on the same device.
Result<std::unique_ptr<GraphJoin>> make_graph_join(const std::vector<backend::Backend*>& backends);

}  // namespace mxserve::parallel
