// runtime/graph_rows.h (label cpu): the bucket a decode / verify / MTP graph replay picks for a batch and the
// per-row inputs it stages -- real rows compact in the batch's order, padding rows on the scratch row / slot,
// tree bases and masks only where a sequence has a tree, uneven row counts per sequence (an MTP extend after
// verify steps that accepted different draft counts), and the padded head rows of an extend.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "runtime/graph_rows.h"

namespace mxserve::runtime {
namespace {

constexpr int64_t kBlock = 4;

// A sequence of n rows ending at KV length kv_len on store row `row`, blocks `blocks`.
model::SequenceSpan span(int32_t begin, int32_t n, int32_t kv_len, int32_t row, const std::vector<int32_t>* blocks) {
  model::SequenceSpan s;
  s.token_begin = begin;
  s.n_tokens = n;
  s.kv_len = kv_len;
  s.table_row = row;
  s.table_lease = 1;
  s.host_table = blocks;
  return s;
}

const std::vector<int32_t> kBlocksA = {7, 3, 9};  // KV indices 0..11
const std::vector<int32_t> kBlocksB = {5, 2};     // KV indices 0..7

// An MTP extend after a verify step: sequence A accepted 2 drafts (3 rows at positions 6..8), B none (1 row at 5).
model::ForwardBatch uneven_extend() {
  model::ForwardBatch b;
  b.token_ids = {11, 12, 13, 21};
  b.positions = {6, 7, 8, 5};
  b.seqs.push_back(span(0, 3, 9, 0, &kBlocksA));
  b.seqs.push_back(span(3, 1, 6, 1, &kBlocksB));
  b.logit_rows = {2, 3};
  return b;
}

TEST(GraphRows, ShapeOfUnevenRows) {
  std::string why;
  const GraphBatchShape s = graph_batch_shape(uneven_extend(), &why);
  EXPECT_TRUE(why.empty()) << why;
  EXPECT_EQ(s.seqs, 2);
  EXPECT_EQ(s.max_rows, 3);
  EXPECT_EQ(s.rows, 4);
  EXPECT_EQ(s.max_kv, 9);
  EXPECT_FALSE(s.tree);
}

TEST(GraphRows, ShapeRefusesWhatCannotBeStaged) {
  std::string why;
  model::ForwardBatch b = uneven_extend();
  b.seqs[1].table_row = -1;  // a hand-built batch without a store row
  (void)graph_batch_shape(b, &why);
  EXPECT_NE(why.find("block-table store row"), std::string::npos) << why;
  b = uneven_extend();
  b.seqs[1].token_begin = 4;  // a gap
  (void)graph_batch_shape(b, &why);
  EXPECT_NE(why.find("contiguous"), std::string::npos) << why;
  (void)graph_batch_shape(model::ForwardBatch{}, &why);
  EXPECT_FALSE(why.empty());
}

TEST(GraphRows, PicksTheSmallestFittingBucket) {
  // Keys ascending by (q, batch, context), as the graph sets keep them.
  std::vector<GraphKey> keys;
  for (int64_t q : {1, 2, 3})
    for (int64_t b : {1, 2, 4})
      for (int64_t c : {128, 256}) keys.push_back({b, q, c});
  auto pick = [&](int64_t seqs, int64_t max_rows, int64_t max_kv) {
    GraphBatchShape s;
    s.seqs = seqs, s.max_rows = max_rows, s.max_kv = max_kv, s.rows = seqs * max_rows;
    const int64_t i = pick_graph(keys, s);
    return i < 0 ? GraphKey{-1, -1, -1} : keys[i];
  };
  GraphKey k = pick(2, 3, 9);  // the uneven extend: 2 sequences, up to 3 rows
  EXPECT_EQ(k.q, 3);
  EXPECT_EQ(k.batch, 2);
  EXPECT_EQ(k.context, 128);
  k = pick(3, 1, 200);  // 3 sequences pad to 4; context 200 -> the 256 class
  EXPECT_EQ(k.q, 1);
  EXPECT_EQ(k.batch, 4);
  EXPECT_EQ(k.context, 256);
  EXPECT_EQ(pick(5, 1, 10).batch, -1);   // more sequences than the largest bucket
  EXPECT_EQ(pick(1, 4, 10).batch, -1);   // more rows per sequence than any bucket
  EXPECT_EQ(pick(1, 1, 300).batch, -1);  // past the largest context class
}

TEST(GraphRows, StagesRowsCompactlyAndPadsTheTail) {
  const model::ForwardBatch b = uneven_extend();
  const int64_t cap = 2 * 3;  // bucket (2 sequences, 3 rows)
  const GraphPadding pad{16, 40};
  std::vector<int32_t> host(kGraphRowFields * cap, -7);
  stage_graph_rows(b, cap, kBlock, pad, false, host.data(), nullptr);
  auto at = [&](int f, int64_t r) { return host[f * cap + r]; };
  // Real rows [0, 4) in the batch's order.
  const std::vector<int32_t> ids = {11, 12, 13, 21}, pos = {6, 7, 8, 5}, rows = {0, 0, 0, 1}, kv = {6, 7, 8, 5};
  // Slots from the host tables: A's KV 6, 7 in block 3 (slots 14, 15), KV 8 in block 9 (36); B's KV 5 in block 2 (9).
  const std::vector<int32_t> slots = {14, 15, 36, 9};
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(at(kRowIds, r), ids[r]) << r;
    EXPECT_EQ(at(kRowPositions, r), pos[r]) << r;
    EXPECT_EQ(at(kRowTableRows, r), rows[r]) << r;
    EXPECT_EQ(at(kRowKvIndex, r), kv[r]) << r;
    EXPECT_EQ(at(kRowSlots, r), slots[r]) << r;
  }
  // Padding rows [4, 6): token 0 at position 0, scratch row, KV index 0, scratch slot.
  for (int64_t r = 4; r < cap; ++r) {
    EXPECT_EQ(at(kRowIds, r), 0);
    EXPECT_EQ(at(kRowPositions, r), 0);
    EXPECT_EQ(at(kRowTableRows, r), pad.scratch_row);
    EXPECT_EQ(at(kRowKvIndex, r), 0);
    EXPECT_EQ(at(kRowSlots, r), pad.scratch_slot);
  }
}

TEST(GraphRows, StagesTreeMasksAndBasesOnlyForTreeRows) {
  // A tree verify step: sequence A = x_last (KV 8) + 2 nodes (KV 9, 10; node 1's parent is node 0) with
  // tree_base 9, positions by depth; sequence B decodes plainly (one row, no tree).
  model::ForwardBatch b;
  b.token_ids = {13, 30, 31, 21};
  b.positions = {8, 9, 10, 5};
  b.seqs.push_back(span(0, 3, 11, 0, &kBlocksA));
  b.seqs[0].tree_base = 9;
  b.seqs[0].tree_mask = {0, 0b01, 0b11};
  b.seqs.push_back(span(3, 1, 6, 1, &kBlocksB));
  b.logit_rows = {0, 1, 2, 3};
  std::string why;
  EXPECT_TRUE(graph_batch_shape(b, &why).tree);
  const int64_t cap = 2 * 4;
  std::vector<int32_t> host(kGraphTreeRowFields * cap, -7);
  std::vector<int64_t> mask(cap, -7);
  stage_graph_rows(b, cap, kBlock, GraphPadding{16, 40}, true, host.data(), mask.data());
  const int32_t none = std::numeric_limits<int32_t>::max();
  const std::vector<int32_t> base = {9, 9, 9, none, none, none, none, none};
  const std::vector<int64_t> m = {0, 1, 3, 0, 0, 0, 0, 0};
  for (int64_t r = 0; r < cap; ++r) {
    EXPECT_EQ(host[kRowTreeBase * cap + r], base[r]) << r;
    EXPECT_EQ(mask[r], m[r]) << r;
  }
  EXPECT_EQ(host[kRowKvIndex * cap + 2], 10);
  EXPECT_EQ(host[kRowSlots * cap + 2], 9 * kBlock + 2);
}

TEST(GraphRows, StagesExplicitKvIndices) {
  // A tree draft step: rows at MTP KV slots L + e (explicit kv_indices), not kv_len - n + i.
  model::ForwardBatch b;
  b.token_ids = {30, 31};
  b.positions = {9, 9};
  b.seqs.push_back(span(0, 2, 11, 0, &kBlocksA));
  b.seqs[0].kv_indices = {8, 10};
  b.seqs[0].tree_base = 8;
  b.seqs[0].tree_mask = {0b001, 0b100};
  std::vector<int32_t> host(kGraphTreeRowFields * 2);
  std::vector<int64_t> mask(2);
  stage_graph_rows(b, 2, kBlock, GraphPadding{16, 40}, true, host.data(), mask.data());
  EXPECT_EQ(host[kRowKvIndex * 2 + 0], 8);
  EXPECT_EQ(host[kRowKvIndex * 2 + 1], 10);
  EXPECT_EQ(host[kRowSlots * 2 + 1], 9 * kBlock + 2);
  EXPECT_EQ(mask[1], 0b100);
}

TEST(GraphRows, PadsLogitRows) {
  EXPECT_EQ(padded_logit_rows({2, 3}, 4), (std::vector<int32_t>{2, 3, 0, 0}));
  EXPECT_EQ(padded_logit_rows({}, 2), (std::vector<int32_t>{0, 0}));
}

}  // namespace
}  // namespace mxserve::runtime
