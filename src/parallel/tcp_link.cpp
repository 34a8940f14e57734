#include "parallel/tcp_link.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mxserve::parallel {
namespace {

constexpr uint64_t kMaxFrame = uint64_t{1} << 30;

std::string errno_str() { return std::strerror(errno); }

int ms_left(LinkClock::time_point deadline) {
  if (deadline == kForever) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - LinkClock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

bool wait_fd(int fd, short events, LinkClock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // the read / write that follows reports the error
  }
}

Status send_all(int fd, const char* data, size_t size, LinkClock::time_point deadline, const std::string& peer) {
  size_t done = 0;
  while (done < size) {
    if (!wait_fd(fd, POLLOUT, deadline)) return unavailable("timed out sending to " + peer);
    const ssize_t n = ::send(fd, data + done, size - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return unavailable("sending to " + peer + " failed: " + errno_str() + " (it stopped?)");
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

Status recv_all(int fd, char* data, size_t size, LinkClock::time_point deadline, const std::string& peer) {
  size_t done = 0;
  while (done < size) {
    if (!wait_fd(fd, POLLIN, deadline)) return unavailable("timed out waiting for " + peer);
    const ssize_t n = ::recv(fd, data + done, size - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return unavailable(peer + " closed the connection (it stopped or failed)");
    if (n < 0) return unavailable("reading from " + peer + " failed: " + errno_str());
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

}  // namespace

TcpConn::TcpConn(TcpConn&& o) noexcept : fd_(o.fd_), peer_(std::move(o.peer_)) { o.fd_ = -1; }
TcpConn& TcpConn::operator=(TcpConn&& o) noexcept {
  std::swap(fd_, o.fd_);
  std::swap(peer_, o.peer_);
  return *this;
}

void TcpConn::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status TcpConn::send_frame(const std::string& body, LinkClock::time_point deadline) {
  if (fd_ < 0) return unavailable("the connection to " + peer_ + " is closed");
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((uint64_t{body.size()} >> (56 - 8 * i)) & 0xff);
  MX_RETURN_IF_ERROR(send_all(fd_, len, 8, deadline, peer_));
  return send_all(fd_, body.data(), body.size(), deadline, peer_);
}

Result<std::string> TcpConn::recv_frame(LinkClock::time_point deadline) {
  if (fd_ < 0) return unavailable("the connection to " + peer_ + " is closed");
  unsigned char len[8];
  MX_RETURN_IF_ERROR(recv_all(fd_, reinterpret_cast<char*>(len), 8, deadline, peer_));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n = (n << 8) | len[i];
  if (n > kMaxFrame) return data_loss(peer_ + " sent a frame of " + std::to_string(n) + " bytes (not mxserve?)");
  std::string body(n, '\0');
  MX_RETURN_IF_ERROR(recv_all(fd_, body.data(), n, deadline, peer_));
  return body;
}

bool TcpConn::peer_closed() const {
  if (fd_ < 0) return true;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP)) return true;
  char c;
  const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0;
}

std::string TcpConn::local_host() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (fd_ < 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char host[NI_MAXHOST];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0)
    return "";
  return host;
}

TcpListener::TcpListener(TcpListener&& o) noexcept : fd_(o.fd_), port_(o.port_) { o.fd_ = -1; }
TcpListener& TcpListener::operator=(TcpListener&& o) noexcept {
  std::swap(fd_, o.fd_);
  std::swap(port_, o.port_);
  return *this;
}
TcpListener::~TcpListener() { close(); }
void TcpListener::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<TcpListener> TcpListener::listen_any(int port) {
  TcpListener l;
  l.fd_ = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool v6 = l.fd_ >= 0;
  if (!v6) l.fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l.fd_ < 0) return unavailable("multi-node link: socket() failed: " + errno_str());
  int one = 1, zero = 0;
  ::setsockopt(l.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rc;
  if (v6) {
    ::setsockopt(l.fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // v4 peers too
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(l.fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(l.fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  }
  if (rc != 0 || ::listen(l.fd_, 256) != 0)
    return unavailable("multi-node link: cannot listen on port " + std::to_string(port) + ": " + errno_str());
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ::getsockname(l.fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  l.port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                     : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return l;
}

Result<TcpConn> TcpListener::accept(LinkClock::time_point deadline, const std::string& what) {
  if (fd_ < 0) return unavailable("multi-node link: the listener is closed");
  if (!wait_fd(fd_, POLLIN, deadline)) return unavailable("timed out waiting for " + what + " to connect");
  const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return unavailable("multi-node link: accept failed: " + errno_str());
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return TcpConn(fd, what);
}

Result<TcpConn> tcp_connect(const std::string& host, int port, LinkClock::time_point deadline, const std::string& peer) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string last = "no address";
  while (true) {
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0 || res == nullptr) return invalid_argument("cannot resolve " + host + " (" + ::gai_strerror(rc) + ")");
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        ::freeaddrinfo(res);
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return TcpConn(fd, peer);
      }
      last = errno_str();
      ::close(fd);
    }
    ::freeaddrinfo(res);
    if (ms_left(deadline) == 0)
      return unavailable(peer + " at " + host + ":" + std::to_string(port) + " was not reachable (" + last + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void TcpConn::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

KvStoreServer::~KvStoreServer() { stop(); }

void KvStoreServer::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    for (auto& c : conns_) c->shutdown();  // unblocks the handlers' reads
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
  conns_.clear();
}

void KvStoreServer::serve(TcpConn conn) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_) return;
  conns_.push_back(std::make_unique<TcpConn>(std::move(conn)));
  TcpConn* c = conns_.back().get();
  threads_.emplace_back([this, c] { handle(c); });
}

// Requests: "S" + 4-byte key length + key + value -> "K"; "G" + timeout ms (8 bytes) + key -> "V" + value, or
// "E" + why when the key was not set in time.
void KvStoreServer::handle(TcpConn* conn) {
  while (true) {
    auto req = conn->recv_frame(kForever);
    if (!req.is_ok() || req->empty()) return;
    const std::string& r = *req;
    std::string reply;
    if (r[0] == 'S' && r.size() >= 5) {
      uint32_t klen = 0;
      std::memcpy(&klen, r.data() + 1, 4);
      if (5 + uint64_t{klen} > r.size()) return;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        values_[r.substr(5, klen)] = r.substr(5 + klen);
      }
      cv_.notify_all();
      reply = "K";
    } else if (r[0] == 'G' && r.size() >= 9) {
      int64_t ms = 0;
      std::memcpy(&ms, r.data() + 1, 8);
      const std::string key = r.substr(9);
      std::unique_lock<std::mutex> lock(mutex_);
      const bool found = cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return stop_ || values_.count(key) > 0; });
      if (stop_) return;
      reply = found ? "V" + values_[key] : "E" + key;
    } else {
      return;  // not a store client
    }
    if (!conn->send_frame(reply, LinkClock::now() + std::chrono::seconds(30)).is_ok()) return;
  }
}

Result<std::unique_ptr<KvStoreClient>> KvStoreClient::connect(const std::string& host, int port,
                                                               std::chrono::milliseconds timeout) {
  auto c = std::unique_ptr<KvStoreClient>(new KvStoreClient());
  MX_ASSIGN_OR_RETURN(c->conn_, tcp_connect(host, port, LinkClock::now() + timeout, "node 0's store"));
  MX_RETURN_IF_ERROR(c->conn_.send_frame("KV", LinkClock::now() + timeout));
  c->timeout_ = timeout;
  return c;
}

Status KvStoreClient::set(const std::string& key, const std::string& value) {
  const uint32_t klen = static_cast<uint32_t>(key.size());
  std::string req = "S" + std::string(reinterpret_cast<const char*>(&klen), 4) + key + value;
  MX_RETURN_IF_ERROR(conn_.send_frame(req, LinkClock::now() + timeout_));
  MX_ASSIGN_OR_RETURN(std::string reply, conn_.recv_frame(LinkClock::now() + timeout_));
  if (reply != "K") return data_loss("node 0's store answered a set of '" + key + "' with garbage");
  return Status::ok();
}

Result<std::string> KvStoreClient::get(const std::string& key) {
  const int64_t ms = timeout_.count();
  std::string req = "G" + std::string(reinterpret_cast<const char*>(&ms), 8) + key;
  MX_RETURN_IF_ERROR(conn_.send_frame(req, LinkClock::now() + timeout_));
  MX_ASSIGN_OR_RETURN(std::string reply, conn_.recv_frame(LinkClock::now() + timeout_ + std::chrono::seconds(5)));
  if (!reply.empty() && reply[0] == 'V') return reply.substr(1);
  return unavailable("key '" + key + "' was not set in node 0's store within " + std::to_string(ms / 1000) +
                     " s (a rank never started: see the other nodes' logs)");
}

}  // namespace mxserve::parallel
