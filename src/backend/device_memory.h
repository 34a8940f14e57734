// DeviceMemory: what a backend's device memory looks like now -- its caching allocator's bytes in use, cached
// and their high-water mark, and the device's free / total as the driver reports them (cudaMemGetInfo; ranks
// and processes sharing the device included). The start-up report and the KV-cache budget read it
// (launch/launch_memory.cpp); the out-of-memory error names the same numbers (core/device_oom.h).
// A backend without device memory (the CPU reference) reports known == false.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace mxserve::backend {

struct DeviceMemory {
  bool known = false;  // false: not a device backend
  int device = -1;
  uint64_t in_use = 0, cached = 0, peak_in_use = 0;  // this backend's allocator (peak: since the last reset)
  uint64_t graph_pool = 0;                           // bytes reserved by its captured graphs' private pool
  uint64_t device_free = 0, device_total = 0;        // the whole device (every user of it)
};

DeviceMemory device_memory(Backend& be);
// Starts a new high-water mark at the current in-use bytes (no-op without device memory).
void reset_memory_peak(Backend& be);

// A second high-water mark, independent of the one above (the start-up budget's): the allocator's bytes in use
// now and their peak since the previous call (or creation); starts a new interval. The serving steps' check
// against the start-up activation reserve reads it (launch/lockstep_model.h). known == false: no device memory.
struct MemoryInterval {
  bool known = false;
  uint64_t in_use = 0, peak = 0;
};
MemoryInterval take_memory_interval(Backend& be);

}  // namespace mxserve::backend
