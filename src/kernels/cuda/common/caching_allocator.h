// CachingAllocator: device memory for the CUDA backend without a cudaMalloc per op. Freed blocks go to
// a free list keyed by their rounded size and are handed out again to the next request of that size.
// Invariant: all work runs on the backend's one stream, so a block freed on the host (its last tensor
// dropped) can be reused by any later op at once: stream order puts the reuse after the last use.
// Graph capture: while a private pool is routed (set_private_pool), every allocation is served from that
// pool and its blocks return to it, never to the shared lists, so memory a captured graph uses stays
// reserved for its replays; the pool's blocks go back to the driver when the pool and every block are gone.
// Out of memory (the driver refuses even after this allocator's cache is dropped, and then the caches of every
// other allocator on the same device -- the ranks of the shared-device stand-in share one GPU): DeviceOutOfMemory
// (core/device_oom.h) is thrown, naming the size and the memory state; the engine's step turns it into failed
// requests. A private pool's allocation never drops any cache: the cached blocks are the forward's activation
// reserve after start-up, and graphs that took them left the stand-in's seed layout short (docs/perf/parallel.md,
// session 14): it throws at once, and the capture fails out of memory.
// Does not own: streams, or any multi-stream safety (events per block come with multi-stream work).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/tensor.h"

namespace mxserve::kernels::cuda {

// Blocks of captured graphs (see the header comment). Shared by every graph of one backend: graphs replay
// one at a time on the one stream, so one graph's temporaries may be another's.
class PrivatePool {
 public:
  ~PrivatePool();
  uint64_t bytes() const;

 private:
  friend class CachingAllocator;
  mutable std::mutex mu_;
  std::multimap<uint64_t, void*> free_;  // rounded size -> block
  std::vector<void*> all_;
  uint64_t bytes_ = 0;
};

class CachingAllocator : public std::enable_shared_from_this<CachingAllocator> {
 public:
  static std::shared_ptr<CachingAllocator> create(int device);
  ~CachingAllocator();

  // A 256-byte aligned block of at least `bytes`; the Storage's deleter returns it to this pool.
  std::shared_ptr<Storage> allocate(uint64_t bytes);
  // Routes allocations to `pool` (nullptr: back to the shared lists).
  void set_private_pool(std::shared_ptr<PrivatePool> pool);
  // Frees every cached (unused) block back to the driver.
  void release_cached();
  // release_cached() on every live allocator of `device` but `except`; the bytes released. The caller has
  // synchronized the device (a cached block may have been the last use of a kernel still queued).
  // peers (optional): how many allocators other than `except` live on the device.
  static uint64_t release_cached_on_device(int device, const CachingAllocator* except = nullptr, int* peers = nullptr);

  uint64_t bytes_in_use() const;
  uint64_t bytes_cached() const;
  // High-water mark of bytes_in_use() since creation or the last reset_peak() (start-up sizes the KV cache
  // with the forward's activation peak measured this way; shared-list blocks only, not graph pools).
  uint64_t peak_bytes_in_use() const;
  void reset_peak();
  // A second, independent high-water mark for the serving steps' check against that reserve
  // (launch/lockstep_model.h): the peak since the previous call and the bytes in use now; starts a new interval.
  struct Interval {
    uint64_t in_use = 0, peak = 0;
  };
  Interval take_interval();

 private:
  explicit CachingAllocator(int device) : device_(device) {}
  void give_back(void* p, uint64_t rounded);
  // cudaMalloc; out of memory and may_release_caches: frees this allocator's cached blocks, then every allocator's
  // on the device, and tries again (the forward's own temporaries); where other allocators share the device, a
  // few more rounds of release + retry (kSharedDeviceRetries: the others allocate and cache concurrently); else
  // throws DeviceOutOfMemory at once.
  void* device_malloc(uint64_t rounded, bool may_release_caches = true);
  std::shared_ptr<Storage> allocate_private(const std::shared_ptr<PrivatePool>& pool, uint64_t bytes,
                                            uint64_t rounded);

  int device_;
  mutable std::mutex mu_;
  std::multimap<uint64_t, void*> free_;  // rounded size -> block
  uint64_t in_use_ = 0, cached_ = 0, peak_in_use_ = 0, interval_peak_ = 0;
  std::shared_ptr<PrivatePool> private_;  // routed pool while capturing graphs
};

}  // namespace mxserve::kernels::cuda
