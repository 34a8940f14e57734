#include "runtime/decode_graphs.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <sstream>

#include "core/check.h"
#include "core/logging.h"

namespace mxserve::runtime {
namespace {

constexpr int kFields = 5;  // rows of a graph's input buffer
enum Field { kIds = 0, kPositions, kTableRows, kKvIndex, kSlots };

Tensor field(const Tensor& inputs, Field f) { return inputs.slice_rows(f, f + 1).reshape({inputs.dim(1)}); }

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
  const int64_t max_context = store->max_blocks_per_seq() * layout_.block_size;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t max_rows = layout_.max_batch * (1 + layout_.max_drafts);
  logits_ = be_.alloc(DType::kF32, {max_rows, model_.config().vocab_size});
  hidden_ = be_.alloc(be_.activation_dtype(), {max_rows, model_.config().d_model});
  const std::vector<int64_t> buckets = decode_graph_buckets(layout_.max_batch);
  const std::vector<int64_t> contexts = decode_graph_contexts(max_context);
  const int64_t bs = layout_.block_size;
  const int32_t scratch_slot = static_cast<int32_t>(layout_.scratch_block * bs);
  for (int64_t q = 1; q <= 1 + layout_.max_drafts; ++q) {
    for (int64_t B : buckets) {
      const int64_t T = B * q;
      // Every row padded while capturing: the warm-up run writes and reads only the scratch slot.
      std::vector<int32_t> host(kFields * T, 0);
      std::fill(host.begin() + kTableRows * T, host.begin() + (kTableRows + 1) * T, layout_.scratch_row);
      std::fill(host.begin() + kSlots * T, host.end(), scratch_slot);
      for (int64_t C : contexts) {
        Graph g;
        g.batch = B;
        g.q = q;
        g.context = C;
        g.inputs = be_.alloc(DType::kI32, {kFields, T});
        be_.write_from_host(g.inputs, 0, Tensor::view_of(host.data(), DType::kI32, {kFields * T}));
        backend::AttentionMeta meta;
        meta.token_seq = field(g.inputs, kTableRows);
        meta.kv_index = field(g.inputs, kKvIndex);
        meta.slot_mapping = field(g.inputs, kSlots);
        meta.block_tables = store->device();
        meta.params.n_tokens = static_cast<int32_t>(T);
        meta.params.n_seqs = static_cast<int32_t>(B);
        meta.params.block_size = static_cast<int32_t>(bs);
        meta.params.max_blocks_per_seq = static_cast<int32_t>(store->max_blocks_per_seq());
        meta.params.max_kv_len = static_cast<int32_t>(C);
        // One plain decode row per sequence (q = 1); verify rows are no plain decode rows (as the eager batch says).
        meta.params.n_leading_decode_rows = q == 1 ? static_cast<int32_t>(B) : 0;
        const auto& mc = model_.config();
        if (q == 1 && B >= 2 && be_.cascade_attention_enabled() && mc.n_kv_heads > 0) {
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
        Tensor ids = field(g.inputs, kIds), positions = field(g.inputs, kPositions);
        Tensor logits = logits_.slice_rows(0, T), hidden = hidden_.slice_rows(0, T);
        // The body holds its inputs by value (views of this object's buffers): a backend may keep it.
        auto body_status = std::make_shared<Status>(Status::ok());
        model::CausalLM* model = &model_;
        kvcache::KvCache* kv = &kv_;
        auto graph = be_.capture_graph([=]() mutable {
          const Status st = model->forward_device(ids, positions, meta, *kv, logits, &hidden);
          if (!st.is_ok()) *body_status = st;
        });
        MX_RETURN_IF_ERROR(*body_status);
        if (!graph.is_ok()) return graph.status();
        g.graph = std::move(graph).value();
        graphs_.push_back(std::move(g));
      }
    }
  }
  be_.synchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ostringstream b, c;
  for (int64_t x : buckets) b << (b.tellp() > 0 ? "," : "") << x;
  for (int64_t x : contexts) c << (c.tellp() > 0 ? "," : "") << x;
  MX_LOG(kInfo) << "CUDA graphs: captured " << graphs_.size() << " decode graphs in " << secs
                << " s; batch buckets " << b.str() << "; context classes " << c.str()
                << (layout_.max_drafts > 0
                        ? "; rows per sequence 1.." + std::to_string(1 + layout_.max_drafts) + " (chain verify steps)"
                        : std::string())
                << " (--disable-cuda-graph / --enforce-eager turn them off)";
  return Status::ok();
}

bool DecodeGraphs::covers(const model::ForwardBatch& batch) const {
  const int64_t S = static_cast<int64_t>(batch.seqs.size());
  if (graphs_.empty() || S == 0 || S > layout_.max_batch || batch.n_tokens() % S != 0) return false;
  const int64_t q = batch.n_tokens() / S, T = batch.n_tokens();
  if (q > 1 + layout_.max_drafts || static_cast<int64_t>(batch.logit_rows.size()) != T) return false;
  for (int64_t r = 0; r < T; ++r)
    if (batch.logit_rows[r] != r) return false;
  int64_t max_kv = 0;
  for (int64_t s = 0; s < S; ++s) {
    const auto& x = batch.seqs[s];
    if (x.n_tokens != q || x.token_begin != s * q || x.table_row < 0 || !x.kv_indices.empty() ||
        !x.tree_mask.empty())
      return false;
    max_kv = std::max<int64_t>(max_kv, x.kv_len);
  }
  return max_kv <= graphs_.back().context;
}

const DecodeGraphs::Graph* DecodeGraphs::find(int64_t batch, int64_t q, int64_t context) const {
  for (const Graph& g : graphs_)  // ascending (q, batch, context): the first fit is the smallest
    if (g.q == q && g.batch >= batch && g.context >= context) return &g;
  return nullptr;
}

Result<model::ForwardOutput> DecodeGraphs::run(const model::ForwardBatch& batch) {
  const int64_t S = static_cast<int64_t>(batch.seqs.size());
  const int64_t q = S > 0 ? batch.n_tokens() / S : 0;
  int64_t max_kv = 0;
  for (const auto& x : batch.seqs) max_kv = std::max<int64_t>(max_kv, x.kv_len);
  const Graph* g = find(S, q, max_kv);
  if (g == nullptr)
    return internal_error("decode graphs: no graph for " + std::to_string(S) + " sequences x " + std::to_string(q) +
                          " rows at context " + std::to_string(max_kv) + " (covers() was not asked)");
  kvcache::BlockTableStore* store = kv_.block_tables();
  const int64_t T = g->batch * q, bs = layout_.block_size;
  host_.assign(kFields * T, 0);
  std::fill(host_.begin() + kTableRows * T, host_.begin() + (kTableRows + 1) * T, layout_.scratch_row);
  std::fill(host_.begin() + kSlots * T, host_.end(), static_cast<int32_t>(layout_.scratch_block * bs));
  for (int64_t s = 0; s < S; ++s) {
    const auto& x = batch.seqs[s];
    MX_RETURN_IF_ERROR(store->sync(x.table_row, x.table_lease, x.blocks()));
    for (int32_t i = 0; i < x.n_tokens; ++i) {
      const int64_t r = x.token_begin + i;
      const int32_t j = x.kv_index_of(i);
      host_[kIds * T + r] = batch.token_ids[r];
      host_[kPositions * T + r] = batch.positions[r];
      host_[kTableRows * T + r] = x.table_row;
      host_[kKvIndex * T + r] = j;
      host_[kSlots * T + r] = static_cast<int32_t>(x.blocks()[j / bs] * bs + j % bs);
    }
  }
  Tensor inputs = g->inputs;
  be_.write_from_host(inputs, 0, Tensor::view_of(host_.data(), DType::kI32, {kFields * T}));
  if (g->cascade.numel() > 0) {  // this replay's prefix groups (none that fit: every row's whole context)
    const kernels::CascadeShape& cs = g->cascade_shape;
    cascade_host_.assign(cs.n_ints(), 0);
    const kernels::CascadeLayout layout = model::cascade_groups(batch, static_cast<int32_t>(S), bs);
    // The eager rule (model/forward_batch.cpp): groups only where they save enough K/V reads per layer (bf16
    // bytes, the model's kv heads), so a step computes the same with graphs on and off.
    const auto& mc = model_.config();
    const int64_t bytes_per_key = 2 * mc.n_kv_heads * mc.head_dim * 2;
    const bool pays = !layout.groups.empty() &&
                      kernels::cascade_saved_bytes(layout, static_cast<int32_t>(bs), bytes_per_key) >=
                          be_.cascade_attention_min_saved_bytes();
    if (!pays || !kernels::encode_cascade(layout, static_cast<int32_t>(bs), cs, cascade_host_.data()))
      cascade_host_.assign(cs.n_ints(), 0);
    Tensor cascade = g->cascade;
    be_.write_from_host(cascade, 0, Tensor::view_of(cascade_host_.data(), DType::kI32, {cs.n_ints()}));
  }
  g->graph->replay();
  ++replays_;
  verify_replays_ += q > 1;
  model::ForwardOutput out;
  out.logits = logits_.slice_rows(0, S * q);
  if (batch.want_hidden) out.hidden = hidden_.slice_rows(0, S * q);
  return out;
}

}  // namespace mxserve::runtime
