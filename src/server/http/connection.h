// Connection: one client socket's state machine, driven by the event loop (never by a worker).
// Phases: kReading (request head, then body: RequestParser with the limits) -> kHandling (a worker runs
// the handler; further bytes are read ahead only up to max_pipelined_bytes, and a FIN/RST marks the
// client gone) -> kReading again (keep-alive) or kClosing (flush the last response, then half-close)
// -> kLingering (discard what the client still sends, briefly, so an unread body cannot turn the close
// into a reset that destroys the response) -> closed.
// Invariants: requests on one connection are answered strictly in order, one at a time (pipelining is
// served, never reordered or dropped while the client stays); an error response sent before the body was
// read always closes the connection, so the unread body is never parsed as a request; every phase has a
// total deadline (HttpLimits), so a slow client is cut off no matter how it trickles bytes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "server/http/channel.h"
#include "server/http/limits.h"
#include "server/http/request_parser.h"
#include "server/http/service.h"

namespace mxserve::server::http {

class Connection {
 public:
  using Clock = std::chrono::steady_clock;

  // The event loop's side of a connection.
  class Host {
   public:
    virtual ~Host() = default;
    virtual Service& service() = 0;
    // Runs the handler on a worker; false (request untouched) when the pool is saturated.
    virtual bool dispatch_to_worker(const std::shared_ptr<Channel>& channel, Request& req, bool keep_alive,
                                    uint64_t conn_id) = 0;
  };

  Connection(uint64_t id, int fd, std::string remote_addr, int remote_port, const HttpLimits& limits, Host* host,
             FlushWaker* waker, Clock::time_point now);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void on_events(uint32_t epoll_events, Clock::time_point now);
  void on_flush_wake(Clock::time_point now);
  void on_handler_done(bool must_close, Clock::time_point now);
  void on_tick(Clock::time_point now);  // deadlines
  void close_now();                     // eviction / server stop: the client is gone

  bool closed() const { return phase_ == Phase::kClosed; }
  uint32_t interest() const;            // the epoll events wanted in the current phase
  uint32_t registered = 0;              // what the loop last told epoll (owned by the loop)
  // Eviction order: connections not running a handler, longest-waiting first.
  bool evictable() const { return phase_ == Phase::kReading || phase_ == Phase::kLingering; }
  Clock::time_point waiting_since() const { return phase_ == Phase::kLingering ? Clock::time_point{} : wait_start_; }
  uint64_t id() const { return id_; }
  int fd() const { return fd_; }

 private:
  enum class Phase { kReading, kHandling, kClosing, kLingering, kClosed };

  void read_input(Clock::time_point now, bool to_eof);
  void discard_input();
  void pump(Clock::time_point now);     // advance + flush until nothing changes
  bool advance(Clock::time_point now);  // parse and dispatch buffered requests; true if anything happened
  void dispatch(Request req, bool keep_alive, Clock::time_point now);
  void respond(const Response& res, int version_minor, bool keep_alive);
  void fail_request(int status, const std::string& message, Clock::time_point now);
  void next_request(Clock::time_point now);
  void start_closing(Clock::time_point now);
  bool flush(Clock::time_point now);   // false: the socket failed (closed)
  void client_gone();
  size_t buffered() const { return in_.size() - in_off_; }
  void compact_input();

  const uint64_t id_;
  int fd_;
  const std::string remote_addr_;
  const int remote_port_;
  const HttpLimits& limits_;
  Host* const host_;
  std::shared_ptr<Channel> channel_;
  RequestParser parser_;
  Phase phase_ = Phase::kReading;
  std::string in_;                 // bytes read, not yet parsed: in_[in_off_, size)
  size_t in_off_ = 0;
  bool peer_eof_ = false;
  bool first_request_ = true;
  bool head_started_ = false;
  bool keep_alive_ = true;         // of the request being handled
  Clock::time_point wait_start_;   // when the connection began waiting for the current request
  Clock::time_point head_start_;   // first byte of the current request head
  Clock::time_point body_start_;
  Clock::time_point linger_until_;
};

}  // namespace mxserve::server::http
