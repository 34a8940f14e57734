// The shared-device communicator: N ranks of one communicator on ONE GPU, for tests and benchmarks only (NCCL
// will not put two ranks of one communicator on one device). Each rank keeps its own CUDA backend (its own
// stream and caching allocator, all on the same device); collectives go through device memory: a host
// rendezvous between the rank threads, CUDA events so that a rank's stream reads the other ranks' inputs
// only once they are ready, device-to-device copies and a rank-order reduction kernel
// (shared_device_reduce.cu). The host logic is parallel/device_group_communicator.h (its invariants:
// deterministic rank-order f32 reductions, no hang, checked shapes, abort() poisons the group).
// What it does not prove: link bandwidth or latency (no NVLink, no PCIe between GPUs): docs/parallel.md
// "The one-GPU stand-in". In a build without CUDA the factory returns "unsupported".
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "parallel/communicator.h"

namespace mxserve::parallel {

struct SharedDeviceOptions {
  // How long one rank waits at a collective for the others before the group is declared failed.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// One communicator per layout (rank order, layouts[r].rank == r); backends[r] is rank r's CUDA backend, and
// every backend is on the same device. Logs (info) that this is a test / benchmark stand-in.
Result<std::vector<std::unique_ptr<Communicator>>> make_shared_device_communicators(
    const std::vector<RankLayout>& layouts, const std::vector<backend::Backend*>& backends,
    const SharedDeviceOptions& options = {});

}  // namespace mxserve::parallel
