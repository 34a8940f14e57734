// TCP links between the nodes of a multi-node launch (after the rendezvous, parallel/rendezvous.h): a listener
// on an ephemeral port, connections that carry length-prefixed frames, and a small key-value store served by
// node 0 (the store Gloo's full-mesh connect needs: parallel/gloo_communicator.h). No CUDA, no Gloo: the CPU
// tests run all of it on 127.0.0.1.
// Invariant: every blocking call has a deadline (kForever only where the caller waits for the next step on
// an idle server); a closed peer is an error naming the peer, never a hang.
// Wire format: 8-byte big-endian length + bytes (frames up to 1 GiB: a step's batch and MTP hidden states).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

namespace mxserve::parallel {

using LinkClock = std::chrono::steady_clock;
inline constexpr LinkClock::time_point kForever = LinkClock::time_point::max();

class TcpConn {
 public:
  TcpConn() = default;
  TcpConn(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  TcpConn(TcpConn&& o) noexcept;
  TcpConn& operator=(TcpConn&& o) noexcept;
  TcpConn(const TcpConn&) = delete;
  TcpConn& operator=(const TcpConn&) = delete;
  ~TcpConn() { close(); }

  bool open() const { return fd_ >= 0; }
  const std::string& peer() const { return peer_; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }
  Status send_frame(const std::string& body, LinkClock::time_point deadline);
  Result<std::string> recv_frame(LinkClock::time_point deadline);
  // Without blocking: whether the peer has closed its end (or the connection failed).
  bool peer_closed() const;
  // The local address of this connection ("10.0.0.2"): the interface that reaches the peer.
  std::string local_host() const;
  void shutdown();  // wakes a blocked reader (another thread); close() later
  void close();

 private:
  int fd_ = -1;
  std::string peer_;
};

class TcpListener {
 public:
  TcpListener() = default;
  TcpListener(TcpListener&& o) noexcept;
  TcpListener& operator=(TcpListener&& o) noexcept;
  ~TcpListener();
  // Listens on every interface, port 0 = an ephemeral one.
  static Result<TcpListener> listen_any(int port = 0);
  int port() const { return port_; }
  Result<TcpConn> accept(LinkClock::time_point deadline, const std::string& what);
  void close();

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Connects to host:port, retrying refused connections until the deadline (the listener may not be up yet).
Result<TcpConn> tcp_connect(const std::string& host, int port, LinkClock::time_point deadline, const std::string& peer);

// Node 0's key-value store (set / blocking get), served to every rank of every node over TCP.
class KvStoreServer {
 public:
  KvStoreServer() = default;
  ~KvStoreServer();
  // Serves one connection (its first frame, "KV", was read by the caller) on its own thread until it closes.
  void serve(TcpConn conn);
  void stop();

 private:
  void handle(TcpConn* conn);
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
  bool stop_ = false;
  std::vector<std::unique_ptr<TcpConn>> conns_;
  std::vector<std::thread> threads_;
};

// One rank's connection to the store (not thread-safe: one client per rank).
class KvStoreClient {
 public:
  static Result<std::unique_ptr<KvStoreClient>> connect(const std::string& host, int port, std::chrono::milliseconds timeout);
  Status set(const std::string& key, const std::string& value);
  // Waits until the key is set (up to the timeout given to connect), naming it on timeout.
  Result<std::string> get(const std::string& key);

 private:
  TcpConn conn_;
  std::chrono::milliseconds timeout_{0};
};

}  // namespace mxserve::parallel
