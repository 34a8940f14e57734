#include "model/forward_batch.h"

#include <algorithm>
#include <limits>

namespace mxserve::model {

Status MtpStep::validate(int64_t n_tokens, int64_t first_step_n_rows) const {
  if (static_cast<int64_t>(first_step_rows.size()) != n_tokens)
    return invalid_argument("forward_mtp: mtp_first_step_rows has " + std::to_string(first_step_rows.size()) +
                            " rows for " + std::to_string(n_tokens) + " tokens");
  for (int32_t r : first_step_rows)
    if (r < 0 || r >= first_step_n_rows)
      return invalid_argument("forward_mtp: mtp_first_step_rows names row " + std::to_string(r) +
                              " of a first draft step with " + std::to_string(first_step_n_rows) + " rows");
  return Status::ok();
}

Status ForwardBatch::validate(int64_t vocab_size, int64_t n_blocks, int64_t block_size) const {
  const int64_t T = n_tokens();
  if (T == 0) return invalid_argument("forward batch: no tokens");
  if (static_cast<int64_t>(positions.size()) != T)
    return invalid_argument("forward batch: " + std::to_string(positions.size()) + " positions for " +
                            std::to_string(T) + " tokens");
  for (int64_t t = 0; t < T; ++t) {
    if (token_ids[t] < 0 || token_ids[t] >= vocab_size)
      return invalid_argument("forward batch: token id " + std::to_string(token_ids[t]) + " at row " +
                              std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    if (positions[t] < 0) return invalid_argument("forward batch: negative position at row " + std::to_string(t));
  }
  int32_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto& q = seqs[s];
    const std::string where = "forward batch: sequence " + std::to_string(s);
    if (q.token_begin != next || q.n_tokens <= 0)
      return invalid_argument(where + ": rows must be contiguous and non-empty");
    if (q.kv_len < q.n_tokens) return invalid_argument(where + ": kv_len " + std::to_string(q.kv_len) + " < rows");
    if (!q.kv_indices.empty()) {
      if (static_cast<int32_t>(q.kv_indices.size()) != q.n_tokens)
        return invalid_argument(where + ": " + std::to_string(q.kv_indices.size()) + " kv_indices for " +
                                std::to_string(q.n_tokens) + " rows");
      for (int32_t j : q.kv_indices)
        if (j < 0 || j >= q.kv_len)
          return invalid_argument(where + ": kv index " + std::to_string(j) + " outside [0, kv_len " +
                                  std::to_string(q.kv_len) + ")");
    }
    if (!q.tree_mask.empty()) {
      if (static_cast<int32_t>(q.tree_mask.size()) != q.n_tokens)
        return invalid_argument(where + ": " + std::to_string(q.tree_mask.size()) + " tree masks for " +
                                std::to_string(q.n_tokens) + " rows");
      for (int32_t i = 0; i < q.n_tokens; ++i) {
        const int32_t j = q.kv_index_of(i);
        if (j < q.tree_base) {
          if (q.tree_mask[i] != 0)
            return invalid_argument(where + ": row " + std::to_string(i) + " before tree_base has a tree mask");
          continue;
        }
        const int32_t bit = j - q.tree_base;
        if (bit >= 64 || ((q.tree_mask[i] >> bit) & 1u) == 0 || (bit < 63 && (q.tree_mask[i] >> (bit + 1)) != 0))
          return invalid_argument(where + ": tree row " + std::to_string(i) + " (kv index " + std::to_string(j) +
                                  ", tree_base " + std::to_string(q.tree_base) +
                                  ") must have its own bit set, none after it, and lie within 64 of tree_base");
      }
    }
    const std::vector<int32_t>& table = q.blocks();
    const int64_t need = (q.kv_len + block_size - 1) / block_size;
    if (static_cast<int64_t>(table.size()) < need)
      return invalid_argument(where + ": " + std::to_string(table.size()) + " blocks cannot hold " +
                              std::to_string(q.kv_len) + " tokens");
    if (q.host_table != nullptr) {
      if (q.table_row < 0) return invalid_argument(where + ": a host table without a block-table row");
      for (int32_t i = 0; i < q.n_tokens; ++i) {  // the blocks this batch writes
        const int32_t b = table[q.kv_index_of(i) / block_size];
        if (b < 0 || b >= n_blocks) return invalid_argument(where + ": block id " + std::to_string(b) + " out of range");
      }
    } else {
      if (q.table_row >= 0) return invalid_argument(where + ": a block-table row without its host table");
      for (int32_t b : table)
        if (b < 0 || b >= n_blocks) return invalid_argument(where + ": block id " + std::to_string(b) + " out of range");
    }
    next += q.n_tokens;
  }
  if (next != T) return invalid_argument("forward batch: sequences cover " + std::to_string(next) + " of " +
                                         std::to_string(T) + " rows");
  for (int32_t r : logit_rows)
    if (r < 0 || r >= T) return invalid_argument("forward batch: logit row " + std::to_string(r) + " out of range");
  return Status::ok();
}

int32_t leading_decode_rows(const ForwardBatch& batch) {
  int32_t n = 0;
  for (const auto& q : batch.seqs) {
    if (q.n_tokens != 1 || !q.tree_mask.empty()) break;
    ++n;
  }
  return n;
}

kernels::CascadeLayout cascade_groups(const ForwardBatch& batch, int32_t n_rows, int64_t block_size,
                                      const kernels::CascadeGroupOptions& options) {
  std::vector<const int32_t*> tables;
  std::vector<int32_t> n_blocks, kv_index;
  for (int32_t r = 0; r < n_rows; ++r) {
    const SequenceSpan& q = batch.seqs[r];
    tables.push_back(q.blocks().data());
    n_blocks.push_back(static_cast<int32_t>(q.blocks().size()));
    kv_index.push_back(q.kv_index_of(0));
  }
  return kernels::find_cascade_groups(tables, n_blocks, kv_index, static_cast<int32_t>(block_size), options);
}

bool cascade_shape_served(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  return n_kv_heads > 0 && n_heads % n_kv_heads == 0 && head_dim <= 128 && n_heads / n_kv_heads <= 16;
}

int64_t cascade_saved_kv_bytes(const kernels::CascadeLayout& layout, int64_t block_size, int64_t n_kv_heads,
                               int64_t head_dim) {
  if (layout.groups.empty()) return 0;
  const int64_t bytes_per_key = 2 * n_kv_heads * head_dim * 2;  // K + V, bf16
  return kernels::cascade_saved_bytes(layout, static_cast<int32_t>(block_size), bytes_per_key);
}

bool cascade_pays(const kernels::CascadeLayout& layout, int64_t block_size, int64_t n_kv_heads, int64_t head_dim,
                  const backend::Backend& be) {
  return !layout.groups.empty() &&
         cascade_saved_kv_bytes(layout, block_size, n_kv_heads, head_dim) >= be.cascade_attention_min_saved_bytes();
}

namespace {

// The eager batch's cascade buffer (exact capacities) when the groups pay; nothing otherwise.
void attach_cascade(const ForwardBatch& batch, backend::Backend& be, int64_t block_size, backend::AttentionMeta& meta) {
  const auto& p = meta.params;
  const int32_t n = p.n_leading_decode_rows;
  if (!be.cascade_attention_enabled() || n < 2 || !cascade_shape_served(p.n_heads, p.n_kv_heads, p.head_dim)) return;
  const kernels::CascadeLayout layout = cascade_groups(batch, n, block_size);
  if (!cascade_pays(layout, block_size, p.n_kv_heads, p.head_dim, be)) return;
  kernels::CascadeShape shape;
  shape.cap_rows = n;
  shape.group_size = p.n_heads / p.n_kv_heads;
  int32_t work = 0, max_prefix = 0, max_suffix = 1;
  std::vector<int32_t> prefix(n, 0);
  for (const kernels::CascadeGroup& g : layout.groups) {
    work += (g.n_members * shape.group_size + kernels::kCascadeRowsPerItem - 1) / kernels::kCascadeRowsPerItem;
    const int32_t keys = static_cast<int32_t>(layout.shared_keys(g, static_cast<int32_t>(block_size)));
    max_prefix = std::max(max_prefix, keys);
    for (int32_t i = 0; i < g.n_members; ++i) prefix[layout.members[g.member_begin + i]] = keys;
  }
  for (int32_t r = 0; r < n; ++r) max_suffix = std::max(max_suffix, batch.seqs[r].kv_len - prefix[r]);
  shape.cap_work = work;
  shape.n_work_hint = work;
  shape.max_prefix_keys = max_prefix;
  shape.max_suffix_keys = max_suffix;
  Tensor buf = Tensor::zeros(DType::kI32, {shape.n_ints()});
  if (!kernels::encode_cascade(layout, static_cast<int32_t>(block_size), shape, buf.data<int32_t>())) return;
  meta.cascade = be.upload(buf);
  meta.cascade_shape = shape;
}

}  // namespace

Result<backend::AttentionMeta> build_attention_meta(const ForwardBatch& batch, backend::Backend& be,
                                                    int64_t block_size, const kernels::AttentionParams& shape,
                                                    kvcache::BlockTableStore* store) {
  const int64_t T = batch.n_tokens();
  const int64_t S = static_cast<int64_t>(batch.seqs.size());
  int64_t with_rows = 0, max_kv_len = 1;
  for (const auto& q : batch.seqs) {
    with_rows += q.table_row >= 0;
    max_kv_len = std::max<int64_t>(max_kv_len, q.kv_len);
  }
  const bool use_store = with_rows > 0;
  if (use_store && with_rows != S)
    return invalid_argument("forward batch: " + std::to_string(with_rows) + " of " + std::to_string(S) +
                            " sequences carry block-table rows (all or none)");
  if (use_store && store == nullptr)
    return invalid_argument("forward batch: sequences carry block-table rows but the KV cache has no block-table "
                            "store (KvCache::enable_block_tables)");
  Tensor tables;
  int64_t max_blocks = 1;
  if (use_store) {
    for (const auto& q : batch.seqs) MX_RETURN_IF_ERROR(store->sync(q.table_row, q.table_lease, q.blocks()));
    max_blocks = store->max_blocks_per_seq();
  } else {
    for (const auto& q : batch.seqs) max_blocks = std::max<int64_t>(max_blocks, q.block_table.size());
    tables = Tensor::zeros(DType::kI32, {S, max_blocks});
  }
  Tensor token_seq = Tensor::empty(DType::kI32, {T});
  Tensor kv_index = Tensor::empty(DType::kI32, {T});
  Tensor slots = Tensor::empty(DType::kI32, {T});
  for (int64_t s = 0; s < S; ++s) {
    const auto& q = batch.seqs[s];
    const std::vector<int32_t>& table = q.blocks();
    if (!use_store) std::copy(table.begin(), table.end(), tables.data<int32_t>() + s * max_blocks);
    const int32_t table_row = use_store ? q.table_row : static_cast<int32_t>(s);
    for (int32_t i = 0; i < q.n_tokens; ++i) {
      const int32_t row = q.token_begin + i, j = q.kv_index_of(i);
      token_seq.data<int32_t>()[row] = table_row;
      kv_index.data<int32_t>()[row] = j;
      slots.data<int32_t>()[row] = static_cast<int32_t>(table[j / block_size] * block_size + j % block_size);
    }
  }
  backend::AttentionMeta meta;
  bool tree = false;
  for (const auto& q : batch.seqs) tree = tree || !q.tree_mask.empty();
  if (tree) {  // only batches with a speculative tree pay for the mask
    Tensor mask = Tensor::zeros(DType::kI64, {T});
    Tensor base = Tensor::empty(DType::kI32, {T});
    for (const auto& q : batch.seqs)
      for (int32_t i = 0; i < q.n_tokens; ++i) {
        const int32_t row = q.token_begin + i;
        base.data<int32_t>()[row] = q.tree_mask.empty() ? std::numeric_limits<int32_t>::max() : q.tree_base;
        mask.data<int64_t>()[row] = q.tree_mask.empty() ? 0 : static_cast<int64_t>(q.tree_mask[i]);
      }
    meta.tree_mask = be.upload(mask);
    meta.tree_base = be.upload(base);
  }
  meta.token_seq = be.upload(token_seq);
  meta.kv_index = be.upload(kv_index);
  meta.slot_mapping = be.upload(slots);
  meta.block_tables = use_store ? store->device() : be.upload(tables);
  meta.params = shape;
  meta.params.n_tokens = static_cast<int32_t>(T);
  meta.params.n_seqs = static_cast<int32_t>(S);
  meta.params.block_size = static_cast<int32_t>(block_size);
  meta.params.max_blocks_per_seq = static_cast<int32_t>(max_blocks);
  meta.params.max_kv_len = static_cast<int32_t>(max_kv_len);
  meta.params.n_leading_decode_rows = leading_decode_rows(batch);
  if (tree) {
    meta.params.tree_mask = static_cast<const uint64_t*>(meta.tree_mask.raw());
    meta.params.tree_base = meta.tree_base.data<int32_t>();
  }
  attach_cascade(batch, be, block_size, meta);
  return meta;
}

}  // namespace mxserve::model
