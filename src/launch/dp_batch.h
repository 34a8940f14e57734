// Data-parallel batches (docs/parallel.md "DP"): one ForwardBatch of the shared scheduler split into one
// sub-batch per DP rank, and the DP ranks' outputs put back together in the batch's order.
// A sequence's DP rank is the owner of its KV blocks: the pool's ids split into dp contiguous ranges
// (kvcache::BlockPool::range_begin), and every block of a sequence lies in its rank's range (an error
// naming the sequence otherwise). Sub-batches keep the batch's sequence order; their rows are renumbered
// from 0 and logit rows mapped to the new rows.
// Invariant: merge_rows(take_rows(x, rows[r]) for each r) == x: every row lands in exactly one part.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/forward_batch.h"

namespace mxserve::launch {

struct DpSplit {
  std::vector<model::ForwardBatch> parts;         // one per DP rank (possibly empty)
  std::vector<std::vector<int32_t>> rows;         // parts[r] row i is the batch's row rows[r][i]
  std::vector<std::vector<int32_t>> logit_index;  // parts[r] logit row j is the batch's logit row logit_index[r][j]
};

// The DP rank owning block `block` of a pool of n_blocks split into dp ranges.
int dp_rank_of_block(int32_t block, int64_t n_blocks, int dp);

Result<DpSplit> split_by_dp_rank(const model::ForwardBatch& batch, int dp, int64_t n_blocks);

// Host tensors [n, ...]: the rows `rows` of x, as a new tensor [rows.size(), ...].
Tensor take_rows(const Tensor& x, const std::vector<int32_t>& rows);
// parts[r] [rows[r].size(), ...] (undefined when empty) scattered into a new [total, ...] tensor at rows[r];
// row_shape/dtype from the first defined part. Undefined when every part is empty.
Tensor merge_rows(const std::vector<Tensor>& parts, const std::vector<std::vector<int32_t>>& rows, int64_t total);

}  // namespace mxserve::launch
