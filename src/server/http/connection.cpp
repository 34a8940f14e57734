#include "server/http/connection.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <exception>

#include "server/http/response_writer.h"

namespace mxserve::server::http {
namespace {

constexpr size_t kReadChunk = 64 << 10;
constexpr size_t kReadBudget = 256 << 10;  // per readiness event, so one fast client cannot starve the others
constexpr size_t kKeepCapacity = 16 << 10;

char* scratch() {  // the event loop is one thread
  static thread_local char buf[kReadChunk];
  return buf;
}

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

Connection::Connection(uint64_t id, int fd, std::string remote_addr, int remote_port, const HttpLimits& limits,
                       Host* host, FlushWaker* waker, Clock::time_point now)
    : id_(id),
      fd_(fd),
      remote_addr_(std::move(remote_addr)),
      remote_port_(remote_port),
      limits_(limits),
      host_(host),
      channel_(std::make_shared<Channel>(id, waker, limits.max_pending_output)),
      parser_(limits),
      wait_start_(now) {}

Connection::~Connection() { close_now(); }

void Connection::close_now() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  channel_->mark_gone();
  phase_ = Phase::kClosed;
}

void Connection::client_gone() { close_now(); }

uint32_t Connection::interest() const {
  const bool out = channel_->pending() > 0;
  switch (phase_) {
    case Phase::kReading:
    case Phase::kHandling: {
      // Read ahead (pipelined requests, or the next request while the output is backed up) only to a bound;
      // a FIN/RST is still seen through EPOLLRDHUP.
      const bool blocked = phase_ == Phase::kHandling || channel_->pending() >= limits_.max_pending_output;
      const bool read = !peer_eof_ && (!blocked || buffered() < limits_.max_pipelined_bytes);
      return (read ? EPOLLIN : 0u) | (peer_eof_ ? 0u : static_cast<uint32_t>(EPOLLRDHUP)) | (out ? EPOLLOUT : 0u);
    }
    case Phase::kClosing: return EPOLLOUT;
    case Phase::kLingering: return EPOLLIN | EPOLLRDHUP;
    case Phase::kClosed: return 0;
  }
  return 0;
}

void Connection::on_events(uint32_t ev, Clock::time_point now) {
  if (phase_ == Phase::kClosed) return;
  if (ev & EPOLLERR) return client_gone();
  if (phase_ == Phase::kLingering) {
    if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) discard_input();
    if (phase_ != Phase::kClosed && now >= linger_until_) close_now();
    return;
  }
  const bool hangup = ev & (EPOLLRDHUP | EPOLLHUP);
  if (phase_ == Phase::kClosing) {
    if (ev & EPOLLHUP) return client_gone();  // a half-close while we flush is fine; a full hang-up is not
  } else if ((ev & EPOLLIN) || hangup) {
    // After a FIN the client can send nothing more, so what is left in the socket (at most its receive
    // buffer) is read past the read-ahead bound: that is how the FIN itself is seen.
    if (hangup || (interest() & EPOLLIN)) read_input(now, /*to_eof=*/hangup);
    if (phase_ == Phase::kClosed) return;
  }
  pump(now);
}

void Connection::read_input(Clock::time_point now, bool to_eof) {
  (void)now;
  size_t budget = kReadBudget;
  while (budget > 0) {
    const bool blocked = phase_ == Phase::kHandling || channel_->pending() >= limits_.max_pending_output;
    if (!to_eof && blocked && buffered() >= limits_.max_pipelined_bytes) break;
    const ssize_t n = ::recv(fd_, scratch(), std::min(kReadChunk, budget), MSG_DONTWAIT);
    if (n > 0) {
      in_.append(scratch(), static_cast<size_t>(n));
      budget -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      peer_eof_ = true;
      // A client that leaves while its request is handled is gone: the handler learns it through the channel.
      if (phase_ == Phase::kHandling) return client_gone();
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    return client_gone();
  }
}

void Connection::discard_input() {
  size_t budget = kReadBudget;
  while (budget > 0) {
    const ssize_t n = ::recv(fd_, scratch(), kReadChunk, MSG_DONTWAIT);
    if (n > 0) {
      budget -= std::min(budget, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    return close_now();  // EOF or error: the client has seen our response and closed
  }
}

void Connection::on_flush_wake(Clock::time_point now) {
  if (phase_ == Phase::kClosed) return;
  pump(now);
}

void Connection::on_handler_done(bool must_close, Clock::time_point now) {
  if (phase_ != Phase::kHandling) return;
  if (must_close || !keep_alive_) start_closing(now);
  else next_request(now);
  if (phase_ != Phase::kClosed) pump(now);
}

void Connection::pump(Clock::time_point now) {
  for (int i = 0; i < 8 && phase_ != Phase::kClosed; ++i) {
    const bool progressed = advance(now);
    const size_t before = channel_->pending();
    if (!flush(now)) return;
    if (!progressed && channel_->pending() == before) break;
  }
  if (phase_ == Phase::kReading && peer_eof_ && channel_->pending() < limits_.max_pending_output) {
    // The client finished sending and every complete request it sent was answered; a partial one never
    // completes.
    start_closing(now);
    flush(now);
  }
}

bool Connection::advance(Clock::time_point now) {
  bool progressed = false;
  while (phase_ == Phase::kReading && channel_->pending() < limits_.max_pending_output) {
    const size_t used = parser_.parse(std::string_view(in_).substr(in_off_));
    in_off_ += used;
    progressed |= used > 0;
    if (parser_.started() && !head_started_) {
      head_started_ = true;
      head_start_ = now;
    }
    switch (parser_.state()) {
      case RequestParser::State::kHead:
      case RequestParser::State::kBody:
        compact_input();
        return progressed;
      case RequestParser::State::kError:
        fail_request(parser_.error_status(), parser_.error_message(), now);
        return true;
      case RequestParser::State::kHeadDone: {
        progressed = true;
        body_start_ = now;
        if (std::optional<Response> early = host_->service().admit(parser_.request())) {
          // Answered from the head alone. With a body announced, the body stays unread: close.
          const bool keep = parser_.keep_alive() && !parser_.has_body();
          respond(*early, parser_.request().version_minor, keep);
          if (keep) next_request(now);
          else start_closing(now);
          continue;
        }
        if (parser_.has_body() && parser_.expects_continue()) channel_->append("HTTP/1.1 100 Continue\r\n\r\n");
        parser_.begin_body();
        continue;
      }
      case RequestParser::State::kDone: {
        progressed = true;
        const bool keep = parser_.keep_alive();
        Request req = parser_.take_request();
        req.remote_addr = remote_addr_;
        req.remote_port = remote_port_;
        dispatch(std::move(req), keep, now);
        continue;
      }
    }
  }
  compact_input();
  return progressed;
}

void Connection::dispatch(Request req, bool keep_alive, Clock::time_point now) {
  Service& service = host_->service();
  keep_alive_ = keep_alive;
  if (service.runs_inline(req)) {
    Response res;
    res.attach(nullptr, req.version_minor, keep_alive);
    try {
      service.handle(req, res);
    } catch (const std::exception& e) {
      res = service.error(500, e.what());
    } catch (...) {
      res = service.error(500, "unknown exception");
    }
    respond(res, req.version_minor, keep_alive);
    if (keep_alive) next_request(now);
    else start_closing(now);
    return;
  }
  phase_ = Phase::kHandling;
  if (peer_eof_) channel_->mark_gone();  // the client closed after sending: it is gone, as in Go's net/http
  if (!host_->dispatch_to_worker(channel_, req, keep_alive, id_)) {
    phase_ = Phase::kReading;
    respond(service.error(503, "the server is handling too many requests; retry later"), req.version_minor,
            keep_alive);
    if (keep_alive) next_request(now);
    else start_closing(now);
  }
}

void Connection::respond(const Response& res, int version_minor, bool keep_alive) {
  channel_->append(serialize_response(res, version_minor, keep_alive));
  host_->service().on_response(res.status);
}

void Connection::fail_request(int status, const std::string& message, Clock::time_point now) {
  const int version = parser_.request().version_minor;
  parser_.reset();
  in_.clear();
  in_off_ = 0;
  respond(host_->service().error(status, message), version, /*keep_alive=*/false);
  start_closing(now);
}

void Connection::next_request(Clock::time_point now) {
  phase_ = Phase::kReading;
  first_request_ = false;
  head_started_ = false;
  wait_start_ = now;
  if (parser_.state() != RequestParser::State::kHead) parser_.reset();
}

void Connection::start_closing(Clock::time_point now) {
  (void)now;
  phase_ = Phase::kClosing;
  std::string().swap(in_);
  in_off_ = 0;
}

bool Connection::flush(Clock::time_point now) {
  if (phase_ == Phase::kClosed) return false;
  if (channel_->pending() > 0 && channel_->flush(fd_) == Channel::FlushResult::kError) {
    client_gone();
    return false;
  }
  if (phase_ == Phase::kClosing && channel_->pending() == 0) {
    ::shutdown(fd_, SHUT_WR);  // the response is complete; what the client still sends is read and dropped
    phase_ = Phase::kLingering;
    linger_until_ = now + seconds(limits_.linger_timeout_s);
    discard_input();
  }
  return phase_ != Phase::kClosed;
}

void Connection::on_tick(Clock::time_point now) {
  switch (phase_) {
    case Phase::kClosed: return;
    case Phase::kLingering:
      if (now >= linger_until_) close_now();
      return;
    default: break;
  }
  if (channel_->pending() > 0 && now - channel_->stalled_since() > seconds(limits_.write_timeout_s))
    return client_gone();  // the client stopped reading
  if (phase_ != Phase::kReading) return;
  const auto state = parser_.state();
  if (state == RequestParser::State::kHead && !head_started_) {
    const double idle = first_request_ ? limits_.header_timeout_s : limits_.keepalive_timeout_s;
    if (now - wait_start_ > seconds(idle)) close_now();
  } else if (state == RequestParser::State::kHead) {
    if (now - head_start_ > seconds(limits_.header_timeout_s))
      fail_request(408, "the request head did not arrive within " + std::to_string(limits_.header_timeout_s) + " s", now);
  } else if (state == RequestParser::State::kBody) {
    if (now - body_start_ > seconds(limits_.body_timeout_s))
      fail_request(408, "the request body did not arrive within " + std::to_string(limits_.body_timeout_s) + " s", now);
  }
  if (phase_ != Phase::kClosed) flush(now);
}

void Connection::compact_input() {
  if (in_off_ == 0) return;
  if (in_off_ >= in_.size()) {
    if (in_.capacity() > kKeepCapacity) std::string().swap(in_);
    else in_.clear();
    in_off_ = 0;
  } else if (in_off_ > 4096 && in_off_ > in_.size() / 2) {
    in_.erase(0, in_off_);
    in_off_ = 0;
  }
}

}  // namespace mxserve::server::http
