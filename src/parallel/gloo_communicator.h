// The Gloo communicator: the ranks of a multi-node CPU launch (one process per node, one thread per local
// rank) exchange host tensors over TCP through Gloo (Debian's libgloo-dev). Each rank owns one Gloo context
// over the whole world, connected as a full mesh through node 0's key-value store (parallel/tcp_link.h:
// KvStoreServer; this Gloo has no TCP store of its own, only file / hash / redis stores).
// Every collective is an all-gather (Gloo allgatherv of each rank's bytes, with a header naming the op, dtype
// and shape) followed by local work, so:
//  - Deterministic: reductions add (or max) the ranks' inputs in rank order 0..N-1, the CPU thread group's
//    order: every rank gets the same bits, the same bits as a one-process launch of the same layout.
//  - Checked: a rank that brings another op or shape is an error on every rank naming the op and the ranks.
//  - No hang: Gloo's timeout (CpuGroupOptions::timeout) bounds every wait; abort() closes this rank's
//    connections, so the peers' pending collectives fail at once ("Connection closed by peer"); every error
//    names this rank and its node.
// Cost: an all-gather moves size x the bytes of a ring all-reduce (fine for the CPU reference and its tests;
// the CUDA path uses NCCL). f32 only for reductions; gathers and all-to-all copy bytes of any dtype.
// Builds without Gloo (gloo_unavailable.cpp): gloo_available() is false and make_ refuses, naming the package.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace mxserve::parallel {

struct GlooOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // each collective, and the mesh connect
  std::string store_host;  // node 0's store (its --dist-init-addr host)
  int store_port = 0;
  std::string bind_host;   // the address of this node the other nodes reach (Gloo listens there)
  int ranks_per_node = 1;  // rank r is on node r / ranks_per_node (error messages)
};

bool gloo_available();

// One communicator per local rank (layouts are this node's ranks of the world, their .rank global); connects
// every rank's full mesh in parallel. Errors name the rank and node that failed.
Result<std::vector<std::unique_ptr<Communicator>>> make_gloo_communicators(const std::vector<RankLayout>& local,
                                                                           const GlooOptions& options);

}  // namespace mxserve::parallel
