#include "launch/lockstep_model.h"

#include <cstdlib>
#include <optional>

#include "backend/device_memory.h"
#include "core/check.h"
#include "core/device_oom.h"
#include "core/logging.h"
#include "launch/dp_batch.h"
#include "launch/dp_graph_step.h"
#include "model/decisions.h"
#include "parallel/nccl_communicator.h"

namespace mxserve::launch {

LockstepModel::LockstepModel(std::vector<Rank> ranks, bool device_paths) : ranks_(std::move(ranks)) {
  MX_CHECK(!ranks_.empty());
  device_paths_ = device_paths || ranks_[0].cuda_device >= 0;
  const parallel::RankLayout& layout = ranks_[0].comm->layout();
  tp_ = layout.tp;
  dp_ = layout.dp;
  dp_attention_ = layout.dp_attention;
  // A multi-node launch drives this node's share of a tp world (dp 1; launch/multinode.h).
  MX_CHECK_MSG(tp_ * dp_ == world() || (dp_ == 1 && tp_ % world() == 0),
               "lockstep model: " << world() << " ranks for " << layout.describe());
  for (int r = 0; r < world(); ++r) workers_.emplace_back(&LockstepModel::worker_loop, this, r);
}

LockstepModel::~LockstepModel() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  job_cv_.notify_all();
  for (auto& t : workers_) t.join();
  mirrors_.clear();  // before the backends that hold their memory (the launch destroys those after us)
}

void LockstepModel::worker_loop(int rank) {
  if (ranks_[rank].cuda_device >= 0) parallel::bind_thread_to_device(ranks_[rank].cuda_device);
  // A CHECK abort inside this rank's forward names it (clients of a server only see their connections close).
  set_check_context("rank " + std::to_string(rank) + " of " + std::to_string(world()) +
                    (ranks_[rank].cuda_device >= 0 ? " on CUDA device " + std::to_string(ranks_[rank].cuda_device)
                                                   : std::string(" (CPU)")));
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    job_cv_.wait(lock, [&] { return stop_ || job_generation_ != seen; });
    if (stop_) return;
    seen = job_generation_;
    std::function<void(int)> job = job_;
    lock.unlock();
    job(rank);
    lock.lock();
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

namespace {

// CUDA ranks: makes rank device `device` current on the calling thread for a scope, then `restore` again
// (the caller's thread drives rank 0; the other ranks' streams and memory belong to their own devices).
struct RankDeviceScope {
  RankDeviceScope(int device, int restore) : restore_(device >= 0 ? restore : -1) {
    if (device >= 0) parallel::bind_thread_to_device(device);
  }
  ~RankDeviceScope() {
    if (restore_ >= 0) parallel::bind_thread_to_device(restore_);
  }
  int restore_;
};

}  // namespace

std::vector<kvcache::KvCache*> LockstepModel::rank_caches(kvcache::KvCache& kv) {
  auto& mirror = mirrors_[&kv];
  const kvcache::KvCacheSpec& spec = kv.spec();
  // NOTE: keyed by address; a new caller cache at a freed one's address reuses its mirrors when the geometry
  // matches (every slot is written before it is read, as in any fresh cache), else they are remade.
  if (!mirror.empty() && (mirror[0]->spec().n_blocks != spec.n_blocks ||
                          mirror[0]->spec().block_size != spec.block_size))
    mirror.clear();
  if (mirror.empty()) {
    for (int r = 1; r < world(); ++r) {
      RankDeviceScope on_rank(ranks_[r].cuda_device, ranks_[0].cuda_device);
      backend::Backend* be = ranks_[r].backend;
      mirror.push_back(std::make_unique<kvcache::KvCache>(
          ranks_[r].model->kv_spec(spec.n_blocks, spec.block_size),
          [be](DType dt, Shape s) { return be->alloc(dt, std::move(s)); }));
    }
  }
  // Engine batches index persistent block-table rows: each mirror keeps its own store of the caller's geometry
  // (synced from the same host tables, so every rank's rows hold the same block ids).
  if (const kvcache::BlockTableStore* store = kv.block_tables()) {
    for (size_t i = 0; i < mirror.size(); ++i) {
      const kvcache::BlockTableStore* have = mirror[i]->block_tables();
      if (have != nullptr && have->max_rows() == store->max_rows() &&
          have->max_blocks_per_seq() == store->max_blocks_per_seq())
        continue;
      RankDeviceScope on_rank(ranks_[i + 1].cuda_device, ranks_[0].cuda_device);
      backend::Backend* be = ranks_[i + 1].backend;
      mirror[i]->enable_block_tables(
          store->max_rows(), store->max_blocks_per_seq(), [be](DType dt, Shape s) { return be->alloc(dt, std::move(s)); },
          [be](Tensor& dst, int64_t offset, const Tensor& host) { be->write_from_host(dst, offset, host); });
    }
  }
  std::vector<kvcache::KvCache*> out = {&kv};
  for (auto& c : mirror) out.push_back(c.get());
  return out;
}

std::string LockstepModel::step_shape() const {
  if (step_.batch != nullptr) return step_.prefix + runtime::describe_step(*step_.batch);
  if (step_.device_rows == 0) return "a job outside a forward (a graph replay or capture)";
  return "a device-path step of " + std::to_string(step_.device_rows) + " rows (decode / verify, graph shape)";
}

Result<model::ForwardOutput> LockstepModel::run_all(kvcache::KvCache& kv, const RankFn& fn) {
  MX_ASSIGN_OR_RETURN(std::vector<model::ForwardOutput> outs, run_each(kv, fn));
  return std::move(outs[0]);
}

Result<std::vector<model::ForwardOutput>> LockstepModel::run_each(kvcache::KvCache& kv, const RankFn& fn) {
  MX_RETURN_IF_ERROR(before_step());  // lockstep_recovery.cpp
  const std::vector<kvcache::KvCache*> caches = rank_caches(kv);
  std::vector<std::optional<Result<model::ForwardOutput>>> results(world());
  std::vector<uint64_t> used(world(), 0);  // each rank's activation peak in this job, above what was live before
  const bool watched = !watch_.reserve().empty();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // A decision hook (fixture checks) installed on the caller's thread reaches every rank's forward when the
    // ranks all run the same rows (no DP): each rank then makes, and is forced to, the same decisions. Under
    // DP it also reaches them when one DP group holds every row of the batch (verify-fixture's sequences all
    // live in DP rank 0's blocks; idle groups have no rows of their own, and a DP-attention MoE block routes
    // the gathered rows, which are then the batch's rows in order); with rows on several groups the rows
    // would not line up, so it is withheld.
    int busy_groups = 0;
    if (dp_ > 1 && model::active_decision_hook() != nullptr) busy_groups = dp_groups_with_rows_;
    model::DecisionHook* hook = dp_ == 1 || busy_groups <= 1 ? model::active_decision_hook() : nullptr;
    job_ = [&, hook](int r) {
      model::ScopedDecisionHook scope(hook);
      Result<model::ForwardOutput> res = internal_error("no result");
      const backend::MemoryInterval before =
          watched ? backend::take_memory_interval(*ranks_[r].backend) : backend::MemoryInterval{};
      try {
        const Status injected = fault_hook_ ? fault_hook_(r) : Status::ok();
        res = injected.is_ok() ? fn(r, *caches[r]) : Result<model::ForwardOutput>(injected);
      } catch (const DeviceOutOfMemory& oom) {  // core/device_oom.h: this rank's device is full
        res = out_of_memory(oom.what());
      }
      if (before.known) {
        const backend::MemoryInterval after = backend::take_memory_interval(*ranks_[r].backend);
        used[r] = after.peak > before.in_use ? after.peak - before.in_use : 0;
      }
      if (!res.is_ok()) {  // the others stop at their next collective
        ranks_[r].comm->abort(res.status());
        if (ranks_[r].tp_comm != nullptr) ranks_[r].tp_comm->abort(res.status());
      }
      results[r] = std::move(res);
    };
    pending_ = world();
    ++job_generation_;
    job_cv_.notify_all();
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }
  for (int r = 0; watched && r < world(); ++r) {
    if (!watch_.over(r, used[r])) continue;
    MX_LOG(kWarn) << runtime::activation_over_reserve_message(r, world(), used[r], watch_.reserve()[r], step_shape());
  }
  // The root cause: a rank's own error before the echoes of the group failing on the others.
  int failed = -1;
  for (int r = 0; r < world(); ++r) {
    if (results[r]->is_ok()) continue;
    const bool echo = results[r]->status().message().find("the rank group failed") != std::string::npos;
    if (failed < 0 || (!echo && results[failed]->status().message().find("the rank group failed") !=
                                    std::string::npos))
      failed = r;
  }
  if (failed >= 0) {
    bool recoverable = true;  // a full device on every failed rank (the others' echoes carry its code)
    for (int r = 0; r < world(); ++r)
      if (!results[r]->is_ok() && results[r]->status().code() != StatusCode::kOutOfMemory) recoverable = false;
    Status root = results[failed]->status().with_context("rank " + std::to_string(failed) + " of " +
                                                         std::to_string(world()));
    if (root.code() == StatusCode::kOutOfMemory)
      root = Status(root.code(), root.message() + " (the step: " + step_shape() + ")");
    return after_failed_step(root, recoverable);
  }
  std::vector<model::ForwardOutput> outs;
  for (auto& r : results) outs.push_back(std::move(**r));
  return outs;
}

Result<Tensor> LockstepModel::merge_on_device(int r, const Tensor& mine, int64_t cols, DType dtype,
                                              const std::vector<std::vector<int32_t>>& index, int64_t total) {
  backend::Backend& be = *ranks_[r].backend;
  const int64_t n_mine = r % tp_ == 0 ? static_cast<int64_t>(index[r / tp_].size()) : 0;
  if (n_mine > 0 && (!mine.defined() || mine.dim(0) != n_mine))
    return internal_error("DP merge: DP rank " + std::to_string(r / tp_) + " produced " +
                          (mine.defined() ? mine.describe() : std::string("nothing")) + " for " +
                          std::to_string(n_mine) + " rows");
  const Tensor part = n_mine > 0 ? mine : be.alloc(dtype, {0, cols});
  std::vector<int64_t> counts;
  MX_ASSIGN_OR_RETURN(Tensor all, ranks_[r].comm->all_gather_v(part, &counts));
  if (r != 0 || total == 0) return Tensor();
  // all: the DP groups' rows in group order; output row index[g][i] is row offset_g + i of it.
  Tensor src = Tensor::empty(DType::kI32, {total});
  for (int64_t j = 0; j < total; ++j) src.data<int32_t>()[j] = -1;
  int64_t offset = 0;
  for (int g = 0; g < dp_; ++g) {
    for (size_t i = 0; i < index[g].size(); ++i) src.data<int32_t>()[index[g][i]] = static_cast<int32_t>(offset + i);
    offset += static_cast<int64_t>(index[g].size());
  }
  for (int64_t j = 0; j < total; ++j)
    if (src.data<int32_t>()[j] < 0) return internal_error("DP merge: output row " + std::to_string(j) + " has no source");
  Tensor out = be.alloc(dtype, {total, cols});
  be.gather_rows(all, be.upload(src), out);
  return out;
}

Result<Tensor> LockstepModel::broadcast_from_rank0(int r, const Tensor& x) {
  backend::Backend& be = *ranks_[r].backend;
  const Tensor part = r == 0 ? x : be.alloc(x.dtype(), {0, x.dim(1)});
  return ranks_[r].comm->all_gather_v(part, nullptr);
}

Result<model::ForwardOutput> LockstepModel::run_split(const model::ForwardBatch& batch, kvcache::KvCache& kv,
                                                      const PartFn& fn, const PreFn& pre) {
  MX_ASSIGN_OR_RETURN(DpSplit split, split_by_dp_rank(batch, dp_, kv.pool_blocks()));
  dp_groups_with_rows_ = 0;
  for (const model::ForwardBatch& part : split.parts) dp_groups_with_rows_ += part.n_tokens() > 0 ? 1 : 0;
  const bool on_device = device_paths_;
  const int64_t n_logits = static_cast<int64_t>(batch.logit_rows.size());
  MX_ASSIGN_OR_RETURN(std::vector<model::ForwardOutput> outs,
                      run_each(kv, [&](int r, kvcache::KvCache& rkv) -> Result<model::ForwardOutput> {
    const int g = r / tp_;  // the DP rank (rank layout: dp_rank = rank / tp)
    if (pre) {
      MX_RETURN_IF_ERROR(pre(r, split));
    }
    // Plain DP: a group without tokens sits the step out; DP attention: it joins the MoE exchanges.
    Result<model::ForwardOutput> res = model::ForwardOutput{};
    if (split.parts[g].n_tokens() > 0 || dp_attention_) res = fn(r, split.parts[g], g, rkv);
    if (!on_device || !res.is_ok()) return res;
    // CUDA ranks: each DP group's first rank contributes its rows through the world communicator (every rank
    // joins, an idle group with 0 rows), and rank 0 puts them in the batch's row order on its device.
    model::ForwardOutput merged;
    MX_ASSIGN_OR_RETURN(merged.logits, merge_on_device(r, res->logits, config().vocab_size, DType::kF32,
                                                       split.logit_index, n_logits));
    if (batch.want_hidden) {
      MX_ASSIGN_OR_RETURN(merged.hidden, merge_on_device(r, res->hidden, config().d_model,
                                                         ranks_[r].backend->activation_dtype(), split.rows,
                                                         batch.n_tokens()));
    }
    return Result<model::ForwardOutput>(std::move(merged));
  }));
  if (on_device) return std::move(outs[0]);
  // Each DP group's first rank speaks for it (its tp ranks hold the same outputs).
  std::vector<Tensor> logits(dp_), hidden(dp_);
  for (int g = 0; g < dp_; ++g) {
    logits[g] = outs[g * tp_].logits;
    hidden[g] = outs[g * tp_].hidden;
  }
  model::ForwardOutput out;
  out.logits = merge_rows(logits, split.logit_index, static_cast<int64_t>(batch.logit_rows.size()));
  if (batch.want_hidden) out.hidden = merge_rows(hidden, split.rows, batch.n_tokens());
  return out;
}

void LockstepModel::copy_kv_slots(backend::Backend& be, const Tensor& src_slots, const Tensor& dst_slots,
                                  kvcache::KvCache& kv) {
  const std::vector<kvcache::KvCache*> caches = rank_caches(kv);
  const Tensor src_host = be.to_host(src_slots), dst_host = be.to_host(dst_slots);
  {  // copy_kv_slots returns nothing: a CUDA event error here is fatal, as the copies' own CUDA errors are
    const Status fenced = fence_before_eager();
    MX_CHECK_MSG(fenced.is_ok(), "copy_kv_slots: " << fenced.to_string());
  }
  for (int r = 0; r < world(); ++r) {
    RankDeviceScope on_rank(ranks_[r].cuda_device, ranks_[0].cuda_device);
    backend::Backend& rb = *ranks_[r].backend;
    rb.kv_copy(rb.upload(src_host), rb.upload(dst_host), caches[r]->all_tensors());
  }
  const Status fenced = fence_after_eager();
  MX_CHECK_MSG(fenced.is_ok(), "copy_kv_slots: " << fenced.to_string());
}

Status LockstepModel::fence_before_eager() { return graphs_ ? join_->order_ranks_after_root() : Status::ok(); }
Status LockstepModel::fence_after_eager() { return graphs_ ? join_->order_root_after_ranks() : Status::ok(); }

Result<model::ForwardOutput> LockstepModel::forward(const model::ForwardBatch& batch, kvcache::KvCache& kv) {
  const StepScope scope(step_, {&batch, "", 0});
  MX_RETURN_IF_ERROR(fence_before_eager());
  Result<model::ForwardOutput> out =
      dp_ > 1 ? run_split(batch, kv,
                          [&](int r, const model::ForwardBatch& part, int, kvcache::KvCache& rkv) {
                            return ranks_[r].model->forward(part, rkv);
                          })
              : run_all(kv, [&](int r, kvcache::KvCache& rkv) { return ranks_[r].model->forward(batch, rkv); });
  MX_RETURN_IF_ERROR(fence_after_eager());
  return out;
}

Status LockstepModel::forward_device(const Tensor& ids, const Tensor& positions, const backend::AttentionMeta& meta,
                                     kvcache::KvCache& kv, Tensor& logits, Tensor* hidden) {
  if (per_rank_ != nullptr && per_rank_->recording()) return per_rank_->record(ids, positions, meta, kv, logits, hidden);
  step_ = {nullptr, "", ids.numel()};
  const TpGraphChoice choice = graph_choice();
  if (choice.mode == TpGraphMode::kRefused) return unsupported(choice.why);
  if (choice.mode == TpGraphMode::kPerRank) {
    if (per_rank_->root_capturing())
      return unsupported("per-rank CUDA graphs: rank 0's stream is being captured by one backend; NCCL ranks capture "
                         "through CausalLM::capture_device_graph (one graph per rank)");
    return per_rank_->run_eagerly(ids, positions, meta, kv, logits, hidden);
  }
  if (!join_) {
    std::vector<backend::Backend*> bes;
    for (const Rank& r : ranks_) bes.push_back(r.backend);
    auto made = parallel::make_graph_join(bes);  // refuses ranks on several GPUs (NCCL): not captured yet
    if (!made.is_ok()) return made.status();
    join_ = std::move(made).value();
  }
  // On by default since the H100 run of 2026-12-06 (test_cuda_parallel_layouts CudaGraphsAtTpAboveOneMatchEager:
  // tp 2 / 4, fused and unfused, both *_tiny_a fixtures, tokens identical to eager); MXSERVE_TP_GRAPHS=0 keeps
  // these steps eager (graph_choice; --disable-cuda-graph turns every graph off).
  // DP (launch/dp_graph_step.h): the rows are dp equal slot ranges, group g's ranks run range g; dp 1: the whole.
  std::vector<DpGroupStep> groups(dp_);
  for (int g = 0; g < dp_; ++g) {
    MX_ASSIGN_OR_RETURN(groups[g], dp_group_step(ids, positions, meta, logits, hidden, dp_, g));
  }
  dp_groups_with_rows_ = dp_;  // every group runs its range (a decision hook is withheld, as with rows on several)
  const bool capturing = join_->root_capturing();
  MX_RETURN_IF_ERROR(join_->fork());
  auto res = run_each(kv, [&](int r, kvcache::KvCache& rkv) -> Result<model::ForwardOutput> {
    MX_RETURN_IF_ERROR(join_->enter(r));
    Status st = Status::ok();
    DpGroupStep in = groups[r / tp_];  // this rank's own copy of the views
    if (r % tp_ == 0) {  // the group's first rank: into its range of rank 0's buffers (one device)
      st = ranks_[r].model->forward_device(in.ids, in.positions, in.meta, rkv, in.logits,
                                           hidden != nullptr ? &in.hidden : nullptr);
    } else {  // the gathered logits (and hidden rows) of the other ranks are their first rank's too: temporaries
      backend::Backend& be = *ranks_[r].backend;
      Tensor lg = be.alloc(in.logits.dtype(), in.logits.shape());
      Tensor hd = hidden != nullptr ? be.alloc(in.hidden.dtype(), in.hidden.shape()) : Tensor();
      st = ranks_[r].model->forward_device(in.ids, in.positions, in.meta, rkv, lg, hidden != nullptr ? &hd : nullptr);
    }
    const Status left = join_->leave(r);
    MX_RETURN_IF_ERROR(st);
    MX_RETURN_IF_ERROR(left);
    return model::ForwardOutput{};
  });
  MX_RETURN_IF_ERROR(join_->join());  // every rank's stream back into rank 0's, failed or not (ends the capture)
  if (!res.is_ok()) return res.status();
  if (capturing) graphs_ = true;
  return Status::ok();
}

TpGraphChoice LockstepModel::graph_choice() {
  TpGraphLayout layout;
  for (const Rank& r : ranks_) layout.devices.push_back(r.cuda_device);
  layout.tp = tp_;
  layout.dp = dp_;
  layout.tp_graphs_env = std::getenv("MXSERVE_TP_GRAPHS");
  layout.force_per_rank = force_per_rank_;
  TpGraphChoice choice = choose_tp_graph_mode(layout);
  if (choice.mode == TpGraphMode::kPerRank && per_rank_ == nullptr) {
    std::vector<backend::Backend*> bes;
    std::vector<PerRankGraphs::RankSide> sides;
    for (const Rank& r : ranks_) {
      bes.push_back(r.backend);
      sides.push_back({r.backend, r.model});
    }
    auto capture = parallel::make_rank_capture(bes, layout.devices);
    if (!capture.is_ok()) return {TpGraphMode::kRefused, capture.status().to_string()};
    auto run = [this](kvcache::KvCache& kv, const PerRankGraphs::RankFn& fn) -> Status {
      return run_each(kv, [&](int r, kvcache::KvCache& rkv) -> Result<model::ForwardOutput> {
               MX_RETURN_IF_ERROR(fn(r, rkv));
               return model::ForwardOutput{};
             }).status();
    };
    per_rank_ = std::make_unique<PerRankGraphs>(std::move(sides), std::move(capture).value(), run, mirror_rank0_);
  }
  return choice;
}

void LockstepModel::release_graph_pools(backend::Backend& be) {
  be.release_graph_pool();
  for (const Rank& r : ranks_)
    if (r.backend != &be) {
      RankDeviceScope on_rank(r.cuda_device, ranks_[0].cuda_device);
      r.backend->release_graph_pool();
    }
}

Result<std::unique_ptr<backend::DeviceGraph>> LockstepModel::capture_device_graph(backend::Backend& be,
                                                                                   const std::function<void()>& body) {
  if (graph_choice().mode == TpGraphMode::kPerRank) {
    auto graph = per_rank_->capture(body);
    if (graph.is_ok() && no_recovery_.empty())  // "Recovery": a reset would leave the graphs' communicators behind
      refuse_recovery("per-rank CUDA graphs hold the NCCL communicators they were captured with (a reset makes new "
                      "ones)");
    return graph;
  }
  return be.capture_graph(body);  // the joined capture (forward_device joins the ranks) or the refusal
}

Status LockstepModel::replay_device_graph(backend::DeviceGraph& graph) {
  if (per_rank_ != nullptr && per_rank_->owns(graph)) return per_rank_->replay(graph);
  graph.replay();
  return Status::ok();
}

Result<model::ForwardOutput> LockstepModel::forward_mtp(const model::ForwardBatch& batch, const Tensor& hidden_in,
                                                        kvcache::KvCache& kv) {
  const StepScope scope(step_, {&batch, "an MTP draft forward of ", 0});
  if (graphs_) {  // fenced as forward (only CUDA ranks capture, so this is the device path)
    MX_RETURN_IF_ERROR(fence_before_eager());
    Result<model::ForwardOutput> out = forward_mtp_broadcast(batch, hidden_in, kv);
    MX_RETURN_IF_ERROR(fence_after_eager());
    return out;
  }
  if (device_paths_) return forward_mtp_broadcast(batch, hidden_in, kv);
  // hidden_in is rank 0's (host memory on the CPU backend, identical on every rank): every rank reads it.
  if (dp_ > 1) {
    MX_ASSIGN_OR_RETURN(DpSplit split, split_by_dp_rank(batch, dp_, kv.pool_blocks()));
    std::vector<Tensor> part_hidden(dp_);
    for (int g = 0; g < dp_; ++g) part_hidden[g] = take_rows(hidden_in, split.rows[g]);
    return run_split(batch, kv, [&](int r, const model::ForwardBatch& part, int g, kvcache::KvCache& rkv) {
      return ranks_[r].model->forward_mtp(part, part_hidden[g], rkv);
    });
  }
  return run_all(kv, [&](int r, kvcache::KvCache& rkv) {
    return ranks_[r].model->forward_mtp(batch, hidden_in, rkv);
  });
}

// CUDA ranks: hidden_in lives on rank 0's device (its stream). Every rank gets its own copy on its own device
// through the world communicator (a broadcast as an all_gather_v in which only rank 0 brings rows; the
// communicator orders the copy after rank 0's stream produced it), then, under DP, gathers its group's rows.
Result<model::ForwardOutput> LockstepModel::forward_mtp_broadcast(const model::ForwardBatch& batch,
                                                               const Tensor& hidden_in, kvcache::KvCache& kv) {
  if (!hidden_in.defined() || hidden_in.ndim() != 2)
    return invalid_argument("forward_mtp: hidden_in must be [T, H], got " +
                            (hidden_in.defined() ? hidden_in.describe() : std::string("nothing")));
  if (dp_ > 1) {
    std::vector<Tensor> mine(world());
    return run_split(
        batch, kv,
        [&](int r, const model::ForwardBatch& part, int, kvcache::KvCache& rkv) {
          return ranks_[r].model->forward_mtp(part, mine[r], rkv);
        },
        [&](int r, const DpSplit& split) -> Status {
          MX_ASSIGN_OR_RETURN(Tensor copy, broadcast_from_rank0(r, hidden_in));
          backend::Backend& be = *ranks_[r].backend;
          const std::vector<int32_t>& rows = split.rows[r / tp_];
          const int64_t n = static_cast<int64_t>(rows.size());
          mine[r] = be.alloc(copy.dtype(), {n, copy.dim(1)});
          if (n > 0)
            be.gather_rows(copy, be.upload(Tensor::view_of(const_cast<int32_t*>(rows.data()), DType::kI32, {n})),
                           mine[r]);
          return Status::ok();
        });
  }
  return run_all(kv, [&](int r, kvcache::KvCache& rkv) -> Result<model::ForwardOutput> {
    MX_ASSIGN_OR_RETURN(Tensor copy, broadcast_from_rank0(r, hidden_in));
    return ranks_[r].model->forward_mtp(batch, copy, rkv);
  });
}

}  // namespace mxserve::launch
