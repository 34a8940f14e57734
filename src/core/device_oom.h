// DeviceOutOfMemory: a backend allocation the device cannot serve, as a C++ exception. Forward code allocates
// through Backend::alloc (a Tensor, not a Result) hundreds of times per step, so an allocation failure deep in a
// forward unwinds to the one boundary that turns it into a Status: the engine's step (runtime/engine.cpp) and
// each rank's worker of a lockstep group (launch/lockstep_model.cpp). There it becomes a kOutOfMemory Status
// that fails the step's requests; the server keeps serving. Nothing else throws it, nothing else catches it.
// Invariant: thrown only before the failed allocation's memory was handed out (no leak, no half-built tensor).
// Test hook (alloc_fault): makes the next `count` allocations of at least `min_bytes` fail as if the device
// were full, on every backend that checks it (the CUDA caching allocator, the CPU backend): the CPU test of
// the engine's OOM path and the GPU test of the caching allocator's use it. Off (count 0) unless a test arms it.
// graph_instantiate_fault: the same for CUDA graph instantiation (the driver's own memory, not an allocator's):
// the next `count` cudaGraphInstantiate calls fail as if the device were full (test_cuda_graphs).
#pragma once

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace mxserve {

class DeviceOutOfMemory : public std::runtime_error {
 public:
  DeviceOutOfMemory(const std::string& what, uint64_t bytes) : std::runtime_error(what), bytes_(bytes) {}
  uint64_t bytes() const { return bytes_; }  // the allocation that failed

 private:
  uint64_t bytes_;
};

namespace alloc_fault {

inline std::atomic<int64_t> g_remaining{0};
inline std::atomic<uint64_t> g_min_bytes{0};

// Tests: the next `count` allocations of >= min_bytes fail (count 0: off).
inline void arm(uint64_t min_bytes, int64_t count) {
  g_min_bytes.store(min_bytes);
  g_remaining.store(count);
}
// Backends: whether this allocation of `bytes` must fail (consumes one armed failure).
inline bool take(uint64_t bytes) {
  if (g_remaining.load(std::memory_order_relaxed) <= 0 || bytes < g_min_bytes.load()) return false;
  return g_remaining.fetch_sub(1) > 0;
}

}  // namespace alloc_fault

namespace graph_instantiate_fault {

inline std::atomic<int64_t> g_remaining{0};

inline void arm(int64_t count) { g_remaining.store(count); }
inline bool take() { return g_remaining.load(std::memory_order_relaxed) > 0 && g_remaining.fetch_sub(1) > 0; }

}  // namespace graph_instantiate_fault
}  // namespace mxserve
