// WorkerPool: the threads that run blocking handlers (one complete request each; idle and slow
// connections never hold one). Threads start on demand up to max_threads and exit after idling; jobs
// beyond the free threads wait in a FIFO of at most max_queued. Invariant: try_submit() never blocks and
// refuses (false) instead of growing past either bound -- the caller answers 503.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mxserve::server::http {

class WorkerPool {
 public:
  WorkerPool(size_t max_threads, size_t max_queued, size_t keep_idle = 8);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  bool try_submit(std::function<void()> job);
  void shutdown();  // runs the queued jobs, joins every thread

  size_t threads() const;
  size_t busy() const;

 private:
  void worker();

  const size_t max_threads_;
  const size_t max_queued_;
  const size_t keep_idle_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  std::vector<std::thread::id> exited_;  // finished workers, joined by the next submit/shutdown
  size_t live_ = 0;
  size_t idle_ = 0;
  bool shutdown_ = false;
};

}  // namespace mxserve::server::http
