#include "parallel/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

namespace mxserve::parallel {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kHello = "mxserve-rendezvous 1";
constexpr uint32_t kMaxFrame = 1 << 20;
constexpr std::chrono::milliseconds kGrace{2000};

std::string errno_str() { return std::strerror(errno); }

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Waits until fd is readable (or writable); false at the deadline.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // the read/write that follows reports the error
  }
}

Status send_all(int fd, const std::string& bytes, Clock::time_point deadline, const std::string& peer) {
  size_t done = 0;
  while (done < bytes.size()) {
    if (!wait_fd(fd, POLLOUT, deadline)) return unavailable("rendezvous: timed out sending to " + peer);
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return unavailable("rendezvous: sending to " + peer + " failed: " + errno_str());
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

Status recv_all(int fd, char* data, size_t size, Clock::time_point deadline, const std::string& peer) {
  size_t done = 0;
  while (done < size) {
    if (!wait_fd(fd, POLLIN, deadline)) return unavailable("rendezvous: timed out waiting for " + peer);
    const ssize_t n = ::recv(fd, data + done, size - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return unavailable("rendezvous: " + peer + " closed the connection");
    if (n < 0) return unavailable("rendezvous: reading from " + peer + " failed: " + errno_str());
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

Status send_frame(int fd, const std::string& body, Clock::time_point deadline, const std::string& peer) {
  const uint32_t n = htonl(static_cast<uint32_t>(body.size()));
  std::string frame(reinterpret_cast<const char*>(&n), 4);
  return send_all(fd, frame + body, deadline, peer);
}

Result<std::string> recv_frame(int fd, Clock::time_point deadline, const std::string& peer) {
  uint32_t n = 0;
  MX_RETURN_IF_ERROR(recv_all(fd, reinterpret_cast<char*>(&n), 4, deadline, peer));
  n = ntohl(n);
  if (n > kMaxFrame) return data_loss("rendezvous: " + peer + " sent a frame of " + std::to_string(n) + " bytes (not mxserve?)");
  std::string body(n, '\0');
  MX_RETURN_IF_ERROR(recv_all(fd, body.data(), n, deadline, peer));
  return body;
}

Result<addrinfo*> resolve(const DistInit& d, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(d.host.c_str(), std::to_string(d.port).c_str(), &hints, &res);
  if (rc != 0 || res == nullptr)
    return invalid_argument("--dist-init-addr " + d.host + ":" + std::to_string(d.port) + ": cannot resolve " + d.host +
                            " (" + ::gai_strerror(rc) + ")");
  return res;
}

Result<std::string> serve(const DistInit& d, const std::string& payload, Clock::time_point deadline,
                          const RendezvousOptions& options) {
  MX_ASSIGN_OR_RETURN(addrinfo * ai, resolve(d, true));
  Socket listener;
  std::string bind_error;
  for (addrinfo* a = ai; a != nullptr && listener.fd() < 0; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (s.fd() < 0) continue;
    const int one = 1;
    ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s.fd(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(s.fd(), 64) == 0) listener = std::move(s);
    else bind_error = errno_str();
  }
  ::freeaddrinfo(ai);
  if (listener.fd() < 0)
    return unavailable("--dist-init-addr " + d.host + ":" + std::to_string(d.port) + ": node 0 cannot listen there (" +
                       bind_error + ")");
  std::map<int, Socket> nodes;  // node rank -> connection
  std::vector<Socket> rejected;
  Status problem = Status::ok();
  while (static_cast<int>(nodes.size()) < d.nnodes - 1 && problem.is_ok()) {
    if (!wait_fd(listener.fd(), POLLIN, deadline)) {
      std::string missing;
      for (int r = 1; r < d.nnodes; ++r)
        if (!nodes.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      problem = unavailable("rendezvous on " + d.describe() + ": node(s) " + missing + " never connected within " +
                            std::to_string(options.timeout.count() / 1000) + " s (check --nnodes, --dist-init-addr and "
                            "that every node was started)");
      break;
    }
    Socket c(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (c.fd() < 0) continue;
    auto hello = recv_frame(c.fd(), deadline, "a connecting node");
    if (!hello.is_ok()) continue;  // not one of ours, or it went away: keep listening
    std::istringstream in(*hello);
    std::string magic, version;
    int nnodes = -1, rank = -1;
    in >> magic >> version >> nnodes >> rank;
    const std::string culprit = "node " + std::to_string(rank);
    std::string err;
    if (magic + " " + version != kHello) err = "a connection that is not an mxserve node of this version (\"" + *hello + "\")";
    else if (nnodes != d.nnodes)
      err = culprit + " was started with --nnodes " + std::to_string(nnodes) + ", node 0 with --nnodes " +
            std::to_string(d.nnodes);
    else if (rank < 1 || rank >= d.nnodes) err = culprit + ": --node-rank must be in 1.." + std::to_string(d.nnodes - 1);
    else if (nodes.count(rank)) err = "--node-rank " + std::to_string(rank) + " was given to two nodes";
    if (!err.empty()) {
      static_cast<void>(send_frame(c.fd(), "ERR " + err, deadline, culprit));  // best effort: we fail anyway
      problem = invalid_argument("rendezvous on " + d.describe() + ": " + err);
      rejected.push_back(std::move(c));
      break;
    }
    nodes.emplace(rank, std::move(c));
  }
  for (auto& [rank, c] : nodes) {
    const std::string peer = "node " + std::to_string(rank);
    if (problem.is_ok()) MX_RETURN_IF_ERROR(send_frame(c.fd(), "OK" + payload, deadline, peer));
    else static_cast<void>(send_frame(c.fd(), "ERR node 0 gave up: " + problem.message(), deadline + kGrace, peer));
  }
  if (!problem.is_ok()) return problem;
  return payload;
}

Result<std::string> join(const DistInit& d, Clock::time_point deadline, const RendezvousOptions& options) {
  const std::string where = d.host + ":" + std::to_string(d.port);
  std::string last_error = "no attempt";
  while (true) {
    MX_ASSIGN_OR_RETURN(addrinfo * ai, resolve(d, false));
    Socket conn;
    for (addrinfo* a = ai; a != nullptr && conn.fd() < 0; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (s.fd() < 0) continue;
      if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) == 0) conn = std::move(s);
      else last_error = errno_str();
    }
    ::freeaddrinfo(ai);
    if (conn.fd() >= 0) {
      const std::string hello = std::string(kHello) + " " + std::to_string(d.nnodes) + " " + std::to_string(d.node_rank);
      MX_RETURN_IF_ERROR(send_frame(conn.fd(), hello, deadline, "node 0 at " + where));
      // A grace past the deadline: node 0 sends its verdict (e.g. another node never came) at the deadline.
      auto reply = recv_frame(conn.fd(), deadline + kGrace, "node 0 at " + where);
      if (!reply.is_ok())
        return reply.status().with_context("rendezvous of " + d.describe() + " (node 0 took the connection but sent no id)");
      if (reply->rfind("OK", 0) == 0) return reply->substr(2);
      return invalid_argument("rendezvous of " + d.describe() + ": node 0 refused: " +
                              (reply->rfind("ERR ", 0) == 0 ? reply->substr(4) : *reply));
    }
    if (ms_left(deadline) == 0)
      return unavailable("rendezvous of " + d.describe() + ": node 0 was not reachable at " + where + " within " +
                         std::to_string(options.timeout.count() / 1000) + " s (" + last_error +
                         "; start node 0 with --node-rank 0 and the same --dist-init-addr)");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, ms_left(deadline))));
  }
}

}  // namespace

std::string DistInit::describe() const {
  return "node " + std::to_string(node_rank) + " of " + std::to_string(nnodes) + " via " + host + ":" + std::to_string(port);
}

Status parse_dist_init_addr(const std::string& addr, DistInit* out) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size())
    return invalid_argument("--dist-init-addr '" + addr + "': expected host:port (node 0's address)");
  std::string host = addr.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port_str = addr.substr(colon + 1);
  char* end = nullptr;
  const long port = std::strtol(port_str.c_str(), &end, 10);
  if (*end != '\0' || port < 1 || port > 65535)
    return invalid_argument("--dist-init-addr '" + addr + "': port '" + port_str + "' is not in 1..65535");
  out->host = host;
  out->port = static_cast<int>(port);
  return Status::ok();
}

Status validate_dist_init(const DistInit& d) {
  if (d.nnodes < 1) return invalid_argument("--nnodes must be at least 1, got " + std::to_string(d.nnodes));
  if (d.node_rank < 0 || d.node_rank >= d.nnodes)
    return invalid_argument("--node-rank " + std::to_string(d.node_rank) + " must be in 0.." +
                            std::to_string(d.nnodes - 1) + " (--nnodes " + std::to_string(d.nnodes) + ")");
  if (d.nnodes > 1 && (d.host.empty() || d.port <= 0))
    return invalid_argument("--nnodes " + std::to_string(d.nnodes) + " needs --dist-init-addr host:port (node 0's address)");
  return Status::ok();
}

Result<std::string> rendezvous_share(const DistInit& d, const std::string& payload, const RendezvousOptions& options) {
  MX_RETURN_IF_ERROR(validate_dist_init(d));
  if (options.timeout.count() <= 0) return invalid_argument("rendezvous: the timeout must be positive");
  if (d.nnodes == 1) return payload;
  const auto deadline = Clock::now() + options.timeout;
  return d.node_rank == 0 ? serve(d, payload, deadline, options) : join(d, deadline, options);
}

}  // namespace mxserve::parallel
