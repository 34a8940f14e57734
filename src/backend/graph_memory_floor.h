// The device memory a CUDA graph's instantiation must leave free. Graphs are captured after the KV pool, out of
// the device's share above --gpu-memory-utilization (launch/launch_memory.h); what they take there is the
// driver's, not a caching allocator's. Kernel launches need some of it after start-up: a kernel whose local
// memory exceeds what the context reserved grows the reservation at launch, and cuBLASLt / NCCL keep internal
// buffers. Session 13 saw the cost of leaving none: the seed layout's graphs fit, and the first prefills' GEMMs
// failed to launch (cuBLAS status 13; docs/perf/parallel.md). So an instantiation that would leave less free than
// this floor is undone and reported out of memory; the graph runtime keeps the graphs it has
// (runtime/decode_graphs.h "Capture order").
// Floor: max(1 GiB, 1/64 of the device) -- 1.2 GiB on an 80 GB H100, 2.2 GiB on a 141 GB H200.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace mxserve::backend {

namespace graph_floor_override {
// Tests: a floor in bytes in place of the rule (0: the rule). test_cuda_graphs sets it above the free memory to
// make the next instantiation fall under it.
inline std::atomic<uint64_t> g_bytes{0};
}  // namespace graph_floor_override

inline uint64_t graph_memory_floor(uint64_t device_total) {
  const uint64_t forced = graph_floor_override::g_bytes.load();
  if (forced > 0) return forced;
  return std::max<uint64_t>(uint64_t{1} << 30, device_total / 64);
}

}  // namespace mxserve::backend
