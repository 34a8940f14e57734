// EventLoop: the HTTP/1.1 server core -- one epoll thread that owns the listening socket and every
// connection (accept, non-blocking reads and writes, deadlines, eviction), plus the WorkerPool that runs
// blocking handlers. Why our own loop and not a library: the requirements are mostly about bounds the
// libraries leave to the user (total head/body deadlines, decoded-body caps on chunked input, header
// counts, read-ahead caps for pipelining, a "client gone" signal for handlers that block); with ~1.5k
// lines of plain epoll each of them is explicit and tested, and there is no dependency to track for CVEs.
// Invariants: no thread per connection (an idle or slow connection costs a few KB and an fd, never a
// thread); the loop never blocks (inline handlers are cheap and admit() is pure); at most
// max_connections are open -- a new one evicts the longest-waiting connection that runs no handler, so a
// flood of slow clients cannot lock others out; every fd is closed by the loop thread only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "server/http/connection.h"
#include "server/http/limits.h"
#include "server/http/memory_trim.h"
#include "server/http/service.h"
#include "server/http/worker_pool.h"

namespace mxserve::server::http {

class EventLoop : private Connection::Host, private FlushWaker {
 public:
  EventLoop(const HttpLimits& limits, Service& service);
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Binds and listens (port 0: an ephemeral port). Raises the open-file limit to its hard maximum and
  // lowers max_connections (with a warning) if that is still too small.
  Status listen(const std::string& host, int port);
  int port() const { return port_; }
  void start();  // the loop thread
  void stop();   // closes every connection (handlers see client_gone), joins the loop and the workers

  size_t open_connections() const { return open_.load(); }
  const HttpLimits& limits() const { return limits_; }

 private:
  using Clock = std::chrono::steady_clock;

  Service& service() override { return service_; }
  bool dispatch_to_worker(const std::shared_ptr<Channel>& channel, Request& req, bool keep_alive,
                          uint64_t conn_id) override;
  void wake_flush(uint64_t conn_id) override;
  void post_done(uint64_t conn_id, bool must_close);
  void wake();

  void run();
  void accept_all(Clock::time_point now);
  bool evict_one();
  void process_wakes(Clock::time_point now);
  void sweep(Clock::time_point now);
  void sync(Connection& c);  // epoll registration follows the connection's interest; closed: removed
  void set_accepting(bool on);

  HttpLimits limits_;
  Service& service_;
  MemoryTrimmer trimmer_;
  WorkerPool pool_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  bool accepting_ = false;
  Clock::time_point resume_accept_at_{};
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> conns_;  // loop thread only
  uint64_t next_id_ = 16;  // epoll data 0 = listening socket, 1 = wake fd
  std::atomic<size_t> open_{0};

  std::mutex wake_mutex_;
  std::vector<uint64_t> flush_ids_;                    // connections with bytes from a worker
  std::vector<std::pair<uint64_t, bool>> done_ids_;    // handlers finished (id, must close)

  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace mxserve::server::http
