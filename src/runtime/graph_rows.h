// graph_rows: host-side staging shared by the decode / verify / MTP graphs (runtime/decode_graphs.h,
// runtime/mtp_graphs.h): which captured bucket serves a batch, and the per-row inputs of one replay.
// Layout rule (what lets one bucket serve uneven row counts): a batch's rows are staged compactly, in its own
// row order, into rows [0, T) of the bucket's capacity; rows [T, capacity) are padding rows, each a
// one-token sequence on the scratch block-table row (token 0, position 0, KV index 0, the scratch slot; tree
// base INT32_MAX and mask 0 in a tree bucket), which write and read only the scratch slot. Every captured
// kernel reads a row's table row / KV index / slot / tree mask from these device inputs, so rows of one
// sequence need not be a fixed count: a bucket (batch B, rows per sequence q) serves any batch of at most B
// sequences of at most q rows each, and the real rows' outputs are rows [0, T) in the batch's order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/forward_batch.h"

namespace mxserve::runtime {

// Rows of a graph's i32 input buffer [fields, capacity] (tree buckets add the tree base row).
enum GraphRowField : int { kRowIds = 0, kRowPositions, kRowTableRows, kRowKvIndex, kRowSlots, kRowTreeBase };
constexpr int kGraphRowFields = 5;      // a plain bucket's fields
constexpr int kGraphTreeRowFields = 6;  // a tree bucket's (plus the i64 mask buffer [capacity])

// What a batch asks of a bucket.
struct GraphBatchShape {
  int64_t seqs = 0;      // sequences
  int64_t max_rows = 0;  // most rows of one sequence
  int64_t rows = 0;      // rows in all (T)
  int64_t max_kv = 0;    // the largest kv_len (the context class bound)
  bool tree = false;     // some sequence carries a tree mask
};

// The batch's shape when graphs can stage it: sequences contiguous in row order, each with a block-table
// store row and at least one row. Otherwise `why` names what does not fit (empty when it does).
GraphBatchShape graph_batch_shape(const model::ForwardBatch& batch, std::string* why);

// Row f of a graph's i32 input buffer [fields, capacity], as a [capacity] view.
Tensor graph_row_field(const Tensor& inputs, int f);

// The attention metadata a captured bucket (B sequences x q rows, context class C) reads: views of its input
// buffer (table rows, KV indices, slots; tree buckets: the tree base row and `tree_mask` i64 [B q]) and the
// block-table store's device table. One plain decode row per sequence only where q = 1 and not a tree (verify
// rows are no plain decode rows, as the eager batch says).
backend::AttentionMeta graph_attention_meta(const Tensor& inputs, const Tensor& tree_mask,
                                            const kvcache::BlockTableStore& store, int64_t B, int64_t q, int64_t C,
                                            int64_t block_size, bool tree);

// A captured bucket; keys are kept ascending by (q, batch, context).
struct GraphKey {
  int64_t batch = 0;
  int64_t q = 0;  // rows per sequence
  int64_t context = 0;
};
// The first key (the smallest q, then batch, then context class) with q >= max_rows, batch >= seqs and
// context >= max_kv; -1 when none.
int64_t pick_graph(const std::vector<GraphKey>& keys, const GraphBatchShape& shape);

struct GraphPadding {
  int32_t scratch_row = -1;   // block-table store row of padding rows (its column 0: the scratch block)
  int32_t scratch_slot = -1;  // the scratch block's first slot
};

// Writes the batch's rows [0, T) compactly and padding rows [T, capacity) into host (row-major
// [fields, capacity]: ids, positions, table rows, KV indices, slots, and with tree_base_row the tree base);
// mask (i64 [capacity], tree buckets) receives the tree masks (0 for non-tree and padding rows). Slots come
// from each sequence's host block table. Needs capacity >= T (the caller picked the bucket).
void stage_graph_rows(const model::ForwardBatch& batch, int64_t capacity, int64_t block_size,
                      const GraphPadding& pad, bool tree_base_row, int32_t* host, int64_t* mask);

// One sequence's rows (the batch's rows [x.token_begin, + x.n_tokens)) written at slots [first_slot, + n_tokens)
// of a staging buffer laid out as stage_graph_rows's (which calls it with first_slot = x.token_begin; the DP
// staging, runtime/dp_graph_rows.h, with a slot in the sequence's DP group's range). Padding is not touched.
void stage_graph_sequence(const model::ForwardBatch& batch, const model::SequenceSpan& x, int64_t first_slot,
                          int64_t capacity, int64_t block_size, bool tree_base_row, int32_t* host, int64_t* mask);

// logit_rows padded with row 0 to `capacity` entries (an MTP extend's head rows). Needs size <= capacity.
std::vector<int32_t> padded_logit_rows(const std::vector<int32_t>& logit_rows, int64_t capacity);

}  // namespace mxserve::runtime
