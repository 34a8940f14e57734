// The composition root: one typed LaunchConfig in, a loaded model on its rank(s) out -- the backend made
// per device from the rank layout, the communicator of that layout, the weights (a checkpoint or
// synthetic), and factories for the executor and the engine over them. The server (server/serving_model)
// and the CLI (cli/cmd_model, verify-fixture, bench-model) call launch_model(); nothing else constructs a
// backend for serving. Owns: the backend(s), the communicator, the model. The engines made here borrow them
// (a LaunchedModel must outlive every executor/engine it made).
// Several ranks (tensor / expert / data parallel): one backend, communicator and model per rank, loaded in
// parallel (a rank failing at start-up fails the launch, naming it), driven in lockstep by one LockstepModel
// (launch/lockstep_model.h) that model() returns: the engine sees one model. CPU backend: the CPU thread
// communicator; CUDA backend: one GPU per rank (first_device + rank), NCCL (parallel/nccl_communicator.h).
// Invariant: a LaunchedModel is fully loaded and validated (MTP present when speculation asks for it, the
// weight table shards evenly over the layout) -- callers never see a half-built one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "launch/moe_kernel_report.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "parallel/communicator.h"
#include "parallel/fused_add_norm.h"
#include "parallel/cpu_communicator.h"
#include "parallel/rank_layout.h"
#include "parallel/rendezvous.h"
#include "launch/multinode.h"
#include "runtime/engine.h"
#include "runtime/executor.h"

namespace mxserve::launch {

// Where the weights come from.
struct ModelSource {
  std::string path;                    // checkpoint dir, or a config.json (file or dir) with synthetic weights
  bool synthetic = false;              // deterministic random weights from the config alone
  uint64_t seed = 0;                   // synthetic weights' seed
  int64_t num_layers = 0;              // > 0: keep only the first N decoder layers (synthetic only)
  std::string synthetic_quantization;  // synthetic precision plan: "", "mxfp4", "mxfp4:fp8-block", ...
  bool load_mtp = false;               // load the MTP layer when the config declares one
  bool require_mtp = false;            // and fail when it does not (speculative decoding drafts with it)
  kvcache::KvCacheDtype kv_cache_dtype = kvcache::KvCacheDtype::kAuto;  // --kv-cache-dtype (the model's kv_spec)
};

struct LaunchConfig {
  ModelSource model;
  std::string backend = "cpu";               // cpu | cuda
  backend::BackendOptions backend_options;   // typed kernel choices (the device comes from the layout)
  parallel::ParallelConfig parallel;         // tp / ep / dp / DP attention (world > 1: CPU backend only)
  parallel::CpuGroupOptions cpu_group;       // collectives' timeout of a multi-rank CPU world
  // "" (auto: NCCL for CUDA ranks when world > 1, none for one rank) or "nccl": a ONE-rank CUDA launch runs
  // its collectives through a one-rank NCCL communicator (the GPU suite's check of the NCCL path). Empty
  // here reads the environment variable MXSERVE_COMMUNICATOR (same values).
  std::string communicator;
  std::string moe_tuning_dir;                // MoE kernel tables added to / overriding the embedded ones
  bool log_progress = false;                 // a "still loading" line every 5 s (the server's start-up)
  // Several nodes (--nnodes > 1): this node's place; nnodes 1 here reads the CLI's (launch/multinode.h).
  parallel::DistInit dist;
  // tp > 1: the fused all-reduce + residual add + RMSNorm (parallel/fused_add_norm.h) after attention and after
  // each MLP (chained into the next layer's input norm) instead of three steps (parallel/fused_path.h decides).
  // CUDA: on by default (the peer kernel -- one-shot / two-shot, NCCL above its buffers -- or, on the
  // shared-device stand-in, the event-ordered collective); CPU: off unless asked (the reference: the same three
  // steps behind the seam). fused_allreduce asks for it (an error where it cannot run; MXSERVE_FUSED_ALLREDUCE=1
  // as well); disable_custom_all_reduce (--disable-custom-all-reduce, vLLM; MXSERVE_FUSED_ALLREDUCE=0) turns it off.
  bool fused_allreduce = false;
  bool disable_custom_all_reduce = false;
  // Tests only: CPU ranks take the CUDA ranks' DP merge and MTP broadcast through the world communicator
  // (LockstepModel's device paths), so those paths run without a GPU.
  bool lockstep_device_paths = false;
  // Tests only: runs on each rank's loading thread before it loads; an error fails that rank's start-up (the
  // launch then stops every rank, naming it).
  std::function<Status(const parallel::RankLayout&)> rank_start_hook;
};

class LockstepModel;

class LaunchedModel {
 public:
  ~LaunchedModel();
  const model::ModelConfig& config() const;
  // The model the engine drives: rank 0's, or with several ranks the lockstep model over all of them.
  model::CausalLM& model();
  // Rank 0's backend. Tools that time kernels use it; serving code does not need it.
  backend::Backend& backend() { return *backends_.front(); }
  parallel::Communicator& communicator() { return *comms_.front(); }  // rank 0's
  const parallel::RankLayout& layout() const { return comms_.front()->layout(); }
  int world() const { return static_cast<int>(models_.size()); }
  // Rank r's pieces (tests that drive the ranks themselves); rank 0's are the defaults above.
  model::CausalLM& rank_model(int r) { return *models_.at(r); }
  backend::Backend& rank_backend(int r) { return *backends_.at(r); }
  parallel::Communicator& rank_communicator(int r) { return *comms_.at(r); }
  std::string backend_name() const { return backends_.front()->name(); }
  DType weight_dtype() const { return backends_.front()->weight_dtype(); }  // float weights' storage dtype
  double load_seconds() const { return load_s_; }
  // The declared weights as rank 0 holds them (shapes after sharding), for accounting and reports.
  const std::vector<model::WeightSpec>& weight_table() const { return table_; }

  // KV pool sizing: bytes of one block of block_size tokens over every cached layer, per rank (each rank
  // caches its own heads on its own device); blocks that fit in bytes.
  uint64_t kv_bytes_per_block(int64_t block_size) const;
  int64_t kv_blocks_for_bytes(int64_t block_size, uint64_t bytes) const;

  // The start-up dry run's activation reserve of each rank (launch_memory.h KvBudget): a rank group checks every
  // job against it (LockstepModel), one rank every executor made afterwards (runtime/executor.h
  // watch_activations). Empty: not watched.
  void set_activation_reserve(std::vector<uint64_t> bytes);
  // An executor over a fresh KV pool of n_blocks x block_size on this model's backend.
  std::unique_ptr<runtime::ModelExecutor> make_executor(int64_t n_blocks, int64_t block_size);
  // An engine (not started) with its executor sized from config.n_blocks and config.scheduler.block_size.
  std::unique_ptr<runtime::Engine> make_engine(const runtime::EngineConfig& config);
  // The speculative self-test after load (runtime/spec/self_test.h): logs, or says why it is skipped.
  Status spec_self_test(const runtime::SpecConfig& spec, int64_t block_size);
  std::vector<MoeKernelConfigRow> moe_kernel_configs() const;
  // Multi-node (launch/multinode.h): this node's session (null on one node) and the model of this node's
  // ranks alone (model() on node 0 also drives the follower nodes).
  NodeSession* node_session() { return node_.get(); }
  model::CausalLM& local_model();

 private:
  friend Result<std::unique_ptr<LaunchedModel>> launch_model(const LaunchConfig& config);
  friend Result<std::unique_ptr<LaunchedModel>> launch_on_node(const LaunchConfig& config, NodeSession* session);
  LaunchedModel() = default;

  bool synthetic_weights_ = false;  // --synthetic-weights: the speculative self-test expects random drafts
  std::vector<std::unique_ptr<backend::Backend>> backends_;  // one per rank of this process
  std::vector<std::unique_ptr<parallel::Communicator>> comms_;  // one per rank, over the world
  std::vector<std::unique_ptr<parallel::Communicator>> tp_comms_;  // dp > 1 and tp > 1: per rank, its tp group's
  std::vector<std::unique_ptr<parallel::FusedAddNorm>> fused_;     // per rank, when the fused all-reduce is on
  std::vector<std::unique_ptr<model::CausalLM>> models_;        // one per rank
  std::unique_ptr<LockstepModel> lockstep_;                     // world > 1
  std::vector<model::WeightSpec> table_;
  double load_s_ = 0;
  NodeSessionPtr node_;                          // multi-node: the links to the other nodes
  std::unique_ptr<model::CausalLM> leader_;     // multi-node, node 0: sends each call to the followers
  uint64_t executor_reserve_ = 0;               // one rank: set_activation_reserve's, for make_executor
};

// Validates the config, makes the backend per device of the layout, loads the model. Errors name the flag
// or file at fault.
Result<std::unique_ptr<LaunchedModel>> launch_model(const LaunchConfig& config);

// Whether tensor parallelism of size tp fits the model: tp divides the attention heads, the MLP / expert /
// shared-expert widths and the vocabulary, and divides or is a multiple of the KV heads. Names the field.
// With expert parallelism (ep > 1) the routed experts are not sliced, so their width need not split.
Status check_tensor_parallel(const model::ModelConfig& cfg, int tp, int ep = 1);
// Whether expert parallelism of size ep fits the model: ep divides the routed experts (whole experts per
// rank). Names the flag, n_routed_experts and the config file.
Status check_expert_parallel(const model::ModelConfig& cfg, int ep);
// Whether the data-parallel layout fits the model: DP attention needs glm4_moe / glm_moe_dsa with routed
// experts whose widths (routed and shared) split over all tp x dp ranks. Names the flag and the field.
Status check_data_parallel(const model::ModelConfig& cfg, const parallel::ParallelConfig& p);
// --backend cuda: each rank's slice of the routed experts' width (moe_intermediate_size / tp, or / (tp x dp)
// under DP attention; whole experts under EP) must be a multiple of 8 (the CUDA MoE kernels' rows). Names the
// flag and the field.
Status check_cuda_moe_slices(const model::ModelConfig& cfg, const parallel::ParallelConfig& p);

}  // namespace mxserve::launch
