// The multi-node rendezvous (sglang's flags: --nnodes N --node-rank R --dist-init-addr host:port): node 0
// listens on host:port, every other node connects and says hello (the world it expects and its node
// rank), and once all N-1 have arrived node 0 sends each the same payload (the NCCL unique id of the
// world). Plain TCP sockets, no CUDA, so the CPU tests run it with threads on localhost.
// Invariant: either every node gets node 0's payload, or every node that reached node 0 gets an error
// naming the culprit (the node with the wrong --nnodes, a node rank given twice, the node that never came,
// a timeout) -- no node waits past the timeout (a connected node waits 2 s more for node 0's verdict).
// Wire format: frames of a 4-byte big-endian length + bytes. Hello "mxserve-rendezvous 1 <nnodes>
// <node_rank>"; reply "OK" + payload or "ERR <message>".
#pragma once

#include <chrono>
#include <string>

#include "core/status.h"

namespace mxserve::parallel {

struct DistInit {
  int nnodes = 1;
  int node_rank = 0;
  std::string host;  // node 0's address (--dist-init-addr host:port)
  int port = 0;
  int timeout_s = 0;  // --dist-timeout: > 0 bounds the multi-node start-up and each collective (launch/multinode.h)
  std::string describe() const;  // "node 1 of 2 via 10.0.0.1:5000"
};

// "host:port" or "[v6addr]:port" -> host, port (1..65535); the error names --dist-init-addr.
Status parse_dist_init_addr(const std::string& addr, DistInit* out);
// nnodes >= 1, 0 <= node_rank < nnodes, an address when nnodes > 1; errors name the flag.
Status validate_dist_init(const DistInit& d);

struct RendezvousOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};  // for the whole rendezvous, per node
};

// Node 0: serves `payload` to the other nodes and returns it. Other nodes: return node 0's payload.
Result<std::string> rendezvous_share(const DistInit& d, const std::string& payload, const RendezvousOptions& options = {});

}  // namespace mxserve::parallel
