#include "server/http/worker_pool.h"

#include <algorithm>
#include <chrono>

namespace mxserve::server::http {

WorkerPool::WorkerPool(size_t max_threads, size_t max_queued, size_t keep_idle)
    : max_threads_(std::max<size_t>(max_threads, 1)), max_queued_(max_queued), keep_idle_(keep_idle) {}

WorkerPool::~WorkerPool() { shutdown(); }

bool WorkerPool::try_submit(std::function<void()> job) {
  std::vector<std::thread> to_join;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (shutdown_) return false;
    for (auto id : exited_) {
      auto it = std::find_if(threads_.begin(), threads_.end(), [&](const std::thread& t) { return t.get_id() == id; });
      if (it != threads_.end()) {
        to_join.push_back(std::move(*it));
        threads_.erase(it);
      }
    }
    exited_.clear();
    const bool thread_free = idle_ > jobs_.size() || live_ < max_threads_;
    if (!thread_free && jobs_.size() >= max_queued_) return false;
    jobs_.push_back(std::move(job));
    if (idle_ < jobs_.size() && live_ < max_threads_) {
      ++live_;
      threads_.emplace_back([this] { worker(); });
    }
  }
  cv_.notify_one();
  for (auto& t : to_join) t.join();
  return true;
}

void WorkerPool::worker() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ++idle_;
    const bool got = cv_.wait_for(lock, std::chrono::seconds(30), [&] { return shutdown_ || !jobs_.empty(); });
    --idle_;
    if (jobs_.empty()) {
      if (shutdown_ || (!got && idle_ >= keep_idle_)) break;
      continue;
    }
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    job = nullptr;  // release captured state before waiting again
    lock.lock();
  }
  --live_;
  if (!shutdown_) exited_.push_back(std::this_thread::get_id());
}

void WorkerPool::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdown_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads)
    if (t.joinable()) t.join();
}

size_t WorkerPool::threads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}

size_t WorkerPool::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_ - idle_;
}

}  // namespace mxserve::server::http
