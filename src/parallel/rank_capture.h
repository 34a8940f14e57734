// RankCapture: the CUDA side of per-rank graphs (launch/rank_graphs.h): NCCL ranks, one GPU each, every rank's
// decode step captured into ITS OWN graph on its own stream by its own thread, launched together.
// Why per rank (NCCL's CUDA-graph rules): a launch of a graph holding NCCL collectives is collective over the
// ranks of its capture; graphs of several GPUs captured into one graph or launched from one thread may deadlock
// (cudaGraphLaunch may block until a peer's graph runs); with one thread per GPU the capture mode is
// cudaStreamCaptureModeThreadLocal. The one-GPU stand-in keeps its joined capture (parallel/graph_join.h says
// why per-rank graphs are unsound there).
// What this owns: one event per rank and the calls the orchestration needs -- rank 0 marks its inputs written
// (mark_root), rank r's stream waits for that mark OUTSIDE any graph (wait_root), the peer copies of rank 0's
// input buffers onto rank r's device (copy_from_root: a memcpy node when captured), the thread-local capture,
// the launch with its error as a Status, and rank 0's stream ordered after every rank's replay (join_ranks).
// Invariants: mark_root and join_ranks run on the engine thread, the per-rank calls on rank r's thread (its
// device current), and the host serializes replays, so an event's latest record is the one a wait means.
// Built in CUDA builds; otherwise make_rank_capture says the build has no CUDA.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace mxserve::parallel {

class RankCapture {
 public:
  virtual ~RankCapture() = default;
  virtual bool root_capturing() = 0;  // rank 0's stream is being captured now (a capture not made per rank)
  virtual Status mark_root() = 0;     // engine thread: rank 0's inputs are written up to here
  virtual Status wait_root(int rank) = 0;  // rank's thread: its stream after mark_root (never inside a capture)
  // rank's thread: bytes of src (rank 0's device) into dst (rank's device), on rank's stream; capturable.
  virtual Status copy_from_root(int rank, const Tensor& src, Tensor& dst) = 0;
  virtual Result<std::unique_ptr<backend::DeviceGraph>> capture(int rank, const std::function<void()>& body) = 0;
  virtual Status launch(int rank, backend::DeviceGraph& graph) = 0;  // rank's thread
  virtual Status mark_rank(int rank) = 0;  // rank's thread, after its launch
  virtual Status join_ranks() = 0;         // engine thread: rank 0's stream after every mark_rank
};

// backends[r] is rank r's CUDA backend on devices[r].
Result<std::unique_ptr<RankCapture>> make_rank_capture(const std::vector<backend::Backend*>& backends,
                                                       const std::vector<int>& devices);

}  // namespace mxserve::parallel
