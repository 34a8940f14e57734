// The CUDA backend's factory. Built only when MXSERVE_HAVE_CUDA; make_backend("cuda") calls it.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/status.h"

namespace mxserve::backend {

// A CUDA backend on options.device (bf16 activations and weights), or a Status naming why not
// (no device, a device index past the count, driver error).
Result<std::unique_ptr<Backend>> make_cuda_backend(const BackendOptions& options = {});

}  // namespace mxserve::backend

struct CUstream_st;
namespace mxserve::backend {
// The CUDA backend's stream (benchmarks time it with events); CHECK-fails for another backend.
CUstream_st* cuda_backend_stream(Backend& be);
// A graph body run on this backend's stream under ANOTHER backend's capture_graph (several ranks of one device
// joined into one capture: launch/lockstep_model.h): on, temporaries come from this backend's graph-private pool
// and host copies are refused, as inside its own capture_graph body; off restores both.
void cuda_backend_set_graph_body(Backend& be, bool on);
// Backend::capture_graph in cudaStreamCaptureModeThreadLocal: one rank's graph captured on its own thread while
// other ranks' threads capture theirs (NCCL ranks, one GPU each: launch/rank_graphs.h). capture_graph keeps
// the relaxed mode its other callers rely on.
Result<std::unique_ptr<DeviceGraph>> cuda_backend_capture_graph_thread_local(Backend& be,
                                                                             const std::function<void()>& body);
// DeviceGraph::replay of a CUDA-backend graph with the launch's error returned instead of CHECK-failing.
Status cuda_graph_try_replay(DeviceGraph& graph);

// Its device memory (backend/device_memory.h); reset_peak: then starts a new high-water mark. CHECK-fails for
// another backend.
struct DeviceMemory;
struct MemoryInterval;
DeviceMemory cuda_backend_memory(Backend& be, bool reset_peak);
MemoryInterval cuda_backend_memory_interval(Backend& be);  // device_memory.h take_memory_interval
}  // namespace mxserve::backend
