// Per-rank CUDA graphs for a LockstepModel whose ranks are NCCL ranks (one GPU each, one process, one worker
// thread per rank): every rank's decode step captured into its OWN graph, on its own stream, by its own thread
// (thread-local capture mode), and every replay launches all of them together from the ranks' threads -- what
// NCCL asks of graphs holding its collectives (parallel/rank_capture.h). The one-GPU stand-in keeps its joined
// capture (parallel/graph_join.h); choose_tp_graph_mode says which layout gets which, or why none.
// How a capture goes (PerRankGraphs::capture, called through CausalLM::capture_device_graph): the decode
// graph's body runs once on the engine thread with the model in recording mode, so its one forward_device call
// is recorded instead of run; then each rank's thread captures that forward on its own backend.
// Inputs: the recorded ids / positions / AttentionMeta tensors are rank 0's device buffers, which the engine
// rewrites before each replay. Every other rank gets mirrors of them on its own device (allocated once per
// source buffer, kept for the model's life) and its graph starts with copies of rank 0's buffers into them
// (memcpy nodes); before each launch rank r's stream waits, outside the graph, for an event rank 0 recorded
// after its host writes (replays are host-serialized, so the event's latest record is this step's), and after
// the launches rank 0's stream waits for every rank's. Rank 0 reads its own buffers in place (tests can make it
// copy too, to run the copy path on one GPU).
// Failure: a rank whose forward or launch fails fails the capture / step with its error, named by rank, and the
// lockstep model aborts the group (so no rank waits forever in a collective; the group stays failed). A rank whose
// forward ran but whose capture or instantiation failed fails the capture, named, without aborting the group
// (nothing is left pending): the engine then runs every step eagerly and says so. Once a per-rank graph exists
// the lockstep model refuses recovery (lockstep_model.h "Recovery"): a reset makes new NCCL communicators, and
// the graphs hold the ones they were captured with.
// Invariant: a captured body makes exactly one forward_device call and nothing else the ranks must repeat
// (the decode graphs' bodies); anything else is refused at capture.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "kvcache/kv_cache.h"
#include "model/causal_lm.h"
#include "parallel/rank_capture.h"

namespace mxserve::launch {

// Which graphs a lockstep model's decode steps get.
enum class TpGraphMode {
  kJoined,   // every rank on one GPU (the shared-device stand-in): one graph on rank 0's stream
  kPerRank,  // one GPU per rank (NCCL): one graph per rank, launched together
  kRefused,  // no graphs: why says so (the engine logs it and runs every step eagerly)
};

struct TpGraphLayout {
  std::vector<int> devices;  // this process's ranks' CUDA devices in rank order (-1: not a CUDA rank)
  int tp = 1, dp = 1;        // the world's layout (rank 0's)
  const char* tp_graphs_env = nullptr;  // MXSERVE_TP_GRAPHS ("0" turns graphs at tp > 1 off)
  bool force_per_rank = false;          // tests: per-rank graphs where the layout allows them (one rank)
};

struct TpGraphChoice {
  TpGraphMode mode = TpGraphMode::kRefused;
  std::string why;  // kRefused: the refusal (names the flag or the layout); else what was chosen
};

TpGraphChoice choose_tp_graph_mode(const TpGraphLayout& layout);
// Why a multi-node launch captures no graphs (node 0's model and a node's lockstep model both say it).
std::string multinode_graphs_refusal();

// meta with every tensor replaced by mirror(tensor) (undefined ones stay as they are) and the kernel
// parameters that point into them (tree_mask, tree_base) pointed at the replacements.
backend::AttentionMeta mirror_attention_meta(const backend::AttentionMeta& meta,
                                             const std::function<Tensor(const Tensor&)>& mirror);

class PerRankGraphs {
 public:
  struct RankSide {
    backend::Backend* backend;
    model::CausalLM* model;
  };
  // Runs fn(r, rank r's cache for kv) on every rank's own thread (device current) at once; the root error.
  using RankFn = std::function<Status(int rank, kvcache::KvCache& rank_kv)>;
  using RunOnRanks = std::function<Status(kvcache::KvCache& kv, const RankFn& fn)>;

  // mirror_rank0: tests -- rank 0 copies its inputs into mirrors too (the copy path on one GPU).
  PerRankGraphs(std::vector<RankSide> ranks, std::unique_ptr<parallel::RankCapture> capture, RunOnRanks run,
                bool mirror_rank0);
  ~PerRankGraphs();

  // Inside capture(): the body's forward_device call is recorded here (not run).
  bool recording() const { return recording_; }
  Status record(const Tensor& ids, const Tensor& positions, const backend::AttentionMeta& meta, kvcache::KvCache& kv,
                Tensor& logits, Tensor* hidden);
  // Engine thread: runs body in recording mode, then captures its forward on every rank's thread.
  Result<std::unique_ptr<backend::DeviceGraph>> capture(const std::function<void()>& body);
  // Engine thread: every rank's graph launched from its own thread; false from owns() for another graph.
  bool owns(const backend::DeviceGraph& graph) const;
  Status replay(backend::DeviceGraph& graph);
  // An eager forward_device over the ranks (outside any capture): the same inputs path, run instead of captured.
  Status run_eagerly(const Tensor& ids, const Tensor& positions, const backend::AttentionMeta& meta,
                     kvcache::KvCache& kv, Tensor& logits, Tensor* hidden);
  bool root_capturing() { return capture_->root_capturing(); }
  int64_t replays() const { return replays_; }

 private:
  struct Call {  // one forward_device's arguments (rank 0's tensors)
    Tensor ids, positions;
    backend::AttentionMeta meta;
    kvcache::KvCache* kv = nullptr;
    Tensor logits, hidden;
    bool has_hidden = false;
  };
  struct RankInputs {  // rank r's view of a call: its tensors and the copies that fill them
    Tensor ids, positions;
    backend::AttentionMeta meta;
    std::vector<std::pair<Tensor, Tensor>> copies;  // (rank 0's source, rank r's mirror)
  };
  class Graph;
  RankInputs inputs_for(int r, const Call& c);
  Status rank_step(int r, const Call& c, const RankInputs& in, kvcache::KvCache& rank_kv);
  Status run_named(kvcache::KvCache& kv, const RankFn& fn);

  std::vector<RankSide> ranks_;
  std::unique_ptr<parallel::RankCapture> capture_;
  RunOnRanks run_;
  bool mirror_rank0_ = false;
  bool recording_ = false;
  std::optional<Call> recorded_;
  int recorded_calls_ = 0;
  // Per rank: the mirror of each rank-0 buffer, keyed by (address, bytes, dtype); allocated on the rank's device.
  std::vector<std::map<std::tuple<const void*, uint64_t, int>, Tensor>> mirrors_;
  int64_t replays_ = 0;
};

}  // namespace mxserve::launch
