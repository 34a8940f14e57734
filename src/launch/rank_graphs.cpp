// Per-rank CUDA graphs over NCCL ranks, and which lockstep layout gets which graphs (see rank_graphs.h).
#include "launch/rank_graphs.h"

#include <set>
#include <tuple>

#include "core/check.h"
#include "core/device_oom.h"

namespace mxserve::launch {

std::string multinode_graphs_refusal() {
  return "CUDA graphs with --nnodes > 1: the follower nodes' step loop (launch/multinode.h) runs each step eagerly "
         "from node 0's step messages; graphs would need every follower to capture its own ranks' graphs and replay "
         "them in step with node 0 (not built: every step runs eagerly)";
}

TpGraphChoice choose_tp_graph_mode(const TpGraphLayout& l) {
  auto refuse = [](std::string why) { return TpGraphChoice{TpGraphMode::kRefused, std::move(why)}; };
  const int world = static_cast<int>(l.devices.size());
  if (world == 0 || l.devices[0] < 0) return refuse("CUDA graphs: these ranks are not CUDA ranks");
  if (world < l.tp * l.dp)
    return refuse(multinode_graphs_refusal() + " (this node runs " + std::to_string(world) + " of " +
                  std::to_string(l.tp) + " tensor-parallel ranks)");
  if (l.tp_graphs_env != nullptr && std::string(l.tp_graphs_env) == "0")
    return refuse("CUDA graphs at --tensor-parallel-size " + std::to_string(l.tp) +
                  (l.dp > 1 ? " x --data-parallel-size " + std::to_string(l.dp) : std::string()) +
                  " turned off by MXSERVE_TP_GRAPHS=0");
  // Per-rank graphs over NCCL ranks stay opt-in (MXSERVE_TP_GRAPHS=1) until a several-GPU run proves them: one GPU
  // runs them only as a one-rank world (docs/parallel.md "CUDA graphs at tp > 1").
  const bool opted_in = l.tp_graphs_env != nullptr && std::string(l.tp_graphs_env) == "1";
  std::set<int> distinct(l.devices.begin(), l.devices.end());
  if (distinct.size() == 1 && world > 1) {
    if (l.force_per_rank)
      return refuse("per-rank CUDA graphs on " + std::to_string(world) + " ranks of one GPU (" +
                    std::to_string(l.devices[0]) + ", the shared-device stand-in) are unsound: replayed apart, "
                    "the stand-in's event-ordered collectives would wait on another step's records "
                    "(parallel/graph_join.h); the joined capture serves these ranks");
    return {TpGraphMode::kJoined, "every rank's step in one graph on rank 0's stream (the ranks share GPU " +
                                      std::to_string(l.devices[0]) + ")"};
  }
  if (world == 1 && !l.force_per_rank)
    return {TpGraphMode::kJoined, "one rank: its step in one graph on its stream"};
  if (static_cast<int>(distinct.size()) != world) {
    for (int r = 1; r < world; ++r)
      for (int s = 0; s < r; ++s)
        if (l.devices[r] == l.devices[s])
          return refuse("CUDA graphs: ranks " + std::to_string(s) + " and " + std::to_string(r) + " share GPU " +
                        std::to_string(l.devices[r]) + " while other ranks have their own: per-rank graphs need one "
                        "GPU per rank, the joined capture one GPU for all (the steps run eagerly)");
  }
  // DP graphs stage each DP group's rows in its own slot range of rank 0's input buffers (launch/dp_graph_step.h),
  // which the per-rank capture's input mirrors do not model yet.
  if (l.dp > 1)
    return refuse("CUDA graphs with --data-parallel-size " + std::to_string(l.dp) +
                  " on ranks with a GPU each: per-rank capture of the DP groups' slot ranges is not built (the joined "
                  "capture of the one-GPU stand-in serves DP; these steps run eagerly)");
  if (!opted_in && !l.force_per_rank)
    return refuse("per-rank CUDA graphs over " + std::to_string(world) + " GPUs (NCCL collectives inside each rank's "
                  "graph) are built but have not run on several GPUs yet: MXSERVE_TP_GRAPHS=1 turns them on (these "
                  "steps run eagerly)");
  return {TpGraphMode::kPerRank, "one graph per rank on its own GPU (" + std::to_string(world) +
                                     " ranks, thread-local capture, launched together from the ranks' threads)"};
}

backend::AttentionMeta mirror_attention_meta(const backend::AttentionMeta& meta,
                                             const std::function<Tensor(const Tensor&)>& mirror) {
  backend::AttentionMeta out = meta;
  for (Tensor backend::AttentionMeta::*field :
       {&backend::AttentionMeta::token_seq, &backend::AttentionMeta::kv_index, &backend::AttentionMeta::slot_mapping,
        &backend::AttentionMeta::block_tables, &backend::AttentionMeta::tree_mask, &backend::AttentionMeta::tree_base,
        &backend::AttentionMeta::cascade})
    out.*field = mirror(meta.*field);
  // The kernels read the tree rows through raw pointers: re-aim them (they pointed into meta's tensors).
  if (meta.params.tree_mask != nullptr) out.params.tree_mask = static_cast<const uint64_t*>(out.tree_mask.raw());
  if (meta.params.tree_base != nullptr) out.params.tree_base = static_cast<const int32_t*>(out.tree_base.raw());
  return out;
}

// One decode graph: every rank's own graph, and the caller's cache the ranks' caches mirror.
class PerRankGraphs::Graph final : public backend::DeviceGraph {
 public:
  Graph(PerRankGraphs* owner, kvcache::KvCache* kv, std::vector<std::unique_ptr<backend::DeviceGraph>> graphs)
      : owner_(owner), kv_(kv), graphs_(std::move(graphs)) {}
  // Callers go through CausalLM::replay_device_graph, which returns the error; a direct replay() must not
  // carry on past a failed rank.
  void replay() override {
    const Status st = owner_->replay(*this);
    MX_CHECK_MSG(st.is_ok(), st.to_string());
  }
  PerRankGraphs* owner_;
  kvcache::KvCache* kv_;
  std::vector<std::unique_ptr<backend::DeviceGraph>> graphs_;
};

PerRankGraphs::PerRankGraphs(std::vector<RankSide> ranks, std::unique_ptr<parallel::RankCapture> capture,
                             RunOnRanks run, bool mirror_rank0)
    : ranks_(std::move(ranks)), capture_(std::move(capture)), run_(std::move(run)), mirror_rank0_(mirror_rank0) {
  mirrors_.resize(ranks_.size());
}

PerRankGraphs::~PerRankGraphs() = default;

Status PerRankGraphs::record(const Tensor& ids, const Tensor& positions, const backend::AttentionMeta& meta,
                             kvcache::KvCache& kv, Tensor& logits, Tensor* hidden) {
  ++recorded_calls_;
  Call c;
  c.ids = ids;
  c.positions = positions;
  c.meta = meta;
  c.kv = &kv;
  c.logits = logits;
  c.has_hidden = hidden != nullptr;
  if (hidden != nullptr) c.hidden = *hidden;
  recorded_ = std::move(c);
  return Status::ok();
}

PerRankGraphs::RankInputs PerRankGraphs::inputs_for(int r, const Call& c) {
  RankInputs in;
  const bool mirror = r > 0 || mirror_rank0_;
  backend::Backend& be = *ranks_[r].backend;
  auto m = [&](const Tensor& src) -> Tensor {
    if (!mirror || !src.defined() || src.raw() == nullptr || src.nbytes() == 0) return src;
    const auto key = std::make_tuple(static_cast<const void*>(src.raw()), src.nbytes(), static_cast<int>(src.dtype()));
    auto it = mirrors_[r].find(key);
    if (it == mirrors_[r].end()) it = mirrors_[r].emplace(key, be.alloc(src.dtype(), src.shape())).first;
    Tensor dst = it->second.reshape(src.shape());
    in.copies.emplace_back(src, dst);
    return dst;
  };
  in.ids = m(c.ids);
  in.positions = m(c.positions);
  in.meta = mirror_attention_meta(c.meta, m);
  return in;
}

Status PerRankGraphs::rank_step(int r, const Call& c, const RankInputs& in, kvcache::KvCache& rank_kv) {
  for (const auto& [src, dst] : in.copies) {
    Tensor to = dst;
    MX_RETURN_IF_ERROR(capture_->copy_from_root(r, src, to));
  }
  Tensor logits = c.logits, hidden = c.hidden;
  if (r != 0) {  // the all-gathered logits (and hidden rows) of the other ranks are rank 0's: temporaries here
    backend::Backend& be = *ranks_[r].backend;
    logits = be.alloc(c.logits.dtype(), c.logits.shape());
    if (c.has_hidden) hidden = be.alloc(c.hidden.dtype(), c.hidden.shape());
  }
  return ranks_[r].model->forward_device(in.ids, in.positions, in.meta, rank_kv, logits,
                                         c.has_hidden ? &hidden : nullptr);
}

Status PerRankGraphs::run_named(kvcache::KvCache& kv, const RankFn& fn) {
  return run_(kv, [&](int r, kvcache::KvCache& rkv) -> Status {
    return fn(r, rkv).with_context("per-rank CUDA graphs, rank " + std::to_string(r));
  });
}

Result<std::unique_ptr<backend::DeviceGraph>> PerRankGraphs::capture(const std::function<void()>& body) {
  recorded_.reset();
  recorded_calls_ = 0;
  recording_ = true;
  body();
  recording_ = false;
  if (recorded_calls_ != 1 || !recorded_)
    return unsupported("per-rank CUDA graphs capture one forward_device call per graph (a decode step); this body "
                       "made " + std::to_string(recorded_calls_));
  const Call c = *recorded_;
  recorded_.reset();
  std::vector<std::unique_ptr<backend::DeviceGraph>> graphs(ranks_.size());
  // A capture or instantiation that fails after the rank's forward ran whole (warm-up and capture) leaves no
  // collective pending: it is kept here, not returned from the rank's job, so the group is not aborted and the
  // engine runs eagerly (logged). A forward that failed is returned (the group aborts: peers may wait in it).
  std::vector<Status> capture_errors(ranks_.size(), Status::ok());
  MX_RETURN_IF_ERROR(capture_->mark_root());  // the capture's warm-up run reads what rank 0 wrote so far
  const Status st = run_named(*c.kv, [&](int r, kvcache::KvCache& rkv) -> Status {
    // Mirrors allocated outside the capture (not from its pool). The body holds its inputs by value, as the
    // decode graphs' bodies do: a capture may keep it.
    auto in = std::make_shared<const RankInputs>(inputs_for(r, c));
    auto call = std::make_shared<const Call>(c);
    auto body_status = std::make_shared<Status>(Status::ok());
    kvcache::KvCache* rank_kv = &rkv;
    MX_RETURN_IF_ERROR(capture_->wait_root(r));
    auto g = capture_->capture(r, [this, r, in, call, rank_kv, body_status] {
      Status s = Status::ok();
      try {  // a full device must not leave the stream capturing (the capture ends; the step fails as OOM)
        s = rank_step(r, *call, *in, *rank_kv);
      } catch (const DeviceOutOfMemory& oom) {
        s = out_of_memory(oom.what());
      }
      if (!s.is_ok() && body_status->is_ok()) *body_status = s;
    });
    MX_RETURN_IF_ERROR(*body_status);
    if (g.is_ok())
      graphs[r] = std::move(g).value();
    else
      capture_errors[r] = g.status().with_context("per-rank CUDA graphs, rank " + std::to_string(r));
    return capture_->mark_rank(r);
  });
  const Status joined = capture_->join_ranks();
  MX_RETURN_IF_ERROR(st);
  MX_RETURN_IF_ERROR(joined);
  for (const Status& e : capture_errors) MX_RETURN_IF_ERROR(e);
  return std::unique_ptr<backend::DeviceGraph>(std::make_unique<Graph>(this, c.kv, std::move(graphs)));
}

bool PerRankGraphs::owns(const backend::DeviceGraph& graph) const {
  const auto* g = dynamic_cast<const Graph*>(&graph);
  return g != nullptr && g->owner_ == this;
}

Status PerRankGraphs::replay(backend::DeviceGraph& graph) {
  auto* g = dynamic_cast<Graph*>(&graph);
  if (g == nullptr || g->owner_ != this) return internal_error("per-rank CUDA graphs: replay of a graph made elsewhere");
  MX_RETURN_IF_ERROR(capture_->mark_root());  // after the engine's writes of this step's inputs
  const Status st = run_named(*g->kv_, [&](int r, kvcache::KvCache&) -> Status {
    MX_RETURN_IF_ERROR(capture_->wait_root(r));
    MX_RETURN_IF_ERROR(capture_->launch(r, *g->graphs_[r]));
    return capture_->mark_rank(r);
  });
  const Status joined = capture_->join_ranks();  // rank 0's later work (the next writes) after every rank's copies
  MX_RETURN_IF_ERROR(st);
  MX_RETURN_IF_ERROR(joined);
  ++replays_;
  return Status::ok();
}

Status PerRankGraphs::run_eagerly(const Tensor& ids, const Tensor& positions, const backend::AttentionMeta& meta,
                                  kvcache::KvCache& kv, Tensor& logits, Tensor* hidden) {
  Call c;
  c.ids = ids;
  c.positions = positions;
  c.meta = meta;
  c.kv = &kv;
  c.logits = logits;
  c.has_hidden = hidden != nullptr;
  if (hidden != nullptr) c.hidden = *hidden;
  MX_RETURN_IF_ERROR(capture_->mark_root());
  const Status st = run_named(kv, [&](int r, kvcache::KvCache& rkv) -> Status {
    const RankInputs in = inputs_for(r, c);
    MX_RETURN_IF_ERROR(capture_->wait_root(r));
    MX_RETURN_IF_ERROR(rank_step(r, c, in, rkv));
    return capture_->mark_rank(r);
  });
  const Status joined = capture_->join_ranks();
  MX_RETURN_IF_ERROR(st);
  return joined;
}

}  // namespace mxserve::launch
