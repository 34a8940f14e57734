#include "runtime/mtp_graphs.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <sstream>

#include "core/check.h"
#include "core/logging.h"

namespace mxserve::runtime {
namespace {

using Family = MtpGraphs::Family;
using MtpDeviceRows = model::CausalLM::MtpDeviceRows;


MtpDeviceRows device_rows(Family f) {
  switch (f) {
    case Family::kChain: return MtpDeviceRows::kChainContinuation;
    case Family::kExtend: return MtpDeviceRows::kExtend;
    case Family::kTree: return MtpDeviceRows::kTree;
  }
  return MtpDeviceRows::kChainContinuation;
}

const char* family_name(Family f) {
  switch (f) {
    case Family::kChain: return "chain continuation";
    case Family::kExtend: return "extend";
    case Family::kTree: return "tree draft";
  }
  return "?";
}

}  // namespace

MtpGraphs::MtpGraphs(model::CausalLM& model, backend::Backend& be, kvcache::KvCache& kv,
                     const DecodeGraphLayout& layout, const MtpGraphShapes& shapes)
    : model_(model), be_(be), kv_(kv), layout_(layout), shapes_(shapes) {}

int64_t MtpGraphs::n_graphs() const {
  int64_t n = static_cast<int64_t>(heads_.size());
  for (const Set& s : sets_) n += static_cast<int64_t>(s.graphs.size());
  return n;
}

Status MtpGraphs::capture() {
  kvcache::BlockTableStore* store = kv_.block_tables();
  if (store == nullptr) return invalid_argument("MTP graphs: the KV cache has no block-table store");
  if (!model_.has_mtp()) return invalid_argument("MTP graphs: the model has no MTP layer");
  if (layout_.scratch_row < 0 || layout_.scratch_row >= store->max_rows() || layout_.scratch_block < 0)
    return invalid_argument("MTP graphs: scratch row " + std::to_string(layout_.scratch_row) + " / block " +
                            std::to_string(layout_.scratch_block));
  if (shapes_.extend_rows < 0 || shapes_.tree_rows < 0 || shapes_.tree_rows > 64)
    return invalid_argument("MTP graphs: extend rows " + std::to_string(shapes_.extend_rows) + ", tree rows " +
                            std::to_string(shapes_.tree_rows));
  const int64_t max_context = store->max_blocks_per_seq() * layout_.block_size;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int64_t> buckets = decode_graph_buckets(layout_.max_batch);
  const std::vector<int64_t> contexts = decode_graph_contexts(max_context);
  if (shapes_.chain) {
    MX_RETURN_IF_ERROR(model_.reserve_mtp_chain(layout_.max_batch));
    MX_RETURN_IF_ERROR(capture_family(Family::kChain, {1}, buckets, contexts));
  }
  if (shapes_.extend_rows > 0) {
    MX_RETURN_IF_ERROR(model_.reserve_mtp_extend(layout_.max_batch * shapes_.extend_rows));
    std::vector<int64_t> qs;
    for (int64_t q = 1; q <= shapes_.extend_rows; ++q) qs.push_back(q);
    MX_RETURN_IF_ERROR(capture_family(Family::kExtend, qs, buckets, contexts));
    MX_RETURN_IF_ERROR(capture_heads(buckets));
  }
  if (shapes_.tree_rows > 0) MX_RETURN_IF_ERROR(capture_family(Family::kTree, {shapes_.tree_rows}, buckets, contexts));
  be_.synchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ostringstream what;
  what << sets_[0].graphs.size() << " chain continuation, " << sets_[1].graphs.size() << " extend (rows per sequence 1.."
       << shapes_.extend_rows << ") + " << heads_.size() << " extend head, " << sets_[2].graphs.size()
       << " tree draft (up to " << shapes_.tree_rows << " rows per sequence)";
  MX_LOG(kInfo) << "CUDA graphs: captured " << n_graphs() << " MTP draft graphs in " << secs << " s: " << what.str();
  return Status::ok();
}

Status MtpGraphs::capture_family(Family f, const std::vector<int64_t>& qs, const std::vector<int64_t>& buckets,
                                 const std::vector<int64_t>& contexts) {
  kvcache::BlockTableStore* store = kv_.block_tables();
  Set& set = sets_[static_cast<int>(f)];
  const int64_t H = model_.config().d_model, V = model_.config().vocab_size, bs = layout_.block_size;
  const int64_t max_rows = layout_.max_batch * *std::max_element(qs.begin(), qs.end());
  // Finite padding rows: zeros until a replay's real rows leave theirs behind.
  set.hidden_in = be_.upload(Tensor::zeros(be_.activation_dtype(), {max_rows, H}));
  set.hidden = be_.alloc(be_.activation_dtype(), {max_rows, H});
  if (f != Family::kExtend) set.logits = be_.alloc(DType::kF32, {max_rows, V});
  const GraphPadding pad{layout_.scratch_row, static_cast<int32_t>(layout_.scratch_block * bs)};
  const bool tree = f == Family::kTree;
  const int fields = fields_of(f), n_rows = fields + extra_rows_of(f);
  const model::ForwardBatch empty;
  for (int64_t q : qs) {
    for (int64_t B : buckets) {
      const int64_t T = B * q;
      std::vector<int32_t> host(n_rows * T);  // every row padded while capturing (scratch slot only)
      std::vector<int64_t> mask(T);
      stage_graph_rows(empty, T, bs, pad, tree, host.data(), tree ? mask.data() : nullptr);
      for (int64_t r = 0; r < T; ++r) host[(n_rows - 1) * T + r] = static_cast<int32_t>(r);  // identity
      for (int64_t C : contexts) {
        Graph g;
        g.key = {B, q, C};
        g.inputs = be_.alloc(DType::kI32, {n_rows, T});
        be_.write_from_host(g.inputs, 0, Tensor::view_of(host.data(), DType::kI32, {n_rows * T}));
        if (tree) {  // the masks the kernels read, in this graph's own buffer
          g.mask = be_.alloc(DType::kI64, {T});
          be_.write_from_host(g.mask, 0, Tensor::view_of(mask.data(), DType::kI64, {T}));
        }
        backend::AttentionMeta meta = graph_attention_meta(g.inputs, g.mask, *store, B, q, C, bs, tree);
        Tensor ids = graph_row_field(g.inputs, kRowIds), positions = graph_row_field(g.inputs, kRowPositions);
        Tensor logits = f == Family::kExtend ? Tensor() : set.logits.slice_rows(0, T);
        Tensor hidden = set.hidden.slice_rows(0, T), hidden_in = set.hidden_in.slice_rows(0, T);
        const MtpDeviceRows rows = device_rows(f);
        // The body holds its inputs by value (views of this object's buffers): a backend may keep it.
        auto body_status = std::make_shared<Status>(Status::ok());
        model::CausalLM* model = &model_;
        kvcache::KvCache* kv = &kv_;
        auto graph = model_.capture_device_graph(be_, [=]() mutable {
          const Status st = model->forward_mtp_device(ids, positions, hidden_in, meta, *kv, logits, hidden, rows);
          if (!st.is_ok()) *body_status = st;
        });
        MX_RETURN_IF_ERROR(*body_status);
        if (!graph.is_ok()) return graph.status();
        g.graph = std::move(graph).value();
        set.keys.push_back(g.key);
        set.graphs.push_back(std::move(g));
      }
    }
  }
  return Status::ok();
}

Status MtpGraphs::capture_heads(const std::vector<int64_t>& buckets) {
  const Set& ext = sets_[static_cast<int>(Family::kExtend)];
  head_logits_ = be_.alloc(DType::kF32, {layout_.max_batch, model_.config().vocab_size});
  for (int64_t B : buckets) {
    HeadGraph h;
    h.batch = B;
    h.rows = be_.upload(Tensor::zeros(DType::kI32, {B}));
    Tensor rows = h.rows, source = ext.hidden, logits = head_logits_.slice_rows(0, B);
    auto body_status = std::make_shared<Status>(Status::ok());
    model::CausalLM* model = &model_;
    backend::Backend* be = &be_;
    auto graph = model_.capture_device_graph(be_, [=]() mutable {
      Tensor picked = be->alloc(source.dtype(), {rows.numel(), source.dim(1)});
      be->gather_rows(source, rows, picked);
      const Status st = model->lm_head_device(picked, logits);
      if (!st.is_ok()) *body_status = st;
    });
    MX_RETURN_IF_ERROR(*body_status);
    if (!graph.is_ok()) return graph.status();
    h.graph = std::move(graph).value();
    heads_.push_back(std::move(h));
  }
  return Status::ok();
}

std::string MtpGraphs::family_of(const model::ForwardBatch& batch, const Tensor& hidden_in, Family* family,
                                 GraphBatchShape* shape, int64_t* index) const {
  std::string why;
  *shape = graph_batch_shape(batch, &why);
  if (!why.empty()) return why;
  const int64_t S = shape->seqs, T = shape->rows;
  const bool chain = batch.mtp_step.continues_chain();
  *family = chain ? Family::kChain : shape->tree ? Family::kTree : Family::kExtend;
  const Set& set = sets_[static_cast<int>(*family)];
  const std::string name = family_name(*family);
  if (set.graphs.empty()) return "no " + name + " graphs captured";
  if (hidden_in.ndim() != 2 || hidden_in.dim(0) != T || hidden_in.dim(1) != model_.config().d_model ||
      hidden_in.dtype() != be_.activation_dtype())
    return name + " step with hidden_in " + hidden_in.describe();
  if (*family == Family::kExtend) {
    if (static_cast<int64_t>(batch.logit_rows.size()) > S) return "an extend with more logit rows than sequences";
  } else {
    if (chain && (static_cast<int64_t>(batch.mtp_step.first_step_rows.size()) != T || shape->max_rows != 1))
      return "a chain continuation with other than one row per sequence";
    if (static_cast<int64_t>(batch.logit_rows.size()) != T) return name + " step where not every row is a logit row";
    for (int64_t r = 0; r < T; ++r)
      if (batch.logit_rows[r] != r) return name + " step with logit rows out of row order";
  }
  *index = pick_graph(set.keys, *shape);
  if (*index < 0)
    return name + " step of " + std::to_string(S) + " sequences x up to " + std::to_string(shape->max_rows) +
           " rows at context " + std::to_string(shape->max_kv) + " is outside every captured bucket";
  return std::string();
}

bool MtpGraphs::covers(const model::ForwardBatch& batch, const Tensor& hidden_in, std::string* why) const {
  Family f;
  GraphBatchShape shape;
  int64_t index = -1;
  std::string reason = family_of(batch, hidden_in, &f, &shape, &index);
  if (reason.empty()) return true;
  if (why != nullptr) *why = std::move(reason);
  return false;
}

Result<model::ForwardOutput> MtpGraphs::run(const model::ForwardBatch& batch, const Tensor& hidden_in) {
  Family f;
  GraphBatchShape shape;
  int64_t index = -1;
  const std::string why = family_of(batch, hidden_in, &f, &shape, &index);
  if (!why.empty()) return internal_error("MTP graphs: " + why + " (covers() was not asked)");
  Set& set = sets_[static_cast<int>(f)];
  const Graph& g = set.graphs[index];
  kvcache::BlockTableStore* store = kv_.block_tables();
  for (const auto& x : batch.seqs) MX_RETURN_IF_ERROR(store->sync(x.table_row, x.table_lease, x.blocks()));
  const int64_t cap = g.key.batch * g.key.q, T = shape.rows, bs = layout_.block_size;
  const bool tree = f == Family::kTree;
  const int fields = fields_of(f), n_rows = fields + extra_rows_of(f);
  host_.resize(n_rows * cap);
  host_mask_.resize(cap);
  stage_graph_rows(batch, cap, bs, GraphPadding{layout_.scratch_row, static_cast<int32_t>(layout_.scratch_block * bs)},
                   tree, host_.data(), tree ? host_mask_.data() : nullptr);
  if (f == Family::kChain) {
    std::fill(host_.begin() + fields * cap, host_.begin() + (fields + 1) * cap, 0);
    std::copy(batch.mtp_step.first_step_rows.begin(), batch.mtp_step.first_step_rows.end(),
              host_.begin() + fields * cap);
  }
  for (int64_t r = 0; r < cap; ++r) host_[(n_rows - 1) * cap + r] = static_cast<int32_t>(r);
  Tensor inputs = g.inputs;
  be_.write_from_host(inputs, 0, Tensor::view_of(host_.data(), DType::kI32, {n_rows * cap}));
  if (tree) {
    Tensor mask = g.mask;
    be_.write_from_host(mask, 0, Tensor::view_of(host_mask_.data(), DType::kI64, {cap}));
  }
  Tensor dst = set.hidden_in.slice_rows(0, T);
  be_.gather_rows(hidden_in, graph_row_field(inputs, n_rows - 1).slice_rows(0, T), dst);
  if (f == Family::kChain)
    MX_RETURN_IF_ERROR(model_.stage_mtp_chain(batch.mtp_step, graph_row_field(inputs, fields).slice_rows(0, T)));
  MX_RETURN_IF_ERROR(model_.replay_device_graph(*g.graph));
  ++replays_[static_cast<int>(f)];
  model::ForwardOutput out;
  if (f == Family::kExtend) {
    MX_RETURN_IF_ERROR(model_.commit_mtp_extend(T));
    const int64_t n_logits = static_cast<int64_t>(batch.logit_rows.size());
    if (n_logits > 0) {
      const HeadGraph* head = nullptr;
      for (const HeadGraph& h : heads_)
        if (h.batch >= n_logits) {
          head = &h;
          break;
        }
      if (head == nullptr) return internal_error("MTP graphs: no extend head for " + std::to_string(n_logits) + " rows");
      host_head_ = padded_logit_rows(batch.logit_rows, head->batch);
      Tensor head_rows = head->rows;
      be_.write_from_host(head_rows, 0, Tensor::view_of(host_head_.data(), DType::kI32, {head->batch}));
      MX_RETURN_IF_ERROR(model_.replay_device_graph(*head->graph));
      out.logits = head_logits_.slice_rows(0, n_logits);
    }
  } else {
    out.logits = set.logits.slice_rows(0, T);
  }
  if (batch.want_hidden) out.hidden = set.hidden.slice_rows(0, T);
  return out;
}

}  // namespace mxserve::runtime
