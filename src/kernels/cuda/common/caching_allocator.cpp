// CachingAllocator: size-rounded free lists over cudaMalloc (see the header for the stream invariant).
#include "kernels/cuda/common/caching_allocator.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>

#include "core/logging.h"

#include "core/device_oom.h"
#include "kernels/cuda/common/cuda_check.h"

namespace mxserve::kernels::cuda {
namespace {

// 512 B granularity up to 1 MiB, then 1 MiB (so near-equal large requests share blocks).
uint64_t round_size(uint64_t bytes) {
  if (bytes == 0) bytes = 1;
  const uint64_t g = bytes <= (1ull << 20) ? 512 : (1ull << 20);
  return (bytes + g - 1) / g * g;
}

// Every live allocator of the process (several CUDA backends may share one device: the shared-device stand-in
// puts eight ranks' allocators on one GPU). A cudaMalloc that fails drops the cached blocks of every allocator
// on its device, not only its own: the free lists are exact-size, so each rank's cache fills with blocks of the
// step shapes it saw, which no other rank can reuse and which the start-up budget (launch/launch_memory.h)
// counts only up to each rank's measured peak.
std::mutex g_registry_mu;
std::vector<std::weak_ptr<CachingAllocator>>& registry() {
  static auto* all = new std::vector<std::weak_ptr<CachingAllocator>>();  // never destroyed (exit order)
  return *all;
}

}  // namespace

std::shared_ptr<CachingAllocator> CachingAllocator::create(int device) {
  std::shared_ptr<CachingAllocator> made(new CachingAllocator(device));
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto& all = registry();
  all.erase(std::remove_if(all.begin(), all.end(), [](const auto& w) { return w.expired(); }), all.end());
  all.push_back(made);
  return made;
}

uint64_t CachingAllocator::release_cached_on_device(int device, const CachingAllocator* except, int* n_peers) {
  std::vector<std::shared_ptr<CachingAllocator>> peers;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    for (const auto& w : registry())
      if (auto a = w.lock(); a && a->device_ == device && a.get() != except) peers.push_back(std::move(a));
  }
  if (n_peers != nullptr) *n_peers = static_cast<int>(peers.size());
  uint64_t released = 0;
  for (const auto& a : peers) {  // outside the registry lock; each under its own (no allocator lock is held here)
    released += a->bytes_cached();
    a->release_cached();
  }
  return released;
}

CachingAllocator::~CachingAllocator() {
  for (auto& [size, p] : free_) cudaFree(p);  // teardown: errors are not actionable here
}

void* CachingAllocator::device_malloc(uint64_t rounded, bool may_release_caches) {
  // On this allocator's device whatever the calling thread's current device is (several CUDA ranks in one
  // process: a rank's backend may be asked for memory from another rank's thread); restored after.
  int current = -1;
  MX_CUDA_CHECK(cudaGetDevice(&current));
  struct Restore {
    int device;
    ~Restore() { cudaSetDevice(device); }
  } restore{current};
  if (current != device_) MX_CUDA_CHECK(cudaSetDevice(device_));
  void* p = nullptr;
  // The test hook (core/device_oom.h) fails the allocation as the driver would, before it is made.
  cudaError_t err = alloc_fault::take(rounded) ? cudaErrorMemoryAllocation : cudaMalloc(&p, rounded);
  if (err == cudaErrorMemoryAllocation && may_release_caches) {
    (void)cudaGetLastError();  // clear the sticky-free allocation error, drop the cache, try once more
    MX_CUDA_CHECK(cudaDeviceSynchronize());
    release_cached();
    const bool injected = alloc_fault::take(rounded);  // a test's full device: the peers' caches cannot help
    err = injected ? cudaErrorMemoryAllocation : cudaMalloc(&p, rounded);
    if (err == cudaErrorMemoryAllocation && !injected) {  // then the other allocators' caches on this device
      (void)cudaGetLastError();
      MX_CUDA_CHECK(cudaDeviceSynchronize());  // no work of any rank on this device still reads a cached block
      int peers = 0;
      const uint64_t released = release_cached_on_device(device_, this, &peers);
      if (released > 0) {
        MX_LOG(kWarn) << "CUDA allocator on device " << device_ << ": " << (rounded >> 20) << " MiB did not fit; "
                      << "released " << (released >> 20) << " MiB cached by the other allocators sharing the device "
                      << "(ranks of the shared-device stand-in) and tried again";
        err = cudaMalloc(&p, rounded);
      }
      // The other ranks on the device run the same step at the same time: between the release and the retry
      // they may have allocated the freed bytes (their caches were just emptied) and cached their own
      // temporaries again. Session 15's stand-in run failed such a retry with 15.6 GiB free right after. A few
      // more rounds, each after the device's queued work and a short wait, then the failure stands.
      constexpr int kSharedDeviceRetries = 4;
      for (int round = 1; err == cudaErrorMemoryAllocation && peers > 0 && round <= kSharedDeviceRetries; ++round) {
        (void)cudaGetLastError();
        std::this_thread::sleep_for(std::chrono::milliseconds(2 * round));
        MX_CUDA_CHECK(cudaDeviceSynchronize());
        release_cached();
        (void)release_cached_on_device(device_, this);
        err = cudaMalloc(&p, rounded);
        if (err == cudaSuccess)
          MX_LOG(kWarn) << "CUDA allocator on device " << device_ << ": " << (rounded >> 20) << " MiB fit on retry "
                        << round << " of " << kSharedDeviceRetries << " (the ranks sharing the device were "
                        << "releasing and allocating at once)";
      }
    }
  }
  if (err == cudaErrorMemoryAllocation) {  // the caller's step fails, the server keeps serving (device_oom.h)
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    std::ostringstream what;
    const double mib = 1 << 20;
    what << "CUDA out of memory on device " << device_ << ": an allocation of " << rounded << " bytes ("
         << rounded / mib << " MiB) failed (this backend holds " << bytes_in_use() / mib << " MiB in use, peak "
         << peak_bytes_in_use() / mib << " MiB; the device has " << free_b / mib << " MiB free of "
         << total_b / mib << " MiB, other processes and ranks sharing the device included)";
    if (!may_release_caches)
      what << " for a CUDA graph's private pool (the allocators' cached blocks, the forward's activation reserve, "
              "are not released for graphs)";
    throw DeviceOutOfMemory(what.str(), rounded);
  }
  MX_CHECK_MSG(err == cudaSuccess, "cudaMalloc of " << rounded << " bytes failed: " << cudaGetErrorString(err)
                                                    << " (in use " << bytes_in_use() << " bytes)");
  return p;
}

std::shared_ptr<Storage> CachingAllocator::allocate(uint64_t bytes) {
  const uint64_t rounded = round_size(bytes);
  std::shared_ptr<PrivatePool> routed;
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    routed = private_;
    if (!routed) {
      auto it = free_.find(rounded);
      if (it != free_.end()) {
        p = it->second;
        free_.erase(it);
        cached_ -= rounded;
      }
      in_use_ += rounded;
      peak_in_use_ = std::max(peak_in_use_, in_use_);
      interval_peak_ = std::max(interval_peak_, in_use_);
    }
  }
  if (routed) return allocate_private(routed, bytes, rounded);
  if (p == nullptr) {
    try {
      p = device_malloc(rounded);
    } catch (const DeviceOutOfMemory&) {
      std::lock_guard<std::mutex> lock(mu_);
      in_use_ -= rounded;  // never handed out
      throw;
    }
  }
  auto self = shared_from_this();
  return std::make_shared<Storage>(p, bytes, Device::cuda(device_),
                                   [self, rounded](void* q) { self->give_back(q, rounded); });
}

std::shared_ptr<Storage> CachingAllocator::allocate_private(const std::shared_ptr<PrivatePool>& pool, uint64_t bytes,
                                                            uint64_t rounded) {
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool->mu_);
    auto it = pool->free_.find(rounded);
    if (it != pool->free_.end()) {
      p = it->second;
      pool->free_.erase(it);
    }
  }
  if (p == nullptr) {
    // Never at the cost of the cached blocks: after start-up they are the activation reserve the KV budget left
    // (launch/launch_memory.h); a graph that does not fit beside it fails out of memory, and the graph runtime
    // keeps the graphs it has or runs eagerly (runtime/decode_graphs.h).
    p = device_malloc(rounded, /*may_release_caches=*/false);
    std::lock_guard<std::mutex> lock(pool->mu_);
    pool->all_.push_back(p);
    pool->bytes_ += rounded;
  }
  return std::make_shared<Storage>(p, bytes, Device::cuda(device_), [pool, rounded](void* q) {
    std::lock_guard<std::mutex> lock(pool->mu_);
    pool->free_.emplace(rounded, q);
  });
}

void CachingAllocator::set_private_pool(std::shared_ptr<PrivatePool> pool) {
  std::lock_guard<std::mutex> lock(mu_);
  private_ = std::move(pool);
}

PrivatePool::~PrivatePool() {
  for (void* p : all_) cudaFree(p);  // the last graph and block are gone: errors are not actionable here
}

uint64_t PrivatePool::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void CachingAllocator::give_back(void* p, uint64_t rounded) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.emplace(rounded, p);
  in_use_ -= rounded;
  cached_ += rounded;
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, p] : free_) MX_CUDA_CHECK(cudaFree(p));
  free_.clear();
  cached_ = 0;
}

uint64_t CachingAllocator::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

uint64_t CachingAllocator::peak_bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_in_use_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_in_use_ = in_use_;
}

CachingAllocator::Interval CachingAllocator::take_interval() {
  std::lock_guard<std::mutex> lock(mu_);
  const Interval out{in_use_, std::max(interval_peak_, in_use_)};
  interval_peak_ = in_use_;
  return out;
}

uint64_t CachingAllocator::bytes_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

}  // namespace mxserve::kernels::cuda
