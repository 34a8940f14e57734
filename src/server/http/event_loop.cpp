#include "server/http/event_loop.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/logging.h"
#include "server/http/response_writer.h"

namespace mxserve::server::http {
namespace {

constexpr uint64_t kListenTag = 0;
constexpr uint64_t kWakeTag = 1;
constexpr int kListenBacklog = 4096;
constexpr int kAcceptBatch = 256;
constexpr int kTickMs = 100;
constexpr size_t kReservedFds = 64;  // for model files, logs, the engine
void peer_of(const sockaddr_storage& ss, std::string* addr, int* port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    *port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    *port = ntohs(a->sin6_port);
  }
  *addr = buf;
}

}  // namespace

EventLoop::EventLoop(const HttpLimits& limits, Service& service)
    : limits_(limits),
      service_(service),
      pool_(static_cast<size_t>(std::max(limits.max_handler_threads, 1)), limits.max_queued_handlers) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
}

EventLoop::~EventLoop() {
  stop();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

Status EventLoop::listen(const std::string& host, int port) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur != RLIM_INFINITY && limits_.max_connections + kReservedFds > rl.rlim_cur) {
    const size_t fit = rl.rlim_cur > 2 * kReservedFds ? rl.rlim_cur - kReservedFds : rl.rlim_cur / 2;
    MX_LOG(kWarn) << "the open-file limit (ulimit -n " << rl.rlim_cur << ") allows only " << fit
                  << " HTTP connections, not --max-connections " << limits_.max_connections
                  << "; raise the hard limit (ulimit -Hn) to serve more";
    limits_.max_connections = fit;
  }

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0)
    return unavailable("cannot resolve --host '" + host + "': " + gai_strerror(rc));
  std::string why = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    // SO_REUSEADDR only: SO_REUSEPORT would let a second server bind our port and split the traffic.
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, kListenBacklog) == 0) {
      listen_fd_ = fd;
      break;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  if (listen_fd_ < 0)
    return unavailable("cannot bind " + host + ":" + std::to_string(port) + " (" + why + "; in use, or a bad --host?)");
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  std::string addr;
  peer_of(ss, &addr, &port_);
  set_accepting(true);
  return Status::ok();
}

void EventLoop::set_accepting(bool on) {
  if (listen_fd_ < 0 || on == accepting_) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  epoll_ctl(epoll_fd_, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, listen_fd_, &ev);
  accepting_ = on;
}

void EventLoop::start() { thread_ = std::thread([this] { run(); }); }

void EventLoop::stop() {
  if (!stop_.exchange(true)) wake();
  if (thread_.joinable()) thread_.join();
  pool_.shutdown();  // handlers see client_gone() and return; their posts go nowhere
}

void EventLoop::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

void EventLoop::wake_flush(uint64_t conn_id) {
  {
    std::lock_guard<std::mutex> lock(wake_mutex_);
    flush_ids_.push_back(conn_id);
  }
  wake();
}

void EventLoop::post_done(uint64_t conn_id, bool must_close) {
  {
    std::lock_guard<std::mutex> lock(wake_mutex_);
    done_ids_.emplace_back(conn_id, must_close);
  }
  wake();
}

bool EventLoop::dispatch_to_worker(const std::shared_ptr<Channel>& channel, Request& req, bool keep_alive,
                                   uint64_t conn_id) {
  auto request = std::make_shared<Request>(std::move(req));
  auto job = [this, channel, request, keep_alive, conn_id] {
    const int version = request->version_minor;
    Response res;
    res.attach(channel.get(), version, keep_alive);
    bool must_close = false;
    try {
      service_.handle(*request, res);
    } catch (const std::exception& e) {
      if (res.streaming()) must_close = true;
      else res = service_.error(500, e.what());
    } catch (...) {
      if (res.streaming()) must_close = true;
      else res = service_.error(500, "unknown exception");
    }
    int status = res.status;
    size_t moved = request->body.size() + res.body.size();
    if (res.streaming()) {
      must_close |= !res.writer()->finished() || !res.keep_alive();
      if (channel->client_gone()) status = 499;
    } else if (channel->client_gone()) {
      status = 499;
    } else {
      std::string bytes = serialize_response(res, version, keep_alive);
      moved += bytes.size();
      res = Response();
      channel->send(bytes);
    }
    service_.on_response(status);
    *request = Request();
    res = Response();
    trimmer_.note(moved);
    trimmer_.run_if_due();
    post_done(conn_id, must_close);
  };
  if (pool_.try_submit(std::move(job))) return true;
  req = std::move(*request);  // saturated: the caller answers 503 on the loop
  return false;
}

void EventLoop::run() {
  std::vector<epoll_event> events(512);
  auto last_sweep = Clock::now();
  while (!stop_.load()) {
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), kTickMs);
    const auto now = Clock::now();
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kListenTag) {
        accept_all(now);
      } else if (tag == kWakeTag) {
        uint64_t count;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_, &count, sizeof(count));
      } else if (auto it = conns_.find(tag); it != conns_.end()) {
        it->second->on_events(events[i].events, now);
        sync(*it->second);
      }
    }
    process_wakes(now);
    if (now - last_sweep >= std::chrono::milliseconds(kTickMs)) {
      last_sweep = now;
      sweep(now);
    }
  }
  for (auto& [id, c] : conns_) c->close_now();
  conns_.clear();
  open_ = 0;
  set_accepting(false);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void EventLoop::accept_all(Clock::time_point now) {
  for (int i = 0; i < kAcceptBatch; ++i) {
    if (conns_.size() >= limits_.max_connections && !evict_one()) {
      // Every connection runs a handler: take the new one off the backlog and close it at once.
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      ::close(fd);
      MX_WARN_ONCE << "--max-connections " << limits_.max_connections
                   << " reached with every connection running a handler: new connections are closed";
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        if (evict_one()) continue;
        MX_WARN_ONCE << "out of file descriptors accepting connections (ulimit -n): pausing accept for 100 ms";
        set_accepting(false);
        resume_accept_at_ = now + std::chrono::milliseconds(100);
      }
      return;
    }
    int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    std::string addr;
    int port = 0;
    peer_of(ss, &addr, &port);
    const uint64_t id = next_id_++;
    auto c = std::make_unique<Connection>(id, fd, std::move(addr), port, limits_, static_cast<Connection::Host*>(this),
                                         static_cast<FlushWaker*>(this), now);
    Connection& ref = *c;
    conns_.emplace(id, std::move(c));
    open_ = conns_.size();
    sync(ref);
  }
}

bool EventLoop::evict_one() {
  Connection* victim = nullptr;
  for (auto& [id, c] : conns_) {
    if (!c->evictable()) continue;
    if (!victim || c->waiting_since() < victim->waiting_since()) victim = c.get();
  }
  if (!victim) return false;
  MX_WARN_ONCE << "--max-connections " << limits_.max_connections
               << " reached: closing the longest-waiting idle or slow connection for each new one";
  victim->close_now();
  sync(*victim);
  return true;
}

void EventLoop::process_wakes(Clock::time_point now) {
  std::vector<uint64_t> flushes;
  std::vector<std::pair<uint64_t, bool>> dones;
  {
    std::lock_guard<std::mutex> lock(wake_mutex_);
    flushes.swap(flush_ids_);
    dones.swap(done_ids_);
  }
  for (uint64_t id : flushes) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    it->second->on_flush_wake(now);
    sync(*it->second);
  }
  for (auto [id, must_close] : dones) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    it->second->on_handler_done(must_close, now);
    sync(*it->second);
  }
}

void EventLoop::sweep(Clock::time_point now) {
  if (trimmer_.due()) pool_.try_submit([this] { trimmer_.run_if_due(); });  // a trim skipped by the rate limit
  if (!accepting_ && listen_fd_ >= 0 && now >= resume_accept_at_) set_accepting(true);
  std::vector<Connection*> all;
  all.reserve(conns_.size());
  for (auto& [id, c] : conns_) all.push_back(c.get());
  for (Connection* c : all) {
    c->on_tick(now);
    sync(*c);
  }
}

void EventLoop::sync(Connection& c) {
  if (c.closed()) {
    // close() already removed the fd from the epoll set.
    conns_.erase(c.id());
    open_ = conns_.size();
    return;
  }
  const uint32_t want = c.interest();
  if (want == c.registered) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c.id();
  if (c.registered == 0 && want != 0) {
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.fd(), &ev) != 0) epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd(), &ev);
  } else if (want == 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd(), &ev);
  } else {
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd(), &ev);
  }
  c.registered = want;
}

}  // namespace mxserve::server::http
