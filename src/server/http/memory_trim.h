// MemoryTrimmer: returns freed heap to the OS after requests that moved a lot of memory (large bodies,
// large responses, logprob-heavy generations). glibc keeps freed memory in per-thread arenas, and with
// hundreds of handler threads that retention grows into hundreds of MiB that outlive the requests.
// Invariant: malloc_trim runs at most once per second, never on the event loop, and a request that moved
// more than the threshold is always followed by a trim within about a second (a skipped one is pending).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace mxserve::server::http {

class MemoryTrimmer {
 public:
  static constexpr size_t kThresholdBytes = 256 << 10;

  void note(size_t bytes_moved) {
    if (bytes_moved >= kThresholdBytes) pending_.store(true);
  }
  bool due() const;      // pending and the last trim was at least a second ago
  void run_if_due();     // call from a worker thread

 private:
  std::atomic<bool> pending_{false};
  std::atomic<int64_t> last_ms_{0};
};

}  // namespace mxserve::server::http
