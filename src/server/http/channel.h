// Channel: the output side of one connection, shared by the event loop (which owns the socket and
// writes) and the worker thread running a handler (which produces bytes). Owns the unsent-bytes buffer,
// the bound on it (a producer waits while more than max_pending_output bytes are unsent: a client that
// does not read cannot grow server memory), and the "client gone" flag.
// Invariant: only the event loop touches the socket; `gone` is set once and never cleared, and wakes
// every waiting producer.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "server/http/message.h"

namespace mxserve::server::http {

// Implemented by the event loop: "connection `id` has bytes to write".
class FlushWaker {
 public:
  virtual ~FlushWaker() = default;
  virtual void wake_flush(uint64_t conn_id) = 0;
};

class Channel : public ResponseSink {
 public:
  using Clock = std::chrono::steady_clock;
  Channel(uint64_t conn_id, FlushWaker* waker, size_t max_pending) : id_(conn_id), waker_(waker), max_pending_(max_pending) {}

  // Worker side: queues bytes and wakes the loop; waits while too much is unsent. False once gone.
  bool send(std::string_view bytes) override;
  bool client_gone() const override { return gone_.load(std::memory_order_acquire); }

  // Event-loop side.
  void append(std::string_view bytes);  // never waits (the loop must not block)
  enum class FlushResult { kDrained, kPending, kError };
  FlushResult flush(int fd);            // non-blocking writes until drained or EAGAIN
  size_t pending() const;
  // When the oldest unsent byte has been waiting without any write progress (valid while pending() > 0).
  Clock::time_point stalled_since() const;
  void mark_gone();

 private:
  const uint64_t id_;
  FlushWaker* const waker_;
  const size_t max_pending_;
  mutable std::mutex mutex_;
  std::condition_variable space_cv_;
  std::string out_;
  size_t offset_ = 0;             // out_[offset_, size) is unsent
  Clock::time_point progress_at_;  // last write progress, or when the buffer went from empty to pending
  bool wake_pending_ = false;      // a wake_flush() is outstanding
  std::atomic<bool> gone_{false};
};

}  // namespace mxserve::server::http
