#include "runtime/decode_graphs.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <sstream>
#include <tuple>

#include "core/check.h"
#include "core/logging.h"
#include "runtime/dp_graph_rows.h"

namespace mxserve::runtime {
namespace {


std::string join(const std::vector<int64_t>& xs) {
  std::ostringstream o;
  for (size_t i = 0; i < xs.size(); ++i) o << (i ? "," : "") << xs[i];
  return o.str();
}

}  // namespace

std::vector<int64_t> decode_graph_buckets(int64_t max_batch) {
  std::vector<int64_t> out;
  for (int64_t b : {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128})
    if (b < max_batch) out.push_back(b);
  for (int64_t b = 192; b < max_batch; b += 64) out.push_back(b);
  if (max_batch > 0) out.push_back(max_batch);
  return out;
}

std::vector<int64_t> decode_graph_contexts(int64_t max_context) {
  std::vector<int64_t> out;
  for (int64_t c = 128; c < max_context; c *= 2) out.push_back(c);
  if (max_context > 0) out.push_back(max_context);
  return out;
}

std::vector<GraphKey> graph_capture_order(const std::vector<int64_t>& qs, const std::vector<int64_t>& buckets,
                                         const std::vector<int64_t>& contexts) {
  std::vector<GraphKey> out;
  for (auto c = contexts.rbegin(); c != contexts.rend(); ++c)
    for (auto q = qs.rbegin(); q != qs.rend(); ++q)
      for (auto b = buckets.rbegin(); b != buckets.rend(); ++b) out.push_back({*b, *q, *c});
  return out;
}

DecodeGraphs::DecodeGraphs(model::CausalLM& model, backend::Backend& be, kvcache::KvCache& kv,
                           const DecodeGraphLayout& layout)
    : model_(model), be_(be), kv_(kv), layout_(layout) {}

Status DecodeGraphs::capture() {
  kvcache::BlockTableStore* store = kv_.block_tables();
  if (store == nullptr) return invalid_argument("decode graphs: the KV cache has no block-table store");
  if (layout_.scratch_row < 0 || layout_.scratch_row >= store->max_rows() || layout_.scratch_block < 0)
    return invalid_argument("decode graphs: scratch row " + std::to_string(layout_.scratch_row) + " / block " +
                            std::to_string(layout_.scratch_block));
  if (layout_.max_drafts < 0) return invalid_argument("decode graphs: max_drafts " + std::to_string(layout_.max_drafts));
  std::vector<int64_t> tree_qs;
  for (int32_t q : layout_.tree_rows) {
    if (q < 2 || q > 65) return invalid_argument("decode graphs: tree verify rows per sequence " + std::to_string(q));
    tree_qs.push_back(q);
  }
  std::sort(tree_qs.begin(), tree_qs.end());
  tree_qs.erase(std::unique(tree_qs.begin(), tree_qs.end()), tree_qs.end());
  const int64_t max_context = store->max_blocks_per_seq() * layout_.block_size;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t max_q = std::max<int64_t>(1 + layout_.max_drafts, tree_qs.empty() ? 1 : tree_qs.back());
  // DP (CausalLM::device_row_groups() > 1, runtime/dp_graph_rows.h): each bucket holds one slot range per group.
  dp_ = model_.device_row_groups();
  if (dp_ < 1) return invalid_argument("decode graphs: the model splits its rows into " + std::to_string(dp_) + " groups");
  if (dp_ > 1 && be_.cascade_attention_enabled())
    MX_LOG(kInfo) << "CUDA graphs under DP (" << dp_ << " groups): decode graphs attend per sequence (no cascade "
                  << "prefix groups); eager steps keep cascade attention";
  const int64_t max_rows = dp_ * layout_.max_batch * max_q;
  logits_ = be_.alloc(DType::kF32, {max_rows, model_.config().vocab_size});
  hidden_ = be_.alloc(be_.activation_dtype(), {max_rows, model_.config().d_model});
  if (dp_ > 1) slots_ = be_.alloc(DType::kI32, {max_rows});
  MX_ASSIGN_OR_RETURN(const bool tail, graph_sampling_from_env());
  // The tail runs on the capturing backend's stream after forward_device: not under DP (the rows sit in the DP
  // groups' slot ranges) nor where the model records the body's forward to capture it per rank (NCCL ranks).
  const bool tail_fits = dp_ == 1 && !model_.records_graph_body();
  if (tail && !tail_fits) {
    MX_LOG(kInfo) << "CUDA graphs: sampling runs after each decode replay (" << (dp_ > 1 ? "DP slot ranges" : "per-rank graphs")
                  << ": the sampling tail is not captured with them)";
  } else if (tail && backend::has_device_sampling_tail(be_)) {
    sampler_ = std::make_unique<GraphSampler>(be_, layout_.max_batch, model_.config().vocab_size);
    MX_RETURN_IF_ERROR(sampler_->allocate());
  } else if (!tail) {
    MX_LOG(kInfo) << "CUDA graphs: sampling runs after each decode replay (MXSERVE_GRAPH_SAMPLING=0)";
  }
  const std::vector<int64_t> buckets = decode_graph_buckets(layout_.max_batch);
  const std::vector<int64_t> contexts = decode_graph_contexts(max_context);
  std::vector<int64_t> chain_qs;
  for (int64_t q = 1; q <= 1 + layout_.max_drafts; ++q) chain_qs.push_back(q);
  // Capture order (the header's "Capture order"): the graphs that cover the most shapes first, so a device that
  // runs short of memory part-way keeps graphs for every step.
  const std::vector<GraphKey> chain_order = graph_capture_order(chain_qs, buckets, contexts);
  const std::vector<GraphKey> tree_order = graph_capture_order(tree_qs, buckets, contexts);
  const int64_t planned = static_cast<int64_t>(chain_order.size() + tree_order.size());
  for (bool tree : {false, true}) {
    for (const GraphKey& key : tree ? tree_order : chain_order) {
      const Status st = capture_one(tree, key);
      if (st.is_ok()) continue;
      // Out of device memory after some graphs: keep them (named below). Before any, or any other failure: the
      // graphs are off; the executables go first, then their private pools (the failed warm-ups' temporaries,
      // every rank's) go back to the device.
      if (st.code() != StatusCode::kOutOfMemory || n_graphs() == 0) {
        be_.synchronize();
        plain_.clear(), tree_.clear(), plain_keys_.clear(), tree_keys_.clear();
        model_.release_graph_pools(be_);
        return st;
      }
      ran_short_ = "batch " + std::to_string(key.batch) + " x " + std::to_string(key.q) + " rows at context " +
                   std::to_string(key.context) + (tree ? " (tree verify)" : "") + ": " + st.message();
      break;
    }
    if (!ran_short_.empty()) break;
  }
  // pick_graph takes the first covering key: keep each family ascending by (q, batch, context).
  sort_family(plain_, plain_keys_);
  sort_family(tree_, tree_keys_);
  be_.synchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MX_LOG(kInfo) << "CUDA graphs: captured " << n_graphs() << (ran_short_.empty() ? "" : " of " + std::to_string(planned))
                << " decode graphs in " << secs << " s; batch buckets "
                << join(buckets) << "; context classes " << join(contexts)
                << (layout_.max_drafts > 0
                        ? "; rows per sequence 1.." + std::to_string(1 + layout_.max_drafts) + " (chain verify steps)"
                        : std::string())
                << (tree_qs.empty() ? std::string() : "; tree verify steps of " + join(tree_qs) + " rows per sequence")
                << (dp_ > 1 ? "; " + std::to_string(dp_) + " DP groups, each padded to the bucket (batch buckets are per "
                                  "group)"
                            : std::string())
                << " (--disable-cuda-graph / --enforce-eager turn them off)";
  if (!ran_short_.empty()) {
    MX_LOG(kWarn) << "CUDA graphs: the device ran short of memory after " << n_graphs() << " of " << planned
                  << " decode graphs, at " << ran_short_ << ". A step whose own shape has no graph replays the "
                  << "smallest larger one (padded rows, a longer context class: slower than its own graph)"
                  << (tree_order.empty() || !tree_.empty() ? "" : "; tree verify steps run eagerly (no tree graph)")
                  << ". To capture them all, make room as the message says";
  }
  return Status::ok();
}

void DecodeGraphs::sort_family(std::vector<Graph>& graphs, std::vector<GraphKey>& keys) {
  auto less = [](const GraphKey& a, const GraphKey& b) {
    return std::tie(a.q, a.batch, a.context) < std::tie(b.q, b.batch, b.context);
  };
  std::sort(graphs.begin(), graphs.end(), [&](const Graph& a, const Graph& b) { return less(a.key, b.key); });
  keys.clear();
  for (const Graph& g : graphs) keys.push_back(g.key);
}

Status DecodeGraphs::capture_one(bool tree, const GraphKey& key) {
  kvcache::BlockTableStore* store = kv_.block_tables();
  const int64_t bs = layout_.block_size;
  const GraphPadding pad{layout_.scratch_row, static_cast<int32_t>(layout_.scratch_block * bs)};
  const int fields = tree ? kGraphTreeRowFields : kGraphRowFields;
  const model::ForwardBatch empty;
  const int64_t B = key.batch, q = key.q, C = key.context;
  const int64_t T = dp_ * B * q;  // DP: dp slot ranges of B q rows, one per group
  // Every row padded while capturing: the warm-up run writes and reads only the scratch slot.
  std::vector<int32_t> host(fields * T);
  std::vector<int64_t> mask(T);
  stage_graph_rows(empty, T, bs, pad, tree, host.data(), tree ? mask.data() : nullptr);
  Graph g;
  g.key = key;
  g.tree = tree;
  g.inputs = be_.alloc(DType::kI32, {fields, T});
  be_.write_from_host(g.inputs, 0, Tensor::view_of(host.data(), DType::kI32, {fields * T}));
  if (tree) {  // the masks the kernels read, in this graph's own buffer
    g.mask = be_.alloc(DType::kI64, {T});
    be_.write_from_host(g.mask, 0, Tensor::view_of(mask.data(), DType::kI64, {T}));
  }
  backend::AttentionMeta meta = graph_attention_meta(g.inputs, g.mask, *store, dp_ * B, q, C, bs, tree);
  const auto& mc = model_.config();
  if (dp_ == 1 && q == 1 && !tree && B >= 2 && be_.cascade_attention_enabled() && mc.n_kv_heads > 0) {
    g.cascade_shape.cap_rows = static_cast<int32_t>(B);
    g.cascade_shape.group_size = static_cast<int32_t>(mc.n_heads / mc.n_kv_heads);
    g.cascade_shape.cap_work = kernels::cascade_work_capacity(static_cast<int32_t>(B), g.cascade_shape.group_size, 2);
    g.cascade_shape.max_prefix_keys = static_cast<int32_t>(C);
    // Prefix split plan: groups of ~4 rows expected (the seed workload's).
    g.cascade_shape.n_work_hint = std::max<int32_t>(1, static_cast<int32_t>(B) / 4);
    g.cascade = be_.alloc(DType::kI32, {g.cascade_shape.n_ints()});
    const std::vector<int32_t> zeros(g.cascade_shape.n_ints(), 0);  // no group while capturing
    be_.write_from_host(g.cascade, 0, Tensor::view_of(const_cast<int32_t*>(zeros.data()), DType::kI32,
                                                      {g.cascade_shape.n_ints()}));
    meta.cascade = g.cascade;
    meta.cascade_shape = g.cascade_shape;
  }
  Tensor ids = graph_row_field(g.inputs, kRowIds), positions = graph_row_field(g.inputs, kRowPositions);
  Tensor logits = logits_.slice_rows(0, T), hidden = hidden_.slice_rows(0, T);
  // The body holds its inputs by value (views of this object's buffers): a backend may keep it.
  auto body_status = std::make_shared<Status>(Status::ok());
  model::CausalLM* model = &model_;
  kvcache::KvCache* kv = &kv_;
  g.tail = sampler_ && q == 1 && !tree;  // plain decode buckets sample in the graph
  const GraphSampler::Tail tail = g.tail ? sampler_->tail(logits, T) : GraphSampler::Tail{};
  const bool with_tail = g.tail;
  auto graph = model_.capture_device_graph(be_, [=]() mutable {
    Status st = model->forward_device(ids, positions, meta, *kv, logits, &hidden);
    if (st.is_ok() && with_tail) st = tail.enqueue();
    if (!st.is_ok()) *body_status = st;
  });
  MX_RETURN_IF_ERROR(*body_status);
  if (!graph.is_ok()) return graph.status();
  g.graph = std::move(graph).value();
  (tree ? tree_ : plain_).push_back(std::move(g));
  return Status::ok();
}

bool DecodeGraphs::covers(const model::ForwardBatch& batch, std::string* why) const {
  std::string reason;
  auto no = [&](std::string r) {
    if (why != nullptr) *why = std::move(r);
    return false;
  };
  if (plain_.empty() && tree_.empty()) return no("no graphs captured");
  const GraphBatchShape shape = graph_batch_shape(batch, &reason);
  if (!reason.empty()) return no(reason);
  const int64_t T = shape.rows;
  if (static_cast<int64_t>(batch.logit_rows.size()) != T) return no("not every row is a logit row");
  for (int64_t r = 0; r < T; ++r)
    if (batch.logit_rows[r] != r) return no("logit rows out of row order");
  const std::vector<GraphKey>& keys = shape.tree ? tree_keys_ : plain_keys_;
  if (dp_ > 1) {  // the bucket must hold the fullest DP group (runtime/dp_graph_rows.h)
    const DpGraphRows groups = dp_graph_rows(batch, dp_, kv_.pool_blocks(), &reason);
    if (!reason.empty()) return no(reason);
    if (pick_graph(keys, groups.bucket) >= 0) return true;
    return no(std::string(shape.tree ? "tree verify" : shape.max_rows > 1 ? "verify" : "decode") +
              " step with a DP group of " + std::to_string(groups.bucket.seqs) + " sequences x up to " +
              std::to_string(groups.bucket.max_rows) + " rows at context " + std::to_string(groups.bucket.max_kv) +
              " is outside every captured bucket (buckets are per DP group)");
  }
  if (pick_graph(keys, shape) >= 0) return true;
  return no(std::string(shape.tree ? "tree verify" : shape.max_rows > 1 ? "verify" : "decode") + " step of " +
            std::to_string(shape.seqs) + " sequences x up to " + std::to_string(shape.max_rows) +
            " rows at context " + std::to_string(shape.max_kv) + " is outside every captured bucket");
}

Result<model::ForwardOutput> DecodeGraphs::run(const model::ForwardBatch& batch, const kernels::SampleRowsInput* sample,
                                               GraphSampleOutput* sampled) {
  std::string why;
  const GraphBatchShape shape = graph_batch_shape(batch, &why);
  const std::vector<GraphKey>& keys = shape.tree ? tree_keys_ : plain_keys_;
  DpGraphRows groups;
  if (dp_ > 1 && why.empty()) groups = dp_graph_rows(batch, dp_, kv_.pool_blocks(), &why);
  const int64_t i = why.empty() ? pick_graph(keys, dp_ > 1 ? groups.bucket : shape) : -1;
  if (i < 0)
    return internal_error("decode graphs: no graph for " + std::to_string(shape.seqs) + " sequences x " +
                          std::to_string(shape.max_rows) + " rows at context " + std::to_string(shape.max_kv) +
                          (why.empty() ? "" : " (" + why + ")") + " (covers() was not asked)");
  const Graph& g = (shape.tree ? tree_ : plain_)[i];
  kvcache::BlockTableStore* store = kv_.block_tables();
  for (const auto& x : batch.seqs) MX_RETURN_IF_ERROR(store->sync(x.table_row, x.table_lease, x.blocks()));
  const int64_t group_cap = g.key.batch * g.key.q, cap = dp_ * group_cap, T = shape.rows;
  const int fields = g.tree ? kGraphTreeRowFields : kGraphRowFields;
  host_.resize(fields * cap);
  host_mask_.resize(cap);
  const GraphPadding pad{layout_.scratch_row, static_cast<int32_t>(layout_.scratch_block * layout_.block_size)};
  if (dp_ > 1)  // group g's rows at [g group_cap, ...), row_slot_: each batch row's slot
    stage_dp_graph_rows(batch, groups, group_cap, layout_.block_size, pad, g.tree, host_.data(),
                        g.tree ? host_mask_.data() : nullptr, &row_slot_);
  else
    stage_graph_rows(batch, cap, layout_.block_size, pad, g.tree, host_.data(), g.tree ? host_mask_.data() : nullptr);
  Tensor inputs = g.inputs;
  be_.write_from_host(inputs, 0, Tensor::view_of(host_.data(), DType::kI32, {fields * cap}));
  if (g.tree) {
    Tensor mask = g.mask;
    be_.write_from_host(mask, 0, Tensor::view_of(host_mask_.data(), DType::kI64, {cap}));
  }
  // This replay's prefix groups (q = 1: row s is sequence s; none that fit: every row's whole context through the
  // per-warp kernel). A graph without the buffer holds a default (0-d, numel 1) Tensor.
  if (g.cascade.ndim() == 1 && g.cascade.numel() > 0) {
    const kernels::CascadeShape& cs = g.cascade_shape;
    const int64_t bs = layout_.block_size;
    cascade_host_.assign(cs.n_ints(), 0);
    const kernels::CascadeLayout layout =
        model::cascade_groups(batch, static_cast<int32_t>(batch.seqs.size()), bs);
    // The eager rule (model/forward_batch.cpp): groups only where they save enough K/V reads per layer (bf16
    // bytes, the model's kv heads), so a step computes the same with graphs on and off.
    const auto& mc = model_.config();
    const bool pays = model::cascade_pays(layout, bs, mc.n_kv_heads, mc.head_dim, be_);
    if (!pays || !kernels::encode_cascade(layout, static_cast<int32_t>(bs), cs, cascade_host_.data()))
      cascade_host_.assign(cs.n_ints(), 0);
    Tensor cascade = g.cascade;
    be_.write_from_host(cascade, 0, Tensor::view_of(cascade_host_.data(), DType::kI32, {cs.n_ints()}));
  }
  const bool in_graph = g.tail && sampler_->stage(sampled != nullptr ? sample : nullptr, T, cap);
  MX_RETURN_IF_ERROR(model_.replay_device_graph(*g.graph));
  ++replays_;
  if (g.tail && sampled != nullptr) sampler_->read(sample, T, cap, in_graph, sampled);
  if (g.tree)
    ++tree_replays_;
  else
    verify_replays_ += shape.max_rows > 1;
  model::ForwardOutput out;
  if (dp_ > 1) {  // the groups' slots back into the batch's row order (eager gathers after the replay)
    Tensor slots = slots_.slice_rows(0, T);
    be_.write_from_host(slots, 0, Tensor::view_of(row_slot_.data(), DType::kI32, {T}));
    out.logits = be_.alloc(DType::kF32, {T, logits_.dim(1)});
    be_.gather_rows(logits_, slots, out.logits);
    if (batch.want_hidden) {
      out.hidden = be_.alloc(hidden_.dtype(), {T, hidden_.dim(1)});
      be_.gather_rows(hidden_, slots, out.hidden);
    }
    return out;
  }
  out.logits = logits_.slice_rows(0, T);
  if (batch.want_hidden) out.hidden = hidden_.slice_rows(0, T);
  return out;
}

}  // namespace mxserve::runtime
