#include "runtime/graph_rows.h"

#include <algorithm>
#include <limits>

#include "core/check.h"

namespace mxserve::runtime {

GraphBatchShape graph_batch_shape(const model::ForwardBatch& batch, std::string* why) {
  GraphBatchShape s;
  why->clear();
  s.seqs = static_cast<int64_t>(batch.seqs.size());
  s.rows = batch.n_tokens();
  if (s.seqs == 0 || s.rows == 0) {
    *why = "an empty batch";
    return s;
  }
  int64_t next = 0;
  for (const auto& x : batch.seqs) {
    if (x.n_tokens <= 0 || x.token_begin != next) {
      *why = "sequences not contiguous in row order";
      return s;
    }
    if (x.table_row < 0) {
      *why = "a sequence without a block-table store row";
      return s;
    }
    next += x.n_tokens;
    s.max_rows = std::max<int64_t>(s.max_rows, x.n_tokens);
    s.max_kv = std::max<int64_t>(s.max_kv, x.kv_len);
    s.tree = s.tree || !x.tree_mask.empty();
  }
  if (next != s.rows) *why = "sequences do not cover the batch's rows";
  return s;
}

int64_t pick_graph(const std::vector<GraphKey>& keys, const GraphBatchShape& shape) {
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i].q >= shape.max_rows && keys[i].batch >= shape.seqs && keys[i].context >= shape.max_kv)
      return static_cast<int64_t>(i);
  return -1;
}

void stage_graph_rows(const model::ForwardBatch& batch, int64_t capacity, int64_t block_size,
                      const GraphPadding& pad, bool tree_base_row, int32_t* host, int64_t* mask) {
  const int64_t T = batch.n_tokens();
  MX_CHECK_MSG(T <= capacity, "graph staging: " << T << " rows for a bucket of " << capacity);
  const int fields = tree_base_row ? kGraphTreeRowFields : kGraphRowFields;
  std::fill(host, host + fields * capacity, 0);
  std::fill(host + kRowTableRows * capacity, host + (kRowTableRows + 1) * capacity, pad.scratch_row);
  std::fill(host + kRowSlots * capacity, host + (kRowSlots + 1) * capacity, pad.scratch_slot);
  if (tree_base_row)
    std::fill(host + kRowTreeBase * capacity, host + (kRowTreeBase + 1) * capacity,
              std::numeric_limits<int32_t>::max());
  if (mask != nullptr) std::fill(mask, mask + capacity, int64_t{0});
  for (const auto& x : batch.seqs)
    stage_graph_sequence(batch, x, x.token_begin, capacity, block_size, tree_base_row, host, mask);
}

void stage_graph_sequence(const model::ForwardBatch& batch, const model::SequenceSpan& x, int64_t first_slot,
                          int64_t capacity, int64_t block_size, bool tree_base_row, int32_t* host, int64_t* mask) {
  MX_CHECK_MSG(first_slot >= 0 && first_slot + x.n_tokens <= capacity,
               "graph staging: rows [" << first_slot << ", " << first_slot + x.n_tokens << ") for a bucket of "
                                       << capacity);
  const std::vector<int32_t>& table = x.blocks();
  for (int32_t i = 0; i < x.n_tokens; ++i) {
    const int64_t src = x.token_begin + i, r = first_slot + i;
    const int32_t j = x.kv_index_of(i);
    host[kRowIds * capacity + r] = batch.token_ids[src];
    host[kRowPositions * capacity + r] = batch.positions[src];
    host[kRowTableRows * capacity + r] = x.table_row;
    host[kRowKvIndex * capacity + r] = j;
    host[kRowSlots * capacity + r] = static_cast<int32_t>(table[j / block_size] * block_size + j % block_size);
    if (!x.tree_mask.empty()) {
      if (tree_base_row) host[kRowTreeBase * capacity + r] = x.tree_base;
      if (mask != nullptr) mask[r] = static_cast<int64_t>(x.tree_mask[i]);
    }
  }
}

std::vector<int32_t> padded_logit_rows(const std::vector<int32_t>& logit_rows, int64_t capacity) {
  MX_CHECK_MSG(static_cast<int64_t>(logit_rows.size()) <= capacity,
               "graph staging: " << logit_rows.size() << " logit rows for a head of " << capacity);
  std::vector<int32_t> out(static_cast<size_t>(capacity), 0);
  std::copy(logit_rows.begin(), logit_rows.end(), out.begin());
  return out;
}

Tensor graph_row_field(const Tensor& inputs, int f) {
  return inputs.slice_rows(f, f + 1).reshape({inputs.dim(1)});
}

backend::AttentionMeta graph_attention_meta(const Tensor& inputs, const Tensor& tree_mask,
                                            const kvcache::BlockTableStore& store, int64_t B, int64_t q, int64_t C,
                                            int64_t block_size, bool tree) {
  backend::AttentionMeta meta;
  meta.token_seq = graph_row_field(inputs, kRowTableRows);
  meta.kv_index = graph_row_field(inputs, kRowKvIndex);
  meta.slot_mapping = graph_row_field(inputs, kRowSlots);
  meta.block_tables = store.device();
  meta.params.n_tokens = static_cast<int32_t>(B * q);
  meta.params.n_seqs = static_cast<int32_t>(B);
  meta.params.block_size = static_cast<int32_t>(block_size);
  meta.params.max_blocks_per_seq = static_cast<int32_t>(store.max_blocks_per_seq());
  meta.params.max_kv_len = static_cast<int32_t>(C);
  meta.params.n_leading_decode_rows = q == 1 && !tree ? static_cast<int32_t>(B) : 0;
  if (tree) {  // the masks the kernels read, from the graph's own buffers
    meta.tree_mask = tree_mask;
    meta.tree_base = graph_row_field(inputs, kRowTreeBase);
    meta.params.tree_mask = static_cast<const uint64_t*>(meta.tree_mask.raw());
    meta.params.tree_base = meta.tree_base.data<int32_t>();
  }
  return meta;
}

}  // namespace mxserve::runtime
