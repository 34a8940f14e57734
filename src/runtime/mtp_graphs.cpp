#include "runtime/mtp_graphs.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/check.h"
#include "core/logging.h"

namespace mxserve::runtime {
namespace {

constexpr int kFields = 7;  // rows of a graph's input buffer
enum Field { kIds = 0, kPositions, kTableRows, kKvIndex, kSlots, kFirstRows, kIdentity };

Tensor field(const Tensor& inputs, Field f) { return inputs.slice_rows(f, f + 1).reshape({inputs.dim(1)}); }

}  // namespace

MtpGraphs::MtpGraphs(model::CausalLM& model, backend::Backend& be, kvcache::KvCache& kv,
                     const DecodeGraphLayout& layout)
    : model_(model), be_(be), kv_(kv), layout_(layout) {}

Status MtpGraphs::capture() {
  kvcache::BlockTableStore* store = kv_.block_tables();
  if (store == nullptr) return invalid_argument("MTP graphs: the KV cache has no block-table store");
  if (!model_.has_mtp()) return invalid_argument("MTP graphs: the model has no MTP layer");
  if (layout_.scratch_row < 0 || layout_.scratch_row >= store->max_rows() || layout_.scratch_block < 0)
    return invalid_argument("MTP graphs: scratch row " + std::to_string(layout_.scratch_row) + " / block " +
                            std::to_string(layout_.scratch_block));
  const int64_t max_context = store->max_blocks_per_seq() * layout_.block_size;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t H = model_.config().d_model;
  MX_RETURN_IF_ERROR(model_.reserve_mtp_chain(layout_.max_batch));
  logits_ = be_.alloc(DType::kF32, {layout_.max_batch, model_.config().vocab_size});
  hidden_ = be_.alloc(be_.activation_dtype(), {layout_.max_batch, H});
  const std::vector<int64_t> buckets = decode_graph_buckets(layout_.max_batch);
  const std::vector<int64_t> contexts = decode_graph_contexts(max_context);
  const int64_t bs = layout_.block_size;
  const int32_t scratch_slot = static_cast<int32_t>(layout_.scratch_block * bs);
  for (int64_t B : buckets) {
    std::vector<int32_t> host(kFields * B, 0);  // every row padded while capturing (scratch slot only)
    std::fill(host.begin() + kTableRows * B, host.begin() + (kTableRows + 1) * B, layout_.scratch_row);
    std::fill(host.begin() + kSlots * B, host.begin() + (kSlots + 1) * B, scratch_slot);
    for (int64_t r = 0; r < B; ++r) host[kIdentity * B + r] = static_cast<int32_t>(r);
    // Finite padded rows: zeros until a replay's real rows leave theirs behind.
    const Tensor zeros = Tensor::zeros(be_.activation_dtype(), {B, H});
    for (int64_t C : contexts) {
      Graph g;
      g.batch = B;
      g.context = C;
      g.inputs = be_.alloc(DType::kI32, {kFields, B});
      be_.write_from_host(g.inputs, 0, Tensor::view_of(host.data(), DType::kI32, {kFields * B}));
      g.hidden_in = be_.upload(zeros);
      backend::AttentionMeta meta;
      meta.token_seq = field(g.inputs, kTableRows);
      meta.kv_index = field(g.inputs, kKvIndex);
      meta.slot_mapping = field(g.inputs, kSlots);
      meta.block_tables = store->device();
      meta.params.n_tokens = static_cast<int32_t>(B);
      meta.params.n_seqs = static_cast<int32_t>(B);
      meta.params.block_size = static_cast<int32_t>(bs);
      meta.params.max_blocks_per_seq = static_cast<int32_t>(store->max_blocks_per_seq());
      meta.params.max_kv_len = static_cast<int32_t>(C);
      meta.params.n_leading_decode_rows = static_cast<int32_t>(B);  // one plain row per sequence
      Tensor ids = field(g.inputs, kIds), positions = field(g.inputs, kPositions);
      Tensor logits = logits_.slice_rows(0, B), hidden = hidden_.slice_rows(0, B);
      Tensor hidden_in = g.hidden_in;
      // The body holds its inputs by value (views of this object's buffers): a backend may keep it.
      auto body_status = std::make_shared<Status>(Status::ok());
      model::CausalLM* model = &model_;
      kvcache::KvCache* kv = &kv_;
      auto graph = be_.capture_graph([=]() mutable {
        const Status st = model->forward_mtp_device(ids, positions, hidden_in, meta, *kv, logits, hidden);
        if (!st.is_ok()) *body_status = st;
      });
      MX_RETURN_IF_ERROR(*body_status);
      if (!graph.is_ok()) return graph.status();
      g.graph = std::move(graph).value();
      graphs_.push_back(std::move(g));
    }
  }
  be_.synchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MX_LOG(kInfo) << "CUDA graphs: captured " << graphs_.size() << " MTP draft-chain graphs (continuation steps) in "
                << secs << " s; the MTP extend (first draft step) and tree drafts run eagerly";
  return Status::ok();
}

bool MtpGraphs::covers(const model::ForwardBatch& batch, const Tensor& hidden_in) const {
  const int64_t S = static_cast<int64_t>(batch.seqs.size());
  if (graphs_.empty() || S == 0 || S > layout_.max_batch || batch.n_tokens() != S) return false;
  if (static_cast<int64_t>(batch.mtp_step.first_step_rows.size()) != S) return false;  // a chain continuation
  if (static_cast<int64_t>(batch.logit_rows.size()) != S) return false;
  if (hidden_in.ndim() != 2 || hidden_in.dim(0) != S || hidden_in.dim(1) != model_.config().d_model ||
      hidden_in.dtype() != be_.activation_dtype())
    return false;
  int64_t max_kv = 0;
  for (int64_t s = 0; s < S; ++s) {
    const auto& x = batch.seqs[s];
    if (x.n_tokens != 1 || x.token_begin != s || x.table_row < 0 || !x.kv_indices.empty() || !x.tree_mask.empty() ||
        batch.logit_rows[s] != s)
      return false;
    max_kv = std::max<int64_t>(max_kv, x.kv_len);
  }
  return max_kv <= graphs_.back().context;
}

const MtpGraphs::Graph* MtpGraphs::find(int64_t batch, int64_t context) const {
  for (const Graph& g : graphs_)  // ascending (batch, context): the first fit is the smallest
    if (g.batch >= batch && g.context >= context) return &g;
  return nullptr;
}

Result<model::ForwardOutput> MtpGraphs::run(const model::ForwardBatch& batch, const Tensor& hidden_in) {
  const int64_t S = static_cast<int64_t>(batch.seqs.size());
  int64_t max_kv = 0;
  for (const auto& x : batch.seqs) max_kv = std::max<int64_t>(max_kv, x.kv_len);
  const Graph* g = find(S, max_kv);
  if (g == nullptr) return internal_error("MTP graphs: no graph for " + std::to_string(S) + " rows at context " +
                                          std::to_string(max_kv) + " (covers() was not asked)");
  kvcache::BlockTableStore* store = kv_.block_tables();
  const int64_t B = g->batch, bs = layout_.block_size;
  host_.assign(kFields * B, 0);
  std::fill(host_.begin() + kTableRows * B, host_.begin() + (kTableRows + 1) * B, layout_.scratch_row);
  std::fill(host_.begin() + kSlots * B, host_.begin() + (kSlots + 1) * B,
            static_cast<int32_t>(layout_.scratch_block * bs));
  for (int64_t r = 0; r < B; ++r) host_[kIdentity * B + r] = static_cast<int32_t>(r);
  for (int64_t s = 0; s < S; ++s) {
    const auto& x = batch.seqs[s];
    MX_RETURN_IF_ERROR(store->sync(x.table_row, x.table_lease, x.blocks()));
    const int32_t j = x.kv_len - 1;
    host_[kIds * B + s] = batch.token_ids[s];
    host_[kPositions * B + s] = batch.positions[s];
    host_[kTableRows * B + s] = x.table_row;
    host_[kKvIndex * B + s] = j;
    host_[kSlots * B + s] = static_cast<int32_t>(x.blocks()[j / bs] * bs + j % bs);
    host_[kFirstRows * B + s] = batch.mtp_step.first_step_rows[s];
  }
  Tensor inputs = g->inputs;
  be_.write_from_host(inputs, 0, Tensor::view_of(host_.data(), DType::kI32, {kFields * B}));
  Tensor dst = g->hidden_in.slice_rows(0, S);
  be_.gather_rows(hidden_in, field(inputs, kIdentity).slice_rows(0, S), dst);
  MX_RETURN_IF_ERROR(model_.stage_mtp_chain(batch.mtp_step, field(inputs, kFirstRows).slice_rows(0, S)));
  g->graph->replay();
  ++replays_;
  model::ForwardOutput out;
  out.logits = logits_.slice_rows(0, S);
  if (batch.want_hidden) out.hidden = hidden_.slice_rows(0, S);
  return out;
}

}  // namespace mxserve::runtime
