#include "runtime/decode_graphs.h"

#include <algorithm>
#include <chrono>
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
  const int64_t max_context = store->max_blocks_per_seq() * layout_.block_size;
  const auto t0 = std::chrono::steady_clock::now();
  logits_ = be_.alloc(DType::kF32, {layout_.max_batch, model_.config().vocab_size});
  const std::vector<int64_t> buckets = decode_graph_buckets(layout_.max_batch);
  const std::vector<int64_t> contexts = decode_graph_contexts(max_context);
  const int64_t bs = layout_.block_size;
  const int32_t scratch_slot = static_cast<int32_t>(layout_.scratch_block * bs);
  for (int64_t B : buckets) {
    // Every row padded while capturing: the warm-up run writes and reads only the scratch slot.
    std::vector<int32_t> host(kFields * B, 0);
    std::fill(host.begin() + kTableRows * B, host.begin() + (kTableRows + 1) * B, layout_.scratch_row);
    std::fill(host.begin() + kSlots * B, host.end(), scratch_slot);
    for (int64_t C : contexts) {
      Graph g;
      g.batch = B;
      g.context = C;
      g.inputs = be_.alloc(DType::kI32, {kFields, B});
      be_.write_from_host(g.inputs, 0, Tensor::view_of(host.data(), DType::kI32, {kFields * B}));
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
      meta.params.n_leading_decode_rows = static_cast<int32_t>(B);  // one plain decode row per sequence
      Tensor ids = field(g.inputs, kIds), positions = field(g.inputs, kPositions);
      Tensor logits = logits_.slice_rows(0, B);
      Status body_status = Status::ok();
      auto graph = be_.capture_graph([&] {
        const Status st = model_.forward_device(ids, positions, meta, kv_, logits);
        if (!st.is_ok()) body_status = st;
      });
      MX_RETURN_IF_ERROR(body_status);
      if (!graph.is_ok()) return graph.status();
      g.graph = std::move(graph).value();
      graphs_.push_back(std::move(g));
    }
  }
  be_.synchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ostringstream b, c;
  for (int64_t x : buckets) b << (b.tellp() > 0 ? "," : "") << x;
  for (int64_t x : contexts) c << (c.tellp() > 0 ? "," : "") << x;
  MX_LOG(kInfo) << "CUDA graphs: captured " << graphs_.size() << " decode graphs in " << secs
                << " s; batch buckets " << b.str() << "; context classes " << c.str()
                << " (--disable-cuda-graph / --enforce-eager turn them off)";
  return Status::ok();
}

bool DecodeGraphs::covers(const model::ForwardBatch& batch) const {
  const int64_t S = static_cast<int64_t>(batch.seqs.size());
  if (graphs_.empty() || batch.want_hidden || S == 0 || S > layout_.max_batch || batch.n_tokens() != S) return false;
  if (static_cast<int64_t>(batch.logit_rows.size()) != S) return false;
  int64_t max_kv = 0;
  for (int64_t s = 0; s < S; ++s) {
    const auto& q = batch.seqs[s];
    if (q.n_tokens != 1 || q.table_row < 0 || !q.kv_indices.empty() || !q.tree_mask.empty() ||
        batch.logit_rows[s] != s)
      return false;
    max_kv = std::max<int64_t>(max_kv, q.kv_len);
  }
  return max_kv <= graphs_.back().context;
}

const DecodeGraphs::Graph* DecodeGraphs::find(int64_t batch, int64_t context) const {
  for (const Graph& g : graphs_)  // ascending (batch, context): the first fit is the smallest
    if (g.batch >= batch && g.context >= context) return &g;
  return nullptr;
}

Result<model::ForwardOutput> DecodeGraphs::run(const model::ForwardBatch& batch) {
  const int64_t S = static_cast<int64_t>(batch.seqs.size());
  int64_t max_kv = 0;
  for (const auto& q : batch.seqs) max_kv = std::max<int64_t>(max_kv, q.kv_len);
  const Graph* g = find(S, max_kv);
  if (g == nullptr) return internal_error("decode graphs: no graph for " + std::to_string(S) + " rows at context " +
                                          std::to_string(max_kv) + " (covers() was not asked)");
  kvcache::BlockTableStore* store = kv_.block_tables();
  const int64_t B = g->batch, bs = layout_.block_size;
  host_.assign(kFields * B, 0);
  std::fill(host_.begin() + kTableRows * B, host_.begin() + (kTableRows + 1) * B, layout_.scratch_row);
  std::fill(host_.begin() + kSlots * B, host_.end(), static_cast<int32_t>(layout_.scratch_block * bs));
  for (int64_t s = 0; s < S; ++s) {
    const auto& q = batch.seqs[s];
    MX_RETURN_IF_ERROR(store->sync(q.table_row, q.table_lease, q.blocks()));
    const int32_t j = q.kv_len - 1;
    host_[kIds * B + s] = batch.token_ids[s];
    host_[kPositions * B + s] = batch.positions[s];
    host_[kTableRows * B + s] = q.table_row;
    host_[kKvIndex * B + s] = j;
    host_[kSlots * B + s] = static_cast<int32_t>(q.blocks()[j / bs] * bs + j % bs);
  }
  Tensor inputs = g->inputs;
  be_.write_from_host(inputs, 0, Tensor::view_of(host_.data(), DType::kI32, {kFields * B}));
  g->graph->replay();
  ++replays_;
  model::ForwardOutput out;
  out.logits = logits_.slice_rows(0, S);
  return out;
}

}  // namespace mxserve::runtime
