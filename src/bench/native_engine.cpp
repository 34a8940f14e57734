// NativeEngine: a minimal epoll HTTP/1.1 client for streaming POSTs (see http_engine.h).
// Owns: URL parsing (http://host[:port][/prefix]), name resolution once per run, non-blocking
// connects, keep-alive reuse (a request that fails on a reused connection before any response
// byte is retried once on a fresh one) and per-request timeouts; response parsing is
// http1_response.h. One recv per readiness event: epoll is level-triggered, so a socket with more
// data is reported again on the next wait.
// Invariant: a connection carries at most one request at a time (no pipelining).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <queue>
#include <unordered_map>
#include <vector>

#include "bench/http1_response.h"
#include "bench/http_engine.h"

namespace mxserve::bench {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();
constexpr size_t kReadBuf = 256 * 1024;

struct Url {
  std::string host, port, path;
};

Result<Url> parse_http_url(const std::string& url) {
  if (url.rfind("http://", 0) != 0) return invalid_argument("not an http:// URL: " + url);
  const std::string rest = url.substr(7);
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  Url u;
  u.path = slash == std::string::npos ? "/" : rest.substr(slash);
  if (!authority.empty() && authority[0] == '[') {  // [v6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) return invalid_argument("bad IPv6 host in " + url);
    u.host = authority.substr(1, close - 1);
    u.port = close + 1 < authority.size() && authority[close + 1] == ':' ? authority.substr(close + 2) : "80";
  } else {
    const size_t colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
    u.port = colon == std::string::npos ? "80" : authority.substr(colon + 1);
  }
  if (u.host.empty() || u.port.empty()) return invalid_argument("bad host:port in " + url);
  return u;
}

enum class ConnState { kConnecting, kWriting, kReading, kIdle };

struct Conn {
  int fd = -1;
  uint64_t gen = 0;
  ConnState state = ConnState::kConnecting;
  std::unique_ptr<Transfer> t;
  std::string out;
  size_t out_off = 0;
  Http1Response response;
  bool reused = false;
  bool got_bytes = false;
  bool retried = false;
};

class NativeEngine final : public HttpEngine {
 public:
  explicit NativeEngine(RunTracker& tracker) : tracker_(tracker), buf_(kReadBuf) {}
  ~NativeEngine() override {
    for (auto& [fd, c] : conns_) close(fd);
    if (epoll_fd_ >= 0) close(epoll_fd_);
    if (addr_) freeaddrinfo(addr_);
  }

  Status init() {
    MX_ASSIGN_OR_RETURN(Url u, parse_http_url(tracker_.target().url));
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    const int rc = getaddrinfo(u.host.c_str(), u.port.c_str(), &hints, &addr_);
    if (rc != 0 || !addr_) return unavailable("resolve " + u.host + ":" + u.port + ": " + gai_strerror(rc));
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) return internal_error(std::string("epoll_create1: ") + std::strerror(errno));
    head_ = "POST " + u.path + " HTTP/1.1\r\nHost: " + u.host + ":" + u.port +
            "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nUser-Agent: mxserve-bench\r\n";
    for (const std::string& h : tracker_.target().headers) head_ += h + "\r\n";
    head_ += "Content-Length: ";
    return Status::ok();
  }

  Status start(std::unique_ptr<Transfer> t) override {
    t->rec.http_status = 0;
    const double deadline = t->rec.sent_s + tracker_.target().request_timeout_s;
    Conn* c = nullptr;
    while (!idle_.empty() && !c) {
      auto it = conns_.find(idle_.back());
      idle_.pop_back();
      if (it != conns_.end() && it->second->state == ConnState::kIdle) c = it->second.get();
    }
    if (c) {
      c->reused = true;
    } else {
      MX_ASSIGN_OR_RETURN(c, open_conn());
    }
    begin(*c, std::move(t));
    ++in_flight_;
    timeouts_.push({deadline, c->fd, c->gen});
    if (c->state == ConnState::kWriting) write_some(*c);
    return Status::ok();
  }

  Status wait(double timeout_s) override {
    // NOTE: adaptive coalescing. When the last wake-up found many ready sockets, sleep up to
    // kCoalesceS before looking again: data that lands meanwhile wakes nobody, and the next
    // epoll call collects it in one batch. This halves the kernel cost per SSE event at ~100k
    // events/s and adds at most kCoalesceS (plus timer slack) to those events' timestamps; at
    // low event rates the loop blocks in epoll and timestamps are taken on wake-up.
    if (last_batch_ >= kCoalesceMinBatch && timeout_s > 0) {
      const double nap = std::min(timeout_s, kCoalesceS);
      timespec nap_ts{0, static_cast<long>(nap * 1e9)};
      nanosleep(&nap_ts, nullptr);
      timeout_s -= nap;
    }
    timespec ts{};
    timespec* tsp = nullptr;
    if (std::isfinite(timeout_s)) {
      const int64_t ns = static_cast<int64_t>(std::max(0.0, timeout_s) * 1e9) + 1;
      ts.tv_sec = ns / 1'000'000'000;
      ts.tv_nsec = ns % 1'000'000'000;
      tsp = &ts;
    }
    const int n = epoll_pwait2(epoll_fd_, events_, kMaxEvents, tsp, nullptr);
    if (n < 0 && errno != EINTR) return internal_error(std::string("epoll_pwait2: ") + std::strerror(errno));
    last_batch_ = std::max(n, 0);
    for (int i = 0; i < n; ++i) {
      auto it = conns_.find(events_[i].data.fd);
      if (it == conns_.end()) continue;
      on_event(*it->second, events_[i].events);
    }
    expire_timeouts();
    return Status::ok();
  }

  double next_deadline() const override { return timeouts_.empty() ? kNever : timeouts_.top().at; }
  int64_t in_flight() const override { return in_flight_; }

 private:
  struct Timeout {
    double at;
    int fd;
    uint64_t gen;
    bool operator>(const Timeout& o) const { return at > o.at; }
  };
  static constexpr int kMaxEvents = 1024;
  static constexpr int kCoalesceMinBatch = 16;
  static constexpr double kCoalesceS = 100e-6;

  Result<Conn*> open_conn() {
    const int fd = socket(addr_->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return internal_error(std::string("socket: ") + std::strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);  // kernel receive times, see read_some
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    const int rc = connect(fd, addr_->ai_addr, addr_->ai_addrlen);
    c->state = rc == 0 ? ConnState::kWriting : ConnState::kConnecting;
    if (rc != 0 && errno != EINPROGRESS) c->state = ConnState::kConnecting;  // error surfaces via SO_ERROR
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    Conn* raw = c.get();
    conns_[fd] = std::move(c);
    return raw;
  }

  void begin(Conn& c, std::unique_ptr<Transfer> t) {
    c.gen = ++gen_;
    c.out = head_ + std::to_string(t->body.size()) + "\r\n\r\n" + t->body;
    c.out_off = 0;
    c.response.reset();
    c.got_bytes = false;
    c.t = std::move(t);
    if (c.state == ConnState::kIdle) c.state = ConnState::kWriting;
    set_events(c, EPOLLIN | EPOLLOUT);
  }

  void set_events(Conn& c, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = c.fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  }

  void close_conn(Conn& c) {
    const int fd = c.fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    conns_.erase(fd);  // destroys c
  }

  // Ends the request on `c` with a transport error (or retries it once on a fresh connection). `why` by value:
  // callers pass c.response.error(), which close_conn(c) destroys.
  void fail(Conn& c, std::string why) {
    std::unique_ptr<Transfer> t = std::move(c.t);
    const bool retry = c.reused && !c.got_bytes && !c.retried;
    close_conn(c);
    if (!t) return;
    if (retry) {
      auto fresh = open_conn();
      if (fresh.is_ok()) {
        Conn* n = *fresh;
        begin(*n, std::move(t));
        n->retried = true;
        timeouts_.push({n->t->rec.sent_s + tracker_.target().request_timeout_s, n->fd, n->gen});
        return;
      }
    }
    --in_flight_;
    tracker_.finish(std::move(t), "transport: " + why);
  }

  void complete(Conn& c) {
    std::unique_ptr<Transfer> t = std::move(c.t);
    --in_flight_;
    if (c.response.keep_alive()) {
      c.state = ConnState::kIdle;
      c.reused = false;
      c.retried = false;
      c.gen = ++gen_;
      set_events(c, EPOLLIN);
      idle_.push_back(c.fd);
    } else {
      close_conn(c);
    }
    tracker_.finish(std::move(t), "");
  }

  void write_some(Conn& c) {
    while (c.out_off < c.out.size()) {
      const ssize_t w = ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        fail(c, std::string("send: ") + std::strerror(errno));
        return;
      }
      c.out_off += static_cast<size_t>(w);
    }
    c.out.clear();
    c.out.shrink_to_fit();
    c.state = ConnState::kReading;
    set_events(c, EPOLLIN);
  }

  void on_event(Conn& c, uint32_t events) {
    if (c.state == ConnState::kIdle) {  // the server closed (or wrote to) an idle connection
      close_conn(c);
      return;
    }
    if (c.state == ConnState::kConnecting) {
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        fail(c, std::string("connect: ") + std::strerror(err));
        return;
      }
      if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
      c.state = ConnState::kWriting;
    }
    if (c.state == ConnState::kWriting) {
      write_some(c);
      return;
    }
    read_some(c);
  }

  // NOTE: the stamp of received bytes is the kernel's receive time of the last segment read
  // (SO_TIMESTAMPNS; CLOCK_REALTIME, mapped to the monotonic run clock with an offset sampled at
  // each read), not the time this thread got around to reading them: a client thread that waits
  // for a CPU behind other processes, or behind a batch of other sockets, still stamps each event
  // when it arrived. Bytes without a timestamp fall back to the read time. The difference (read
  // lag) is reported to the tracker as a measure of the loop's headroom.
  void read_some(Conn& c) {
    iovec iov{buf_.data(), buf_.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(timespec)) + 64];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(c.fd, &msg, 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      fail(c, std::string("recv: ") + std::strerror(errno));
      return;
    }
    Http1Response::State st;
    if (n == 0) {
      st = c.response.on_eof();
    } else {
      c.got_bytes = true;
      const double read_time = tracker_.now_s();
      double now = read_time;
      for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_TIMESTAMPNS) continue;
        timespec kernel_rt;
        std::memcpy(&kernel_rt, CMSG_DATA(cm), sizeof kernel_rt);
        timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        const double age = static_cast<double>(rt.tv_sec - kernel_rt.tv_sec) +
                           static_cast<double>(rt.tv_nsec - kernel_rt.tv_nsec) * 1e-9;
        if (age >= 0 && age < 60) now = std::max(c.t->rec.sent_s, tracker_.now_s() - age);
      }
      tracker_.note_read_lag(read_time - now);
      Transfer* t = c.t.get();
      st = c.response.feed(buf_.data(), static_cast<size_t>(n), [&](const char* p, size_t k) {
        if (t->rec.http_status == 0) t->rec.http_status = c.response.status();
        t->on_body(p, k, now);
      });
      if (t->rec.http_status == 0 && c.response.state() != Http1Response::State::kHead)
        t->rec.http_status = c.response.status();
    }
    if (st == Http1Response::State::kDone) complete(c);
    else if (st == Http1Response::State::kError) fail(c, c.response.error());
  }

  void expire_timeouts() {
    const double now = tracker_.now_s();
    while (!timeouts_.empty() && timeouts_.top().at <= now) {
      const Timeout to = timeouts_.top();
      timeouts_.pop();
      auto it = conns_.find(to.fd);
      if (it == conns_.end() || it->second->gen != to.gen || !it->second->t) continue;
      Conn& c = *it->second;
      c.retried = true;  // no retry on timeout
      c.reused = false;
      std::unique_ptr<Transfer> t = std::move(c.t);
      close_conn(c);
      --in_flight_;
      tracker_.finish(std::move(t), timeout_message(tracker_.target().request_timeout_s));
    }
  }

  RunTracker& tracker_;
  std::vector<char> buf_;
  addrinfo* addr_ = nullptr;
  int epoll_fd_ = -1;
  std::string head_;
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;
  std::vector<int> idle_;
  std::priority_queue<Timeout, std::vector<Timeout>, std::greater<Timeout>> timeouts_;
  uint64_t gen_ = 0;
  int64_t in_flight_ = 0;
  int last_batch_ = 0;
  epoll_event events_[kMaxEvents];
};

}  // namespace

Result<std::unique_ptr<HttpEngine>> make_native_engine(RunTracker& tracker) {
  auto e = std::make_unique<NativeEngine>(tracker);
  MX_RETURN_IF_ERROR(e->init());
  return std::unique_ptr<HttpEngine>(std::move(e));
}

}  // namespace mxserve::bench
