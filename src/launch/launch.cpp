#include "launch/launch.h"
#include "launch/model_path.h"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>

#include "core/logging.h"
#include "launch/lockstep_model.h"
#include "launch/multinode.h"
#include "model/registry.h"
#include "model/synthetic_weights.h"
#include "parallel/cpu_communicator.h"
#include "parallel/gloo_communicator.h"
#include "parallel/fused_path.h"
#include "parallel/nccl_communicator.h"
#include "parallel/shared_device_communicator.h"
#include "io/checkpoint.h"
#include "model/mtp_presence.h"
#include "runtime/spec/self_test.h"

namespace mxserve::launch {
namespace {

// A "still loading" line every 5 s while fn runs (the loader has no progress callback yet).
template <typename Fn>
auto with_progress_ticker(bool enabled, Fn&& fn) {
  if (!enabled) return fn();
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::thread ticker([&] {
    std::unique_lock<std::mutex> lock(mutex);
    for (int s = 5; !cv.wait_for(lock, std::chrono::seconds(5), [&] { return done; }); s += 5)
      MX_LOG(kInfo) << "still loading weights (" << s << " s)";
  });
  auto result = fn();
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
  }
  cv.notify_all();
  ticker.join();
  return result;
}

model::LoadOptions load_options(const ModelSource& src) {
  model::LoadOptions lo;
  lo.load_mtp = src.load_mtp || src.require_mtp;
  lo.synthetic = src.synthetic;
  lo.seed = src.seed;
  lo.num_layers_override = src.num_layers;
  lo.synthetic_quantization = src.synthetic_quantization;
  lo.kv_cache_dtype = src.kv_cache_dtype;
  return lo;
}

// Layouts that are parsed but not built yet, and backends that cannot run several ranks: a clear refusal.
// shared_device: every rank on first_device through the one-GPU stand-in (parallel/shared_device_communicator.h).
Status check_layout_supported(const LaunchConfig& config, bool shared_device) {
  const parallel::ParallelConfig& p = config.parallel;
  if (p.world() > 1 && config.backend != "cpu" && config.backend != "cuda")
    return unsupported("--tensor-parallel-size " + std::to_string(p.tp) + " on the " + config.backend +
                       " backend: several ranks run on --backend cpu or cuda");
  if (p.world() > 1 && config.backend == "cuda") {
    const int visible = parallel::visible_cuda_devices();
    if (shared_device && p.first_device >= visible)
      return invalid_argument("the shared-device communicator puts every rank on device " +
                              std::to_string(p.first_device) + ", but " + std::to_string(visible) +
                              " GPU(s) are visible (CUDA_VISIBLE_DEVICES)");
    if (!shared_device && p.first_device + p.world() > visible)
      return invalid_argument("--tensor-parallel-size " + std::to_string(p.tp) + " x --data-parallel-size " +
                              std::to_string(p.dp) + " = " + std::to_string(p.world()) + " ranks need one GPU each (devices " +
                              std::to_string(p.first_device) + ".." + std::to_string(p.first_device + p.world() - 1) +
                              "), but " + std::to_string(visible) + " GPU(s) are visible (CUDA_VISIBLE_DEVICES)");
    // MTP: the lockstep model broadcasts rank 0's hidden states to every rank's device through the world
    // communicator (LockstepModel::forward_mtp), so speculation runs with several CUDA ranks.
  }
  return Status::ok();
}

enum class CommKind { kDefault, kNccl, kSharedDevice };

// "", "auto", "nccl" or "shared-device" from the config, else from MXSERVE_COMMUNICATOR (which --communicator
// sets: cli/parallel_flags.h); the ranks' communicator. Default: NCCL for several CUDA ranks, the CPU thread
// group for several CPU ranks, none for one rank.
Result<CommKind> communicator_kind(const LaunchConfig& config, int world) {
  std::string kind = config.communicator;
  std::string source = "LaunchConfig::communicator";
  if (kind.empty()) {
    const char* env = std::getenv("MXSERVE_COMMUNICATOR");
    kind = env != nullptr ? env : "";
    source = "MXSERVE_COMMUNICATOR";
  }
  if (kind != "" && kind != "auto" && kind != "nccl" && kind != "shared-device")
    return invalid_argument(source + "=" + kind + ": expected nccl, shared-device or auto");
  if (kind == "shared-device") {
    if (config.backend != "cuda")
      return invalid_argument(source + "=shared-device needs --backend cuda (it runs several CUDA ranks on one GPU; "
                              "the " + config.backend + " backend's ranks use " +
                              (world > 1 ? "the CPU thread communicator)" : "no communicator)"));
    return CommKind::kSharedDevice;
  }
  if (kind == "nccl" && config.backend != "cuda")
    return invalid_argument(source + "=nccl needs --backend cuda (the " + config.backend + " backend's ranks use " +
                            (world > 1 ? "the CPU thread communicator)" : "no communicator)"));
  const bool nccl = config.backend == "cuda" && (world > 1 || kind == "nccl");
  if (nccl && world == 1) {
    MX_LOG(kWarn) << source << "=nccl: the one-rank CUDA launch runs every collective through a one-rank NCCL "
                  << "communicator (a test of the NCCL path; slower than none)";
  }
  return nccl ? CommKind::kNccl : CommKind::kDefault;
}

}  // namespace

namespace {

// The architecture declares the capability (model/registry.h ArchitectureDef::Capabilities); the refusal
// names the flag and the registered architectures that have it.
Status check_capability(const model::ModelConfig& c, bool model::ArchitectureDef::Capabilities::*capability,
                        const std::string& flag, const std::string& what) {
  if (c.arch != nullptr && c.arch->capabilities.*capability) return Status::ok();
  return unsupported(flag + ": " + what + " is implemented for " + model::architectures_with(capability) +
                     " only, not " + (c.arch != nullptr ? c.arch->hf_name : std::string("this model")) + " (" +
                     c.source + ")");
}

}  // namespace

Status check_expert_parallel(const model::ModelConfig& c, int ep) {
  if (ep <= 1) return Status::ok();
  const std::string flag = "--ep-size " + std::to_string(ep);
  MX_RETURN_IF_ERROR(
      check_capability(c, &model::ArchitectureDef::Capabilities::expert_parallel, flag, "expert parallelism"));
  if (c.n_experts <= 0)
    return invalid_argument(flag + ": the model has no routed experts (num_routed_experts / n_routed_experts 0 in " +
                            c.source + ")");
  if (c.n_experts % ep != 0)
    return invalid_argument(flag + " does not divide num_routed_experts (n_routed_experts) " +
                            std::to_string(c.n_experts) + " of " + c.source +
                            " (every expert-parallel rank holds the same number of whole experts)");
  return Status::ok();
}

Status check_data_parallel(const model::ModelConfig& c, const parallel::ParallelConfig& p) {
  if (!p.dp_attention) return Status::ok();  // plain DP: whole replicas (each group as tensor parallel says)
  if (c.arch == nullptr || !c.arch->capabilities.dp_attention)
    return unsupported(std::string("--enable-dp-attention is implemented for ") +
                       model::architectures_with(&model::ArchitectureDef::Capabilities::dp_attention) + ", not " +
                       (c.arch != nullptr ? c.arch->hf_name : std::string("this model")) + " (" + c.source + ")");
  if (c.n_experts <= 0)
    return invalid_argument("--enable-dp-attention spreads the MoE blocks over the ranks, but " + c.source +
                            " has no routed experts (use --dp-size alone)");
  const int world = p.world();
  auto refuse = [&](const std::string& what) {
    return invalid_argument("--enable-dp-attention: the MoE blocks are sliced over all tp x dp = " +
                            std::to_string(world) + " ranks, which does not divide " + what + " of " + c.source);
  };
  if (p.ep == 1 && c.moe_inter % world != 0) return refuse("moe_intermediate_size " + std::to_string(c.moe_inter));
  if (c.shared_inter() % world != 0)
    return refuse("the shared experts' width " + std::to_string(c.shared_inter()) +
                  " (moe_intermediate_size x n_shared_experts)");
  return Status::ok();
}

// The CUDA bf16 MoE kernels take widths in multiples of 8 (16-byte rows): a rank slice that is not is refused
// here, naming the flag and the field, instead of failing a kernel check mid-forward. With EP the routed
// experts are whole (only the shared expert is sliced, through the dense GEMM, which takes any width).
Status check_cuda_moe_slices(const model::ModelConfig& c, const parallel::ParallelConfig& p) {
  if (c.n_experts <= 0 || p.ep > 1) return Status::ok();
  const int slices = p.dp_attention ? p.world() : p.tp;
  if (slices <= 1 || (c.moe_inter / slices) % 8 == 0) return Status::ok();
  const std::string flag = p.dp_attention ? "--enable-dp-attention" : "--tensor-parallel-size " + std::to_string(p.tp);
  return unsupported(flag + " on --backend cuda: each rank's slice of moe_intermediate_size " +
                     std::to_string(c.moe_inter) + " of " + c.source + " over " +
                     (p.dp_attention ? "all tp x dp = " : "") + std::to_string(slices) + " ranks is " +
                     std::to_string(c.moe_inter / slices) +
                     ", and the CUDA MoE kernels need a multiple of 8 (use fewer ranks, --enable-expert-parallel "
                     "(whole experts), or --backend cpu)");
}

Status check_tensor_parallel(const model::ModelConfig& c, int tp, int ep) {
  if (tp <= 1) return Status::ok();
  MX_RETURN_IF_ERROR(check_capability(c, &model::ArchitectureDef::Capabilities::tensor_parallel,
                                      "--tensor-parallel-size " + std::to_string(tp), "tensor parallelism"));
  auto refuse = [&](const std::string& what) {
    return invalid_argument("--tensor-parallel-size " + std::to_string(tp) + " does not divide " + what + " of " +
                            c.source);
  };
  if (c.n_heads % tp != 0) return refuse("num_attention_heads " + std::to_string(c.n_heads));
  if (c.n_kv_heads % tp != 0 && tp % c.n_kv_heads != 0)
    return invalid_argument("--tensor-parallel-size " + std::to_string(tp) + " and num_key_value_heads " +
                            std::to_string(c.n_kv_heads) + " of " + c.source +
                            ": tp must divide the KV heads or be a multiple of them (replicated KV heads)");
  if (c.first_k_dense > 0 && c.dense_inter % tp != 0) return refuse("intermediate_size " + std::to_string(c.dense_inter));
  if (c.n_experts > 0 && ep == 1 && c.moe_inter % tp != 0) return refuse("moe_intermediate_size " + std::to_string(c.moe_inter));
  if (c.n_experts > 0 && c.shared_inter() % tp != 0)
    return refuse("the shared experts' width " + std::to_string(c.shared_inter()) +
                  " (moe_intermediate_size x n_shared_experts)");
  if (c.vocab_size % tp != 0) return refuse("vocab_size " + std::to_string(c.vocab_size));
  return Status::ok();
}

LaunchedModel::~LaunchedModel() {
  leader_.reset();    // multi-node: tells the follower nodes to quit
  lockstep_.reset();  // its worker threads and KV mirrors first
  models_.clear();    // weights go before the backends that hold their memory
  fused_.clear();
  tp_comms_.clear();
  comms_.clear();
  backends_.clear();
  node_.reset();      // multi-node: the links last
}

model::CausalLM& LaunchedModel::model() {
  if (leader_) return *leader_;
  return lockstep_ ? *lockstep_ : *models_.front();
}
model::CausalLM& LaunchedModel::local_model() { return lockstep_ ? *lockstep_ : *models_.front(); }
const model::ModelConfig& LaunchedModel::config() const { return models_.front()->config(); }

// The launch of this node's ranks; session: a multi-node launch (launch/multinode.h), else null.
Result<std::unique_ptr<LaunchedModel>> launch_on_node(const LaunchConfig& config, NodeSession* session) {
  if (config.model.path.empty()) return invalid_argument("no model given (--model DIR or --config FILE)");
  if (!config.model.synthetic) {
    MX_RETURN_IF_ERROR(check_model_path(config.model.path));
  }
  MX_ASSIGN_OR_RETURN(std::vector<parallel::RankLayout> ranks, config.parallel.ranks());
  if (session != nullptr) {  // this node's ranks only
    MX_ASSIGN_OR_RETURN(ranks, node_ranks(ranks, config.parallel, session_dist(*session)));
  }
  const int world = static_cast<int>(ranks.size());
  MX_ASSIGN_OR_RETURN(const CommKind comm_kind, communicator_kind(config, world));
  const bool nccl = comm_kind == CommKind::kNccl && session == nullptr,
             shared_device = comm_kind == CommKind::kSharedDevice;
  if (session != nullptr && shared_device)
    return invalid_argument("--communicator shared-device with --nnodes > 1: the one-GPU stand-in runs in one process");
  if (session == nullptr) {
    MX_RETURN_IF_ERROR(check_layout_supported(config, shared_device));
  } else if (config.backend == "cuda" && parallel::visible_cuda_devices() < config.parallel.first_device + world) {
    return invalid_argument("--nnodes: this node runs " + std::to_string(world) + " rank(s), one GPU each, but " +
                            std::to_string(parallel::visible_cuda_devices()) + " GPU(s) are visible");
  } else if (config.backend == "cuda" && (config.model.load_mtp || config.model.require_mtp)) {
    return unsupported("MTP / speculative decoding with --nnodes > 1 on --backend cuda: not implemented yet");
  }
  if (shared_device)  // the one-GPU stand-in: every rank's backend on the first device
    for (parallel::RankLayout& rank : ranks) rank.device = config.parallel.first_device;

  std::unique_ptr<LaunchedModel> lm(new LaunchedModel());
  if (!config.moe_tuning_dir.empty())  // before the backend: it validates every table's variant names
    MX_RETURN_IF_ERROR(kernels::add_global_moe_tuning_dir(config.moe_tuning_dir));
  const bool cuda = config.backend == "cuda";
  for (const parallel::RankLayout& rank : ranks) {
    backend::BackendOptions bo = config.backend_options;
    bo.device = rank.device;
    auto be = backend::make_backend(config.backend, bo);
    if (!be.is_ok()) return be.status().with_context("the backend of " + rank.describe());
    lm->backends_.push_back(std::move(*be));
  }
  if (cuda) parallel::bind_thread_to_device(ranks.front().device);  // each backend made its device current
  if (session != nullptr) {  // the world spans nodes: Gloo (CPU) or NCCL (CUDA) over the session's rendezvous
    std::vector<backend::Backend*> bes;
    for (auto& be : lm->backends_) bes.push_back(be.get());
    MX_ASSIGN_OR_RETURN(lm->comms_, node_communicators(*session, ranks, bes, cuda, config.cpu_group.timeout));
  } else if (nccl) {
    std::vector<backend::Backend*> bes;
    for (auto& be : lm->backends_) bes.push_back(be.get());
    parallel::NcclOptions no;
    no.timeout = config.cpu_group.timeout;
    MX_ASSIGN_OR_RETURN(lm->comms_, parallel::make_nccl_communicators(ranks, bes, nullptr, no));
  } else if (shared_device) {
    std::vector<backend::Backend*> bes;
    for (auto& be : lm->backends_) bes.push_back(be.get());
    parallel::SharedDeviceOptions so;
    so.timeout = config.cpu_group.timeout;
    MX_ASSIGN_OR_RETURN(lm->comms_, parallel::make_shared_device_communicators(ranks, bes, so));
  } else if (world == 1) {
    MX_ASSIGN_OR_RETURN(auto comm, parallel::make_single_rank_communicator(ranks.front()));
    lm->comms_.push_back(std::move(comm));
  } else {
    MX_ASSIGN_OR_RETURN(lm->comms_, parallel::make_cpu_communicators(ranks, config.cpu_group));
  }
  const int tp = config.parallel.tp, dp = config.parallel.dp;
  if (dp > 1 && tp > 1) {  // one communicator per tp group (the model's TP collectives stay inside its DP group)
    for (int g = 0; g < dp; ++g) {
      std::vector<parallel::RankLayout> group;
      std::vector<backend::Backend*> group_backends;
      for (int j = 0; j < tp; ++j) {
        group.push_back(parallel::RankLayout{tp, 1, 1, j, ranks[g * tp + j].device});
        group_backends.push_back(lm->backends_[g * tp + j].get());
      }
      // The group's communicators are of the world's kind: NCCL (a second in-process init over the group's
      // devices), the shared-device stand-in, or CPU threads.
      Result<std::vector<std::unique_ptr<parallel::Communicator>>> comms = [&]()
          -> Result<std::vector<std::unique_ptr<parallel::Communicator>>> {
        if (nccl) {
          parallel::NcclOptions no;
          no.timeout = config.cpu_group.timeout;
          return parallel::make_nccl_communicators(group, group_backends, nullptr, no);
        }
        if (shared_device) {
          parallel::SharedDeviceOptions so;
          so.timeout = config.cpu_group.timeout;
          return parallel::make_shared_device_communicators(group, group_backends, so);
        }
        return parallel::make_cpu_communicators(group, config.cpu_group);
      }();
      if (!comms.is_ok())
        return comms.status().with_context("the tensor-parallel communicator of DP rank " + std::to_string(g));
      for (auto& c : *comms) lm->tp_comms_.push_back(std::move(c));
    }
  }

  // The all-reduce + add + RMSNorm path (parallel/fused_path.h): fused by default at tp > 1 on CUDA (the peer
  // kernel across GPUs, the event-ordered collective on the shared-device stand-in), one group per tp group.
  parallel::FusedAllReduceRequest freq;
  freq.backend = config.backend;
  freq.tp = tp;
  freq.shared_device = shared_device;
  freq.multinode = session != nullptr;
  freq.config_on = config.fused_allreduce;
  freq.config_off = config.disable_custom_all_reduce;
  freq.env = std::getenv("MXSERVE_FUSED_ALLREDUCE");
  MX_ASSIGN_OR_RETURN(parallel::FusedAllReduceChoice fchoice, parallel::choose_fused_allreduce(freq));
  if (fchoice.kind != parallel::FusedAllReduceKind::kOff) {  // its fallback: the group's communicator
    lm->fused_.resize(world);
    Status made = Status::ok();
    for (int g = 0; g < dp && made.is_ok(); ++g) {
      std::vector<backend::Backend*> bes;
      std::vector<int> devices;
      std::vector<parallel::Communicator*> fallback;
      for (int j = 0; j < tp; ++j) {
        const int r = g * tp + j;
        bes.push_back(lm->backends_[r].get());
        devices.push_back(ranks[r].device);
        fallback.push_back(dp == 1 ? lm->comms_[r].get() : lm->tp_comms_[r].get());
      }
      // CUDA: the peer kernel or, ranks on one GPU, the event-ordered collective; CPU: the reference.
      auto group = cuda ? parallel::make_fused_add_norm_group(bes, devices, fallback)
                        : parallel::make_reference_fused_add_norm_group(bes, fallback);
      if (!group.is_ok()) {
        made = group.status().with_context("the fused all-reduce of DP rank " + std::to_string(g));
        break;
      }
      for (int j = 0; j < tp; ++j) lm->fused_[g * tp + j] = std::move((*group)[j]);
    }
    if (!made.is_ok()) {
      if (fchoice.required) return made;
      MX_LOG(kWarn) << "the fused all-reduce could not be set up, so every layer runs all-reduce, add and RMSNorm "
                    << "separately (slower): " << made.to_string()
                    << " (--disable-custom-all-reduce silences this)";
      lm->fused_.clear();
      fchoice.kind = parallel::FusedAllReduceKind::kOff;
      fchoice.why = "its set-up failed: " + made.message();
    }
  }
  if (tp > 1) MX_LOG(kInfo) << parallel::describe_fused_allreduce(fchoice, tp, dp);

  const model::LoadOptions lo = load_options(config.model);
  MX_ASSIGN_OR_RETURN(model::ModelConfig cfg, model::resolve_model_config(config.model.path, lo));
  MX_RETURN_IF_ERROR(check_tensor_parallel(cfg, config.parallel.tp, config.parallel.ep));
  MX_RETURN_IF_ERROR(check_expert_parallel(cfg, config.parallel.ep));
  MX_RETURN_IF_ERROR(check_data_parallel(cfg, config.parallel));
  if (config.backend == "cuda") MX_RETURN_IF_ERROR(check_cuda_moe_slices(cfg, config.parallel));
  if ((config.parallel.tp > 1 || ranks.front().moe_tp() > 1) && lo.synthetic) {
    MX_ASSIGN_OR_RETURN(model::SyntheticPlan plan, model::parse_synthetic_plan(lo.synthetic_quantization));
    // Rank slices of synthetic weights: bf16, and MXFP4 routed experts (each rank generates its own 32-element
    // blocks of the one-rank model; weight_loader_shard.cpp). Other schemes are refused.
    const bool experts_ok = plan.experts == "bf16" || plan.experts == "mxfp4";
    if (!experts_ok || plan.rest != "bf16")
      return unsupported("--quantization " + lo.synthetic_quantization + " with --tensor-parallel-size " +
                         std::to_string(config.parallel.tp) +
                         (config.parallel.dp_attention ? " --enable-dp-attention" : "") +
                         ": rank slices of quantized synthetic weights are implemented for bf16 and for mxfp4 "
                         "routed experts only (--quantization mxfp4 or bf16, or a quantized checkpoint)");
    const int slices = config.parallel.dp_attention ? config.parallel.world() : config.parallel.tp;
    if (plan.experts == "mxfp4" && cfg.n_experts > 0 && config.parallel.ep == 1 && slices > 1 &&
        (cfg.moe_inter % slices != 0 || (cfg.moe_inter / slices) % 32 != 0))
      return invalid_argument(
          std::string(config.parallel.dp_attention ? "--enable-dp-attention" : "--tensor-parallel-size") + " " +
          std::to_string(slices) + " with --quantization mxfp4: each rank's slice of moe_intermediate_size " +
          std::to_string(cfg.moe_inter) + " of " + cfg.source + " must be a multiple of the 32-element MXFP4 "
          "block (use fewer ranks, --enable-expert-parallel (whole experts) or --quantization bf16)");
  }
  // Every rank's share of every declared weight; an uneven split fails here, before any weight is read.
  const auto declared = model::declared_weights(cfg, lo.load_mtp && cfg.n_mtp_layers > 0);
  for (const parallel::RankLayout& rank : ranks) {
    auto table = model::shard_weight_table(declared, rank);
    if (!table.is_ok()) return table.status().with_context(rank.describe());
    if (&rank == &ranks.front()) lm->table_ = std::move(*table);  // rank 0's (this node's first, multi-node)
  }
  MX_LOG(kDebug) << "launch: " << world << " rank(s), communicator " << lm->comms_.front()->name();
  if (config.model.require_mtp && !lo.synthetic && cfg.n_mtp_layers > 0) {  // before any weight is read
    MX_ASSIGN_OR_RETURN(auto ckpt, io::Checkpoint::open(config.model.path));
    MX_RETURN_IF_ERROR(model::mtp_layer_present(*ckpt, *cfg.arch, cfg, true, /*require_mtp=*/true).status());
  }

  if (config.log_progress) {
    MX_LOG(kInfo) << "loading " << (lo.synthetic ? "synthetic weights for " : "weights from ") << config.model.path
                  << " on " << lm->backend().name() << (world > 1 ? " x " + std::to_string(world) + " ranks" : "")
                  << " ...";
  }
  const auto t0 = std::chrono::steady_clock::now();
  // One loading thread per rank; a rank that fails stops the launch (the others finish loading, then all
  // are freed), naming the rank.
  std::vector<std::optional<Result<std::unique_ptr<model::CausalLM>>>> loaded(world);
  with_progress_ticker(config.log_progress, [&] {
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        if (cuda) parallel::bind_thread_to_device(ranks[r].device);
        if (config.rank_start_hook) {  // tests: a rank that fails at start-up
          if (Status st = config.rank_start_hook(ranks[r]); !st.is_ok()) {
            loaded[r] = Result<std::unique_ptr<model::CausalLM>>(st);
            return;
          }
        }
        model::LoadOptions rank_lo = lo;
        rank_lo.rank = ranks[r];
        // The model's TP collectives run in its tp group: the world when dp == 1, else the group's own. A one-rank
        // CUDA launch with the NCCL (or shared-device) test switch gets its one-rank communicator.
        rank_lo.comm = world == 1 && session == nullptr ? (nccl || shared_device ? lm->comms_[r].get() : nullptr)
                       : dp == 1 ? lm->comms_[r].get() : tp > 1 ? lm->tp_comms_[r].get() : nullptr;
        rank_lo.moe_comm = ranks[r].dp_attention ? lm->comms_[r].get() : nullptr;
        rank_lo.fused_add_norm = lm->fused_.empty() ? nullptr : lm->fused_[r].get();
        loaded[r] = model::load_causal_lm(config.model.path, *lm->backends_[r], rank_lo);
      });
    for (auto& t : threads) t.join();
    return 0;
  });
  for (int r = 0; r < world; ++r) {
    if (loaded[r]->is_ok()) continue;
    Status s = loaded[r]->status().with_context("loading the model " + config.model.path);
    if (world > 1) s = s.with_context(ranks[r].describe() + " failed at start-up; every rank stopped");
    return s;
  }
  for (int r = 0; r < world; ++r) {
    lm->models_.push_back(std::move(**loaded[r]));
    lm->backends_[r]->synchronize();
  }
  if (world > 1) {
    std::vector<LockstepModel::Rank> group;
    for (int r = 0; r < world; ++r)
      group.push_back({lm->backends_[r].get(), lm->models_[r].get(), lm->comms_[r].get(),
                       lm->tp_comms_.empty() ? nullptr : lm->tp_comms_[r].get(),
                       cuda ? ranks[r].device : -1});
    lm->lockstep_ = std::make_unique<LockstepModel>(std::move(group), config.lockstep_device_paths);
    if (fchoice.kind == parallel::FusedAllReduceKind::kPeer)  // launch/lockstep_model.h "Recovery"
      lm->lockstep_->refuse_recovery("the fused peer all-reduce's device flag epochs cannot be realigned");
  }
  if (lo.load_mtp && cfg.n_mtp_layers > 0 && !lm->models_.front()->has_mtp()) {  // the checkpoint lacks it (warned)
    MX_ASSIGN_OR_RETURN(lm->table_, model::shard_weight_table(model::declared_weights(cfg, false), ranks.front()));
  }
  lm->synthetic_weights_ = lo.synthetic;
  lm->load_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (config.model.require_mtp && !lm->model().has_mtp())
    return invalid_argument("--speculative-algorithm mtp: the model has no MTP layer (num_nextn_predict_layers)");
  return lm;
}

Result<std::unique_ptr<LaunchedModel>> launch_model(const LaunchConfig& config) {
  const parallel::DistInit dist = config.dist.nnodes > 1 ? config.dist : process_dist_init();
  if (dist.nnodes <= 1) return launch_on_node(config, nullptr);
  // Multi-node: the rendezvous first (so a node that fails later still reaches the others), then this node's
  // ranks, then the handshake that fails every node naming the culprit.
  if (config.backend == "cpu" && !parallel::gloo_available())  // before any node waits for this one
    return unsupported("--nnodes " + std::to_string(dist.nnodes) + " --backend cpu needs Gloo, and this mxserve was built "
                       "without it: install Debian's libgloo-dev (scripts/setup.sh does) and rebuild");
  if (config.backend != "cpu" && config.backend != "cuda")
    return unsupported("--nnodes " + std::to_string(dist.nnodes) + " on --backend " + config.backend +
                       ": multi-node runs on --backend cpu (Gloo) or cuda (NCCL)");
  MX_ASSIGN_OR_RETURN(std::vector<parallel::RankLayout> all, config.parallel.ranks());
  MX_ASSIGN_OR_RETURN(std::vector<parallel::RankLayout> local, node_ranks(all, config.parallel, dist));
  const ModelSource& m = config.model;
  const std::string fingerprint = "model " + m.path + (m.synthetic ? " synthetic seed " + std::to_string(m.seed) +
                                  " layers " + std::to_string(m.num_layers) + " " + m.synthetic_quantization : "") +
                                  " mtp " + std::to_string(m.load_mtp || m.require_mtp) + " kv " +
                                  kvcache::kv_cache_dtype_name(m.kv_cache_dtype) + " backend " + config.backend +
                                  " tp " + std::to_string(config.parallel.tp) + " ep " + std::to_string(config.parallel.ep) +
                                  " dp " + std::to_string(config.parallel.dp);
  LaunchConfig node_config = config;  // --dist-timeout bounds the start-up and every collective
  if (dist.timeout_s > 0) node_config.cpu_group.timeout = std::chrono::seconds(dist.timeout_s);
  MX_ASSIGN_OR_RETURN(NodeSessionPtr session,
                      start_node_session(dist, config.backend == "cuda", node_config.cpu_group.timeout,
                                         static_cast<int>(local.size()), fingerprint));
  auto lm = launch_on_node(node_config, session.get());
  MX_RETURN_IF_ERROR(node_handshake(*session, lm.status()));
  std::unique_ptr<LaunchedModel> out = std::move(*lm);
  out->node_ = std::move(session);
  MX_LOG(kInfo) << describe_node(*out->node_) << ": loaded, every node ready";
  if (dist.node_rank == 0) {
    std::vector<parallel::Communicator*> comms;
    for (auto& c : out->comms_) comms.push_back(c.get());
    out->leader_ = make_leader_model(*out->node_, out->local_model(), out->backend(), std::move(comms));
  }
  return out;
}

uint64_t LaunchedModel::kv_bytes_per_block(int64_t block_size) const {
  return models_.front()->kv_spec(1, block_size).bytes();
}

int64_t LaunchedModel::kv_blocks_for_bytes(int64_t block_size, uint64_t bytes) const {
  return runtime::kv_blocks_for_bytes(*models_.front(), block_size, bytes);
}

void LaunchedModel::set_activation_reserve(std::vector<uint64_t> bytes) {
  if (auto* group = dynamic_cast<LockstepModel*>(&model())) {
    group->set_activation_reserve(std::move(bytes));
  } else if (!leader_ && world() == 1) {
    executor_reserve_ = bytes.empty() ? 0 : bytes.front();
  }
}

std::unique_ptr<runtime::ModelExecutor> LaunchedModel::make_executor(int64_t n_blocks, int64_t block_size) {
  auto ex = runtime::make_model_executor(model(), backend(), n_blocks, block_size);
  if (executor_reserve_ > 0) ex->watch_activations(executor_reserve_);
  return ex;
}

std::unique_ptr<runtime::Engine> LaunchedModel::make_engine(const runtime::EngineConfig& config) {
  runtime::EngineConfig c = config;
  c.scheduler.dp_ranks = layout().dp;  // one block range and prefix cache per DP rank (one scheduler)
  return std::make_unique<runtime::Engine>(c, make_executor(c.n_blocks, c.scheduler.block_size));
}

Status LaunchedModel::spec_self_test(const runtime::SpecConfig& spec, int64_t block_size) {
  return runtime::spec_self_test_after_load(model(), backend(), spec, block_size, synthetic_weights_, layout().dp);
}

std::vector<MoeKernelConfigRow> LaunchedModel::moe_kernel_configs() const {
  return backends_.front()->moe_kernel_configs();
}

}  // namespace mxserve::launch
