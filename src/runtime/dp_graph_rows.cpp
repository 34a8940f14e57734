#include "runtime/dp_graph_rows.h"

#include <algorithm>

#include "core/check.h"
#include "kvcache/block_pool.h"

namespace mxserve::runtime {

int dp_group_of_block(int32_t block, int64_t pool_blocks, int dp) {
  int g = static_cast<int>(static_cast<int64_t>(block) * dp / pool_blocks);
  while (g > 0 && block < kvcache::BlockPool::range_begin(pool_blocks, dp, g)) --g;
  while (g + 1 < dp && block >= kvcache::BlockPool::range_begin(pool_blocks, dp, g + 1)) ++g;
  return g;
}

DpGraphRows dp_graph_rows(const model::ForwardBatch& batch, int dp, int64_t pool_blocks, std::string* why) {
  DpGraphRows out;
  why->clear();
  out.dp = dp;
  out.group_seqs.assign(dp, 0);
  out.group_rows.assign(dp, 0);
  if (dp < 1 || pool_blocks < dp) {
    *why = "DP graphs: " + std::to_string(dp) + " groups over a pool of " + std::to_string(pool_blocks) + " blocks";
    return out;
  }
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const model::SequenceSpan& x = batch.seqs[s];
    const std::vector<int32_t>& blocks = x.blocks();
    if (blocks.empty()) {
      *why = "DP graphs: sequence " + std::to_string(s) + " holds no KV block";
      return out;
    }
    for (int32_t b : blocks)
      if (b < 0 || b >= pool_blocks) {
        *why = "DP graphs: sequence " + std::to_string(s) + " holds block " + std::to_string(b) +
               " outside the pool of " + std::to_string(pool_blocks);
        return out;
      }
    const int g = dp_group_of_block(blocks.front(), pool_blocks, dp);
    for (int32_t b : blocks)
      if (dp_group_of_block(b, pool_blocks, dp) != g) {
        *why = "DP graphs: sequence " + std::to_string(s) + " holds blocks of DP ranks " + std::to_string(g) +
               " and " + std::to_string(dp_group_of_block(b, pool_blocks, dp));
        return out;
      }
    out.seq_group.push_back(g);
    out.group_seqs[g] += 1;
    out.group_rows[g] += x.n_tokens;
    out.bucket.max_rows = std::max<int64_t>(out.bucket.max_rows, x.n_tokens);
    out.bucket.max_kv = std::max<int64_t>(out.bucket.max_kv, x.kv_len);
    out.bucket.tree = out.bucket.tree || !x.tree_mask.empty();
  }
  out.bucket.seqs = *std::max_element(out.group_seqs.begin(), out.group_seqs.end());
  out.bucket.rows = *std::max_element(out.group_rows.begin(), out.group_rows.end());
  return out;
}

void stage_dp_graph_rows(const model::ForwardBatch& batch, const DpGraphRows& groups, int64_t cap,
                         int64_t block_size, const GraphPadding& pad, bool tree_base_row, int32_t* host,
                         int64_t* mask, std::vector<int32_t>* row_slot) {
  const int dp = groups.dp;
  const int64_t capacity = dp * cap;
  MX_CHECK_MSG(groups.seq_group.size() == batch.seqs.size(),
               "DP graph staging: groups of " << groups.seq_group.size() << " sequences for a batch of "
                                              << batch.seqs.size());
  const model::ForwardBatch padding_only;
  stage_graph_rows(padding_only, capacity, block_size, pad, tree_base_row, host, mask);  // every slot padding
  row_slot->assign(static_cast<size_t>(batch.n_tokens()), -1);
  std::vector<int64_t> next(dp);
  for (int g = 0; g < dp; ++g) next[g] = g * cap;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const model::SequenceSpan& x = batch.seqs[s];
    const int g = groups.seq_group[s];
    MX_CHECK_MSG(next[g] + x.n_tokens <= (g + 1) * cap,
                 "DP graph staging: DP group " << g << " holds more than the bucket's " << cap << " rows");
    stage_graph_sequence(batch, x, next[g], capacity, block_size, tree_base_row, host, mask);
    for (int32_t i = 0; i < x.n_tokens; ++i) (*row_slot)[x.token_begin + i] = static_cast<int32_t>(next[g] + i);
    next[g] += x.n_tokens;
  }
}

}  // namespace mxserve::runtime
