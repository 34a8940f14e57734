#include "launch/dp_batch.h"

#include <cstring>

#include "core/check.h"
#include "core/logging.h"
#include "kvcache/block_pool.h"

namespace mxserve::launch {

int dp_rank_of_block(int32_t block, int64_t n_blocks, int dp) {
  int r = static_cast<int>(static_cast<int64_t>(block) * dp / n_blocks);
  while (r > 0 && block < kvcache::BlockPool::range_begin(n_blocks, dp, r)) --r;
  while (r + 1 < dp && block >= kvcache::BlockPool::range_begin(n_blocks, dp, r + 1)) ++r;
  return r;
}

Result<DpSplit> split_by_dp_rank(const model::ForwardBatch& batch, int dp, int64_t n_blocks) {
  DpSplit split;
  split.parts.resize(dp);
  if (batch.mtp_step.continues_chain())  // the rows name the extend batch, not a DP part of it
    MX_WARN_ONCE << "index_share_for_mtp_iteration is not applied under DP attention: every MTP draft step "
                          "recomputes its DSA top-k (exact, only slower drafting)";
  split.rows.resize(dp);
  split.logit_index.resize(dp);
  std::vector<int> row_rank(batch.n_tokens(), -1);
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const model::SequenceSpan& q = batch.seqs[s];
    const std::vector<int32_t>& blocks = q.blocks();
    if (blocks.empty())
      return invalid_argument("DP split: sequence " + std::to_string(s) + " of the batch holds no KV block");
    for (int32_t b : blocks)
      if (b < 0 || b >= n_blocks)
        return invalid_argument("DP split: sequence " + std::to_string(s) + " holds block " + std::to_string(b) +
                                " outside the pool of " + std::to_string(n_blocks));
    const int r = dp_rank_of_block(blocks.front(), n_blocks, dp);
    for (int32_t b : blocks)
      if (dp_rank_of_block(b, n_blocks, dp) != r)
        return invalid_argument("DP split: sequence " + std::to_string(s) + " holds blocks of DP ranks " +
                                std::to_string(r) + " and " + std::to_string(dp_rank_of_block(b, n_blocks, dp)) +
                                " (a sequence's KV lives in one rank's block range)");
    model::ForwardBatch& part = split.parts[r];
    model::SequenceSpan span = q;
    span.token_begin = part.n_tokens();
    for (int32_t i = 0; i < q.n_tokens; ++i) {
      const int32_t row = q.token_begin + i;
      part.token_ids.push_back(batch.token_ids[row]);
      part.positions.push_back(batch.positions[row]);
      split.rows[r].push_back(row);
      row_rank[row] = r;
    }
    part.seqs.push_back(std::move(span));
  }
  for (int r = 0; r < dp; ++r) {
    split.parts[r].want_hidden = batch.want_hidden;
    split.parts[r].want_host_logits = batch.want_host_logits;
  }
  // Logit rows: each to the part holding its row, renumbered to the part's row.
  std::vector<int32_t> local_row(batch.n_tokens(), -1);
  for (int r = 0; r < dp; ++r)
    for (size_t i = 0; i < split.rows[r].size(); ++i) local_row[split.rows[r][i]] = static_cast<int32_t>(i);
  for (size_t j = 0; j < batch.logit_rows.size(); ++j) {
    const int32_t row = batch.logit_rows[j];
    if (row < 0 || row >= batch.n_tokens() || row_rank[row] < 0)
      return invalid_argument("DP split: logit row " + std::to_string(row) + " is in no sequence of the batch");
    split.parts[row_rank[row]].logit_rows.push_back(local_row[row]);
    split.logit_index[row_rank[row]].push_back(static_cast<int32_t>(j));
  }
  return split;
}

namespace {
int64_t row_bytes(const Tensor& t) {
  return t.dim(0) == 0 ? 0 : static_cast<int64_t>(t.nbytes()) / t.dim(0);
}
}  // namespace

Tensor take_rows(const Tensor& x, const std::vector<int32_t>& rows) {
  MX_CHECK(x.is_contiguous() && x.ndim() >= 1);
  Shape shape = x.shape();
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out = Tensor::empty(x.dtype(), shape);
  const int64_t rb = row_bytes(x);
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(static_cast<char*>(out.raw()) + i * rb, static_cast<const char*>(x.raw()) + rows[i] * rb, rb);
  return out;
}

Tensor merge_rows(const std::vector<Tensor>& parts, const std::vector<std::vector<int32_t>>& rows, int64_t total) {
  const Tensor* first = nullptr;
  for (size_t r = 0; r < parts.size(); ++r)
    if (!rows[r].empty()) {
      MX_CHECK_MSG(parts[r].defined() && parts[r].dim(0) == static_cast<int64_t>(rows[r].size()),
                   "DP merge: part " << r << " is " << parts[r].describe() << " for " << rows[r].size() << " rows");
      if (first == nullptr) first = &parts[r];
    }
  if (first == nullptr) return Tensor();
  Shape shape = first->shape();
  shape[0] = total;
  Tensor out = Tensor::empty(first->dtype(), shape);
  const int64_t rb = row_bytes(*first);
  for (size_t r = 0; r < parts.size(); ++r)
    for (size_t i = 0; i < rows[r].size(); ++i)
      std::memcpy(static_cast<char*>(out.raw()) + rows[r][i] * rb,
                  static_cast<const char*>(parts[r].raw()) + i * rb, rb);
  return out;
}

}  // namespace mxserve::launch
