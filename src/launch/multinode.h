// Multi-node launches (sglang's --nnodes N --node-rank R --dist-init-addr HOST:PORT): one process per node,
// each running world / N consecutive ranks (rank r on node r / (world / N)). Node 0 runs the HTTP server, the
// engine and the scheduler; before each model call it sends the step (launch/step_codec.h) to every follower
// node, whose step loop (run_follower_node) runs the same call on its own ranks; the ranks meet in their
// collectives (CPU: Gloo, parallel/gloo_communicator.h; CUDA: NCCL with node 0's unique id).
// Start-up: the TCP rendezvous (parallel/rendezvous.h) hands every node node 0's link port (and the NCCL id);
// the followers connect their step link, the ranks connect their communicators through node 0's store, each
// node loads its ranks, then a handshake: each follower reports READY with its launch fingerprint (model,
// layout, backend) or its error; node 0 answers GO or the error, so every node fails naming the culprit.
// Invariant: no node waits without a deadline except a follower waiting for the next step (node 0 idle);
// a node that stops closes its links, and every other node then fails naming it (no hang).
// Not yet: data parallelism across nodes (dp > 1 with --nnodes > 1 is refused); MTP on CUDA multi-node.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/causal_lm.h"
#include "parallel/communicator.h"
#include "parallel/rank_layout.h"
#include "parallel/rendezvous.h"

namespace mxserve::launch {

struct LaunchConfig;
class LaunchedModel;

// This process's --nnodes / --node-rank / --dist-init-addr (set by the CLI; default: one node). A
// LaunchConfig whose `dist` has nnodes 1 uses this one.
void set_process_dist_init(const parallel::DistInit& d);
const parallel::DistInit& process_dist_init();

// The ranks of this node (global ranks, devices first_device + local index) and the check that the layout
// spreads evenly over the nodes. Errors name the flags.
Result<std::vector<parallel::RankLayout>> node_ranks(const std::vector<parallel::RankLayout>& world,
                                                     const parallel::ParallelConfig& p, const parallel::DistInit& d);

class NodeSession;
struct NodeSessionDeleter {
  void operator()(NodeSession* s) const;
};
using NodeSessionPtr = std::unique_ptr<NodeSession, NodeSessionDeleter>;

// Rendezvous + links (node 0: the store and the followers' step links). cuda: node 0 makes the NCCL id.
// fingerprint: the launch as this node sees it (model, layout, backend); a follower's must equal node 0's.
Result<NodeSessionPtr> start_node_session(const parallel::DistInit& d, bool cuda,
                                                        std::chrono::milliseconds timeout, int ranks_per_node,
                                                        const std::string& fingerprint);
// The local ranks' communicators over the whole world (Gloo on the CPU, NCCL on CUDA).
Result<std::vector<std::unique_ptr<parallel::Communicator>>> node_communicators(
    NodeSession& session, const std::vector<parallel::RankLayout>& local, const std::vector<backend::Backend*>& backends,
    bool cuda, std::chrono::milliseconds timeout);
// The start-up handshake after this node loaded (or failed: `local` is its status). Returns the first
// failure of any node, naming it (node 0 waits up to 30 min for a follower's load; a dead one is seen at once).
Status node_handshake(NodeSession& session, const Status& local);
// Node 0: the model the engine drives (sends each call to the followers, then runs `local`). comms: this
// node's ranks' communicators, aborted when a call fails (the other nodes then fail instead of waiting).
std::unique_ptr<model::CausalLM> make_leader_model(NodeSession& session, model::CausalLM& local, backend::Backend& be,
                                                   std::vector<parallel::Communicator*> comms);
// A follower node: runs node 0's steps on its ranks until node 0 quits (ok) or a failure (names the node).
Status run_follower_node(LaunchedModel& launched);
const parallel::DistInit& session_dist(const NodeSession& session);
// "node 1 of 2 (ranks 2..3)": for logs.
std::string describe_node(const NodeSession& session);

}  // namespace mxserve::launch
