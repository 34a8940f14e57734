// dp_graph_rows: host-side staging of decode / verify graphs under data parallelism (the model's
// CausalLM::device_row_groups() = dp > 1; docs/parallel.md "CUDA graphs under DP").
// Layout rule: a captured DP step of bucket (B sequences x q rows per sequence) holds dp slot ranges of
// cap = B q rows each: range g = [g cap, (g + 1) cap) belongs to DP group g, whose ranks read exactly that slice
// (launch/dp_graph_step.h). A sequence's DP group is the owner of its KV blocks -- the rule of the eager split
// (launch/dp_batch.h): the pool's ids in dp contiguous ranges, kvcache::BlockPool::range_begin. Group g's
// sequences keep the batch's order and are staged compactly from slot g cap; the rest of the range is padding
// rows (graph_rows.h: the scratch row and slot, writing no real KV). So every shape of the graph is static,
// the DP-attention MoE exchange included (each group brings cap rows at every replay).
// The bucket is per group (each slot range holds up to B sequences), not B / dp: placement follows prefix hits
// and free blocks, so a batch's groups are rarely even; with a bucket per group every batch of at most
// max_batch sequences has a bucket however it splits (the coverage of dp 1), at the price of padding the
// lighter groups (a balanced batch of 2n sequences runs the dp x n bucket, as dp 1 runs 2n).
// Outputs: a replay leaves group g's logit / hidden rows at its slots; row_slot maps the batch's row r to its
// slot, and the runtime gathers the rows back into the batch's order after the replay (decode_graphs.cpp).
// Invariant: every row of the batch lands in exactly one slot, inside its group's range, in the batch's order
// within the group (row_slot is injective and ascending per group).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/forward_batch.h"
#include "runtime/graph_rows.h"

namespace mxserve::runtime {

// The DP group owning block `block` of a pool of pool_blocks blocks split into dp ranges.
int dp_group_of_block(int32_t block, int64_t pool_blocks, int dp);

struct DpGraphRows {
  int dp = 1;
  std::vector<int32_t> seq_group;   // batch.seqs[s]'s DP group
  std::vector<int64_t> group_seqs;  // sequences per group [dp]
  std::vector<int64_t> group_rows;  // rows per group [dp]
  // What one slot range must hold: seqs = the most sequences of one group, rows = the most rows of one
  // group, max_rows = the longest sequence, max_kv = the largest kv_len, tree = some sequence has a tree mask.
  GraphBatchShape bucket;
};

// The DP groups of a batch that graph_batch_shape accepts. *why (cleared first) names what a DP graph cannot
// stage: a sequence without blocks, a block outside the pool, or a sequence whose blocks lie in two groups'
// ranges (the eager split refuses those too, naming the sequence).
DpGraphRows dp_graph_rows(const model::ForwardBatch& batch, int dp, int64_t pool_blocks, std::string* why);

// Writes host (row-major [fields, dp cap], as stage_graph_rows) and mask (tree buckets, i64 [dp cap]): group g's
// rows at slots [g cap, g cap + group_rows[g]) in the batch's order, padding rows everywhere else; row_slot
// gets the slot of each of the batch's rows. Needs group_seqs / group_rows within the bucket (the caller
// picked it: bucket.rows <= cap).
void stage_dp_graph_rows(const model::ForwardBatch& batch, const DpGraphRows& groups, int64_t cap,
                         int64_t block_size, const GraphPadding& pad, bool tree_base_row, int32_t* host,
                         int64_t* mask, std::vector<int32_t>* row_slot);

}  // namespace mxserve::runtime
