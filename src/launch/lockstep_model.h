// LockstepModel: the N rank models of one tensor-parallel world seen as one CausalLM. Each forward runs the
// same ForwardBatch on every rank at once, one persistent worker thread per rank (the ranks meet in their
// collectives), and returns rank 0's output -- the logits are all-gathered and the hidden states all-reduced,
// so every rank holds the same. The engine, the sequence runner and verify-fixture drive it unchanged.
// KV: each rank caches its own heads. The caller's KvCache (made from kv_spec on rank 0's backend) is rank
// 0's; the model keeps a matching cache per other rank, on that rank's backend, keyed by the caller's cache.
// Failure: a rank whose forward fails aborts the group (parallel::Communicator::abort), so the others stop
// at their next collective instead of waiting; the forward returns the failing rank's error ("rank R of N").
// Recovery (lockstep_recovery.cpp): when every failed rank failed with kOutOfMemory (a full device, not a lost
// rank), the group is brought back at a quiet point -- every worker returned, every rank's stream synchronized
// -- by resetting every communicator (parallel/recoverable.h: the CPU / device groups clear the abort and the
// half-done exchange; NCCL re-creates its in-process communicators), so the next forward runs. Any other
// failure (a timeout, a device error), a communicator that cannot reset, or refuse_recovery() leaves the group
// failed: every later forward fails at once naming the first failure, and the process must stop.
// Data parallelism (the ranks' layouts say dp > 1; docs/parallel.md): each batch is split by DP rank
// (launch/dp_batch.h: a sequence's DP rank owns its KV blocks), each DP group (tp ranks) runs its own
// sub-batch on its own caches, and the outputs are reassembled in the batch's row order. Plain DP: a group
// without tokens skips the step. DP attention: it still runs (the model joins every MoE exchange with 0 rows).
// Every rank's cache has the caller's whole geometry; a DP group writes only its own block range (the CPU
// reference keeps one id space; a device build would allocate only the range).
// forward_mtp: CPU ranks read rank 0's hidden_in (host memory); CUDA ranks each get a copy on their own device
// through the world communicator (forward_mtp_broadcast). CUDA ranks: the logits returned are rank 0's
// (all-gathered on every rank); under DP the groups' rows reach rank 0's device through the world
// communicator (merge_on_device) instead of the host merge of the CPU reference.
// CUDA graphs (forward_device, decode graphs): on the shared-device stand-in at dp 1, every rank's forward is
// captured into ONE graph on rank 0's stream (parallel/graph_join.h says why not one per rank), on by default
// (MXSERVE_TP_GRAPHS=0 turns it off); once captured, every eager call is fenced against the replays
// (the ranks' streams wait for rank 0's before it, rank 0's for theirs after it). Under DP the step's rows are
// dp equal slot ranges, one per DP group (runtime/dp_graph_rows.h stages them; device_row_groups() says dp);
// each group's ranks run their range and its first rank writes its rows into that range of rank 0's logits
// (launch/dp_graph_step.h): static shapes, so the DP-attention MoE exchange is captured too. NCCL ranks (one GPU
// each): one graph per rank, captured and launched from the ranks' own threads (launch/rank_graphs.h), through
// capture_device_graph / replay_device_graph (dp 1 only). Multi-node is refused, naming why (choose_tp_graph_mode).
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "launch/dp_batch.h"
#include "launch/rank_graphs.h"
#include "model/causal_lm.h"
#include "parallel/communicator.h"
#include "parallel/graph_join.h"
#include "runtime/activation_watch.h"

namespace mxserve::launch {

class LockstepModel final : public model::CausalLM {
 public:
  struct Rank {
    backend::Backend* backend;
    model::CausalLM* model;
    parallel::Communicator* comm;                // the world's communicator (its layout: tp, dp, rank)
    parallel::Communicator* tp_comm = nullptr;   // its tp group's when dp > 1 and tp > 1 (aborted too)
    int cuda_device = -1;  // >= 0: the rank's worker thread makes this CUDA device current first
  };
  // ranks in rank order; they must outlive this model. Starts one worker thread per rank.
  // device_paths: the CUDA ranks' DP merge and MTP broadcast through the world communicator (on whenever the
  // ranks are CUDA ranks; tests turn it on for CPU ranks to run those paths without a GPU).
  explicit LockstepModel(std::vector<Rank> ranks, bool device_paths = false);
  ~LockstepModel() override;

  const model::ModelConfig& config() const override { return ranks_[0].model->config(); }
  kvcache::KvCacheSpec kv_spec(int64_t n_blocks, int64_t block_size) const override {
    return ranks_[0].model->kv_spec(n_blocks, block_size);
  }
  bool has_mtp() const override { return ranks_[0].model->has_mtp(); }
  Result<model::ForwardOutput> forward(const model::ForwardBatch& batch, kvcache::KvCache& kv) override;
  Result<model::ForwardOutput> forward_mtp(const model::ForwardBatch& batch, const Tensor& hidden_in,
                                           kvcache::KvCache& kv) override;
  // Every rank's forward_device on its own thread (ids, positions and meta are rank 0's device tensors, read in
  // place: one device), rank 0's into logits / hidden, the others' into their own temporaries; joined into the
  // capture of rank 0's stream when it is being captured. Ranks on several GPUs (per-rank graphs): recorded
  // while capture_device_graph runs the body, else run eagerly with the other ranks reading copies of the inputs.
  Status forward_device(const Tensor& ids, const Tensor& positions, const backend::AttentionMeta& meta,
                        kvcache::KvCache& kv, Tensor& logits, Tensor* hidden = nullptr) override;
  // The copy in rank 0's cache `kv` and in every mirror of it.
  void copy_kv_slots(backend::Backend& be, const Tensor& src_slots, const Tensor& dst_slots,
                     kvcache::KvCache& kv) override;
  int device_row_groups() const override { return dp_; }  // forward_device: one slot range per DP group
  // MTP draft-step graphs are not joined across ranks (tp > 1 or DP): refused, naming the layout; the executor
  // logs once that the MTP draft steps run eagerly (the decode and verify steps still replay graphs).
  Status forward_mtp_device(const Tensor&, const Tensor&, const Tensor&, const backend::AttentionMeta&,
                            kvcache::KvCache&, Tensor&, Tensor&, MtpDeviceRows) override {
    return unsupported("MTP draft-step graphs at --tensor-parallel-size " + std::to_string(tp_) +
                       " x --data-parallel-size " + std::to_string(dp_) +
                       ": forward_mtp_device is not joined across ranks (the draft steps run eagerly; decode and "
                       "verify steps replay graphs)");
  }
  int world() const { return static_cast<int>(ranks_.size()); }
  // Per-rank graphs where the ranks are on several GPUs (rank_graphs.h); otherwise be.capture_graph(body).
  Result<std::unique_ptr<backend::DeviceGraph>> capture_device_graph(backend::Backend& be,
                                                                     const std::function<void()>& body) override;
  Status replay_device_graph(backend::DeviceGraph& graph) override;
  bool records_graph_body() override { return graph_choice().mode == TpGraphMode::kPerRank; }
  void release_graph_pools(backend::Backend& be) override;
  // Tests: per-rank graphs even for one rank (a one-rank NCCL world on one GPU); mirror_rank0: rank 0 copies its
  // inputs into mirrors as the other ranks do. Refused (graphs off) for several ranks on one GPU. Before any capture.
  void force_per_rank_graphs_for_tests(bool mirror_rank0) {
    force_per_rank_ = true;
    mirror_rank0_ = mirror_rank0;
  }
  int64_t per_rank_replays() const { return per_rank_ ? per_rank_->replays() : 0; }
  // Tests: called on every rank's worker at the start of each forward job (inside the OOM boundary); a
  // non-ok status (or a thrown DeviceOutOfMemory) fails that rank's part of the step as a real failure would.
  using FaultHook = std::function<Status(int rank)>;
  void set_fault_hook_for_test(FaultHook hook) { fault_hook_ = std::move(hook); }
  // A launch whose ranks hold state the recovery cannot realign (launch.cpp: the fused peer all-reduce's
  // device flag epochs) turns recovery off, saying why in the failure's message.
  void refuse_recovery(std::string why) { no_recovery_ = std::move(why); }
  int recoveries() const { return recoveries_; }  // recovered failures so far (a captured NCCL graph is stale)
  // Frees the other ranks' mirrors of every caller cache (launch_memory.cpp: after each start-up dry run, whose
  // engine and cache are gone; no mirrored cache may be used afterwards).
  void drop_cache_mirrors() { mirrors_.clear(); }
  // The start-up dry run's activation reserve of each rank (launch_memory.h KvBudget): every later job's
  // activation peak is checked against it, and an out-of-memory failure names the step (runtime/activation_watch.h).
  void set_activation_reserve(std::vector<uint64_t> bytes) { watch_.set_reserve(std::move(bytes)); }

 private:
  using RankFn = std::function<Result<model::ForwardOutput>(int rank, kvcache::KvCache& kv)>;
  using PartFn = std::function<Result<model::ForwardOutput>(int rank, const model::ForwardBatch& part, int dp_rank,
                                                            kvcache::KvCache& kv)>;
  // Runs fn on every rank's thread against that rank's cache for `kv`; every rank's output or the root error.
  Result<std::vector<model::ForwardOutput>> run_each(kvcache::KvCache& kv, const RankFn& fn);
  // Rank 0's output of run_each.
  Result<model::ForwardOutput> run_all(kvcache::KvCache& kv, const RankFn& fn);
  // Runs on every rank before its part (idle plain-DP groups too): collectives every rank must join.
  using PreFn = std::function<Status(int rank, const DpSplit& split)>;
  // dp > 1: fn on every rank with its DP rank's part of batch; the outputs merged in the batch's order.
  Result<model::ForwardOutput> run_split(const model::ForwardBatch& batch, kvcache::KvCache& kv, const PartFn& fn,
                                         const PreFn& pre = nullptr);
  // CUDA ranks, on rank r's thread: every rank joins; DP group g's first rank brings `mine` ([index[g].size(),
  // cols], the rows whose output rows are index[g]); rank 0 gets the [total, cols] merge on its device (the
  // other ranks an undefined tensor).
  Result<Tensor> merge_on_device(int r, const Tensor& mine, int64_t cols, DType dtype,
                                 const std::vector<std::vector<int32_t>>& index, int64_t total);
  // CUDA ranks, on rank r's thread: rank 0's [T, C] tensor x copied to rank r's device (every rank joins).
  Result<Tensor> broadcast_from_rank0(int r, const Tensor& x);
  Result<model::ForwardOutput> forward_mtp_broadcast(const model::ForwardBatch& batch, const Tensor& hidden_in,
                                                  kvcache::KvCache& kv);
  // The caches of ranks 1..N-1 that mirror the caller's cache `kv` (made on first use).
  std::vector<kvcache::KvCache*> rank_caches(kvcache::KvCache& kv);
  void worker_loop(int rank);
  // Once graphs were captured: an eager call's ranks after every replay so far (before), every later replay
  // after the call's work on every rank (after). No-ops before any capture.
  Status fence_before_eager();
  Status fence_after_eager();
  // lockstep_recovery.cpp. After a failed run_each (every worker returned): recoverable (every failed rank's
  // code is kOutOfMemory) -> a recovery is pending, else the group is broken for good. Then, unless rank 0's
  // stream is being captured (the recovery synchronizes streams: it then runs before the next job), the
  // pending recovery runs. Returns `root`.
  Status after_failed_step(const Status& root, bool recoverable);
  // Before a job: broken -> the first failure; a pending recovery -> run it now (an error while capturing).
  Status before_step();
  Status recover();  // every rank's stream synchronized, every communicator reset; failure -> broken

  std::vector<Rank> ranks_;
  int tp_ = 1, dp_ = 1;  // from rank 0's layout
  bool dp_attention_ = false;
  bool device_paths_ = false;  // CUDA ranks (or a test): merges and broadcasts through the world communicator
  int dp_groups_with_rows_ = 0;  // run_split: the DP groups with rows in the current batch (decision hooks)
  std::map<const kvcache::KvCache*, std::vector<std::unique_ptr<kvcache::KvCache>>> mirrors_;
  std::unique_ptr<parallel::GraphJoin> join_;  // forward_device: the ranks' joined capture (made on first use)
  bool graphs_ = false;                        // a joined capture succeeded: eager calls are fenced
  // Which graphs the ranks get (rank_graphs.h); PerRankGraphs made on first use in kPerRank mode.
  TpGraphChoice graph_choice();
  std::unique_ptr<PerRankGraphs> per_rank_;
  bool force_per_rank_ = false, mirror_rank0_ = false;
  FaultHook fault_hook_;       // tests only
  std::string no_recovery_;    // non-empty: recovery refused, why
  Status broken_;              // not ok: the group failed for good (every later job returns this)
  Status pending_recovery_;    // not ok: a recoverable failure awaits its recovery (the failure)
  int recoveries_ = 0;
  runtime::ActivationWatch watch_;   // set_activation_reserve; run_each checks each rank's job against it
  // The current job's step, described only when a warning or an OOM failure needs it (not on every step): the
  // caller's batch (valid while its job runs) under a prefix, or a device-path step's row count.
  struct StepRef {
    const model::ForwardBatch* batch = nullptr;
    const char* prefix = "";
    int64_t device_rows = 0;
  } step_;
  std::string step_shape() const;
  // Sets step_ for a call's jobs and clears it when the call returns (the batch does not outlive it; other jobs,
  // e.g. a per-rank graph's replay, then read as a device-path step).
  struct StepScope {
    StepScope(StepRef& ref, StepRef now) : ref_(ref) { ref_ = now; }
    ~StepScope() { ref_ = {}; }
    StepRef& ref_;
  };

  std::mutex mutex_;
  std::condition_variable job_cv_, done_cv_;
  std::function<void(int)> job_;  // the job of the current generation
  uint64_t job_generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace mxserve::launch
