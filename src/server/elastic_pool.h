// ElasticPool: cpp-httplib's task queue (one task = one connection, held for its whole life, streams
// included). Threads are started on demand, up to max_threads, and an idle one exits after a while,
// so hundreds of concurrent streams each get a thread without a fixed pool of hundreds at start-up.
// Beyond max_threads connections wait in FIFO order.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <httplib.h>

namespace mxserve::server {

class ElasticPool : public httplib::TaskQueue {
 public:
  explicit ElasticPool(size_t max_threads, size_t keep_idle = 8);
  ~ElasticPool() override;

  void enqueue(std::function<void()> fn) override;
  void shutdown() override;  // runs queued tasks to completion, joins every thread

  size_t threads() const;

 private:
  void worker();

  const size_t max_threads_;
  const size_t keep_idle_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  std::vector<std::thread::id> exited_;  // finished workers, joined by the next enqueue/shutdown
  size_t live_ = 0;
  size_t idle_ = 0;
  bool shutdown_ = false;
};

}  // namespace mxserve::server
