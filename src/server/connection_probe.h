// ConnectionProbe: tells a non-streaming handler that its client has gone away, so the request can be
// aborted and its KV blocks freed instead of generating for nobody. cpp-httplib does not hand handlers
// their socket, so the probe finds it once by its TCP 4-tuple (local port, peer address and port --
// unique while the handler runs, because the library closes the socket only after the handler returns)
// among the process's open descriptors, then peeks at it without blocking.
// Streaming handlers do not need this: the library checks the socket before every chunk.
#pragma once

#include <string>

namespace mxserve::server {

class ConnectionProbe {
 public:
  ConnectionProbe(const std::string& remote_addr, int remote_port, int local_port);
  // True once the peer has closed or reset the connection. False when the socket was not found.
  bool peer_closed() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace mxserve::server
