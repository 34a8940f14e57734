// CUDA graphs under data parallelism, the host side on the CPU (docs/parallel.md "CUDA graphs under DP"):
//   - runtime/dp_graph_rows.h: a sequence's DP group is the eager split's (launch/dp_batch.h), each group's
//     slot range holds exactly what stage_graph_rows stages for the eager split's part, row_slot maps every
//     row to its part's row, the bucket is the fullest group's, sequences across ranges are refused;
//   - launch/dp_graph_step.h: a group's view slices every row field, divides the sizes, points the tree
//     pointers at its range, and refuses steps that do not split (or carry a cascade buffer);
//   - end to end on the CPU ranks (what the joined capture runs on each rank): DP attention (dp 2, tp 2 x dp 2)
//     on glm4_moe_tiny_a and glm_moe_dsa_tiny_a, a decode step with uneven groups staged into padded slot
//     ranges and run by every rank's forward_device on its group's view (each group brings cap rows to the
//     MoE exchange) gives the eager DP step's logits for every real row, found through row_slot.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "kvcache/block_table_store.h"
#include "kvcache/kv_cache.h"
#include "launch/dp_batch.h"
#include "launch/dp_graph_step.h"
#include "launch/launch.h"
#include "runtime/dp_graph_rows.h"
#include "runtime/graph_rows.h"

namespace mxserve::launch {
namespace {

using runtime::DpGraphRows;
using runtime::GraphPadding;

model::SequenceSpan span(int32_t begin, int32_t n, int32_t kv_len, std::vector<int32_t> blocks, int32_t row) {
  model::SequenceSpan s;
  s.token_begin = begin;
  s.n_tokens = n;
  s.kv_len = kv_len;
  s.block_table = std::move(blocks);
  s.table_row = row;
  return s;
}

// Four sequences over two DP ranges of a 16-block pool ([0, 8), [8, 16)), interleaved in the batch: a decode
// row (group 1), a 3-row chain verify (group 0), 2 rows (group 1), a 2-row tree (group 0).
model::ForwardBatch mixed_batch() {
  model::ForwardBatch b;
  b.seqs.push_back(span(0, 1, 3, {9}, 0));
  b.seqs.push_back(span(1, 3, 7, {1, 2}, 1));
  b.seqs.push_back(span(4, 2, 6, {10, 11}, 2));
  model::SequenceSpan tree = span(6, 2, 4, {3}, 3);
  tree.kv_indices = {2, 3};
  tree.tree_mask = {1, 3};
  tree.tree_base = 2;
  b.seqs.push_back(tree);
  for (int32_t r = 0; r < 8; ++r) {
    b.token_ids.push_back(100 + r);
    b.positions.push_back(20 + r);
    b.logit_rows.push_back(r);
  }
  return b;
}

TEST(DpGraphRows, GroupsMatchTheEagerSplit) {
  for (auto [n, dp] : {std::pair<int64_t, int>{16, 2}, {10, 3}, {17, 4}, {9, 2}})
    for (int32_t b = 0; b < n; ++b)
      EXPECT_EQ(runtime::dp_group_of_block(b, n, dp), dp_rank_of_block(b, n, dp)) << n << " " << dp << " " << b;
  std::string why;
  const model::ForwardBatch batch = mixed_batch();
  const DpGraphRows g = runtime::dp_graph_rows(batch, 2, 16, &why);
  ASSERT_TRUE(why.empty()) << why;
  EXPECT_EQ(g.seq_group, (std::vector<int32_t>{1, 0, 1, 0}));
  EXPECT_EQ(g.group_seqs, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(g.group_rows, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(g.bucket.seqs, 2);
  EXPECT_EQ(g.bucket.rows, 5);
  EXPECT_EQ(g.bucket.max_rows, 3);
  EXPECT_EQ(g.bucket.max_kv, 7);
  EXPECT_TRUE(g.bucket.tree);
}

// Each group's slot range equals stage_graph_rows of the eager split's part (padding included); row_slot sends
// the batch's row split.rows[g][i] to slot g cap + i.
TEST(DpGraphRows, EachRangeHoldsItsEagerPartAndRowSlotMapsBack) {
  constexpr int kDp = 2;
  constexpr int64_t kBlock = 4, kCap = 6;  // bucket: 2 sequences x 3 rows per group
  const GraphPadding pad{5, 16 * kBlock};
  const model::ForwardBatch batch = mixed_batch();
  std::string why;
  const DpGraphRows groups = runtime::dp_graph_rows(batch, kDp, 16, &why);
  ASSERT_TRUE(why.empty()) << why;
  const int fields = runtime::kGraphTreeRowFields;
  std::vector<int32_t> host(fields * kDp * kCap, -7), row_slot;
  std::vector<int64_t> mask(kDp * kCap, -7);
  runtime::stage_dp_graph_rows(batch, groups, kCap, kBlock, pad, true, host.data(), mask.data(), &row_slot);
  auto split = split_by_dp_rank(batch, kDp, 16);
  ASSERT_TRUE(split.is_ok()) << split.status().to_string();
  ASSERT_EQ(row_slot.size(), 8u);
  for (int g = 0; g < kDp; ++g) {
    std::vector<int32_t> want(fields * kCap);
    std::vector<int64_t> want_mask(kCap);
    runtime::stage_graph_rows(split->parts[g], kCap, kBlock, pad, true, want.data(), want_mask.data());
    for (int f = 0; f < fields; ++f)
      for (int64_t i = 0; i < kCap; ++i)
        EXPECT_EQ(host[f * kDp * kCap + g * kCap + i], want[f * kCap + i]) << "group " << g << " field " << f << " slot " << i;
    for (int64_t i = 0; i < kCap; ++i) EXPECT_EQ(mask[g * kCap + i], want_mask[i]) << "group " << g << " slot " << i;
    for (size_t i = 0; i < split->rows[g].size(); ++i)
      EXPECT_EQ(row_slot[split->rows[g][i]], g * kCap + static_cast<int32_t>(i)) << "group " << g << " row " << i;
  }
  // Spot values: the tree row's base / mask and a padding row of group 1 (3 real rows of 6).
  EXPECT_EQ(row_slot[6], 3);  // the tree's first row: group 0 after the 3-row verify
  EXPECT_EQ(host[runtime::kRowTreeBase * kDp * kCap + 3], 2);
  EXPECT_EQ(mask[4], 3);
  EXPECT_EQ(host[runtime::kRowTableRows * kDp * kCap + kCap + 3], pad.scratch_row);
  EXPECT_EQ(host[runtime::kRowSlots * kDp * kCap + kCap + 5], pad.scratch_slot);
}

TEST(DpGraphRows, RefusesWhatTheEagerSplitRefuses) {
  std::string why;
  model::ForwardBatch b;
  b.token_ids = {1};
  b.positions = {0};
  b.logit_rows = {0};
  b.seqs.push_back(span(0, 1, 5, {7, 8}, 0));  // blocks of both ranges
  runtime::dp_graph_rows(b, 2, 16, &why);
  EXPECT_NE(why.find("sequence 0 holds blocks of DP ranks 0 and 1"), std::string::npos) << why;
  b.seqs[0].block_table = {16};
  runtime::dp_graph_rows(b, 2, 16, &why);
  EXPECT_NE(why.find("block 16 outside the pool of 16"), std::string::npos) << why;
  b.seqs[0].block_table.clear();
  runtime::dp_graph_rows(b, 2, 16, &why);
  EXPECT_NE(why.find("holds no KV block"), std::string::npos) << why;
}

TEST(DpGraphStep, SlicesEveryRowFieldOfItsGroup) {
  constexpr int kDp = 2;
  constexpr int64_t kT = 8, kV = 3, kH = 2;
  std::vector<int32_t> rows(6 * kT);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i);
  std::vector<int64_t> tree(kT, 1);
  const Tensor in = Tensor::view_of(rows.data(), DType::kI32, {6, kT});
  const Tensor mask = Tensor::view_of(tree.data(), DType::kI64, {kT});
  backend::AttentionMeta meta;
  meta.token_seq = runtime::graph_row_field(in, runtime::kRowTableRows);
  meta.kv_index = runtime::graph_row_field(in, runtime::kRowKvIndex);
  meta.slot_mapping = runtime::graph_row_field(in, runtime::kRowSlots);
  meta.tree_base = runtime::graph_row_field(in, runtime::kRowTreeBase);
  meta.tree_mask = mask;
  meta.params.n_tokens = kT;
  meta.params.n_seqs = 4;
  meta.params.n_leading_decode_rows = 0;
  meta.params.max_kv_len = 32;
  meta.params.tree_mask = static_cast<const uint64_t*>(mask.raw());
  meta.params.tree_base = meta.tree_base.data<int32_t>();
  Tensor logits = Tensor::empty(DType::kF32, {kT, kV}), hidden = Tensor::empty(DType::kF32, {kT, kH});
  const Tensor ids = runtime::graph_row_field(in, runtime::kRowIds);
  const Tensor pos = runtime::graph_row_field(in, runtime::kRowPositions);
  for (int g = 0; g < kDp; ++g) {
    auto s = dp_group_step(ids, pos, meta, logits, &hidden, kDp, g);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    const int64_t o = g * kT / kDp;
    EXPECT_EQ(s->ids.numel(), 4);
    EXPECT_EQ(s->ids.data<int32_t>()[0], rows[runtime::kRowIds * kT + o]);
    EXPECT_EQ(s->positions.data<int32_t>()[1], rows[runtime::kRowPositions * kT + o + 1]);
    EXPECT_EQ(s->meta.token_seq.data<int32_t>()[0], rows[runtime::kRowTableRows * kT + o]);
    EXPECT_EQ(s->meta.kv_index.data<int32_t>()[3], rows[runtime::kRowKvIndex * kT + o + 3]);
    EXPECT_EQ(s->meta.slot_mapping.data<int32_t>()[2], rows[runtime::kRowSlots * kT + o + 2]);
    EXPECT_EQ(s->meta.params.tree_base, rows.data() + runtime::kRowTreeBase * kT + o);
    EXPECT_EQ(s->meta.params.tree_mask, reinterpret_cast<const uint64_t*>(tree.data() + o));
    EXPECT_EQ(s->meta.params.n_tokens, 4);
    EXPECT_EQ(s->meta.params.n_seqs, 2);
    EXPECT_EQ(s->meta.params.max_kv_len, 32);
    EXPECT_EQ(s->logits.raw(), logits.data<float>() + o * kV);
    EXPECT_EQ(s->hidden.raw(), hidden.data<float>() + o * kH);
    EXPECT_EQ(s->logits.dim(0), 4);
  }
  // Steps that do not split into equal ranges, and a cascade buffer, are refused.
  auto odd = dp_group_step(ids, pos, meta, logits, nullptr, 3, 0);
  ASSERT_FALSE(odd.is_ok());
  EXPECT_NE(odd.status().message().find("do not split into 3 equal DP group ranges"), std::string::npos)
      << odd.status().message();
  backend::AttentionMeta cascade = meta;
  std::vector<int32_t> buf(4, 0);
  cascade.cascade = Tensor::view_of(buf.data(), DType::kI32, {4});
  auto c = dp_group_step(ids, pos, cascade, logits, nullptr, kDp, 1);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("cascade"), std::string::npos) << c.status().message();
  // dp 1 (the tp-only joined capture): the whole step, its cascade buffer kept.
  auto whole = dp_group_step(ids, pos, cascade, logits, nullptr, 1, 0);
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  EXPECT_EQ(whole->ids.numel(), kT);
  EXPECT_EQ(whole->meta.params.n_seqs, 4);
  EXPECT_EQ(whole->meta.cascade.raw(), buf.data());
  EXPECT_EQ(whole->logits.raw(), logits.raw());
}

double rel_l2(const float* a, const float* b, int64_t n) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < n; ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    s += double(b[i]) * b[i];
  }
  return s > 0 ? std::sqrt(d / s) : std::sqrt(d);
}

// What the joined capture runs on each rank, on the CPU ranks: a DP-attention decode step with uneven groups
// (group 0: two sequences, group 1: one and a padding row), staged into padded slot ranges and run by every
// rank's forward_device on its group's view, equals the eager DP step row for row.
TEST(DpGraphStep, PaddedGroupDeviceForwardEqualsTheEagerDpStep) {
  constexpr int64_t kPool = 16, kBlock = 4, kMaxRows = 4;  // store rows 0..3, the scratch row 4
  constexpr int32_t kScratchRow = 4;
  struct L {
    int tp, dp;
  };
  for (const char* f : {"glm4_moe_tiny_a", "glm_moe_dsa_tiny_a"}) {
    const std::string dir = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/" + f;
    for (L l : {L{1, 2}, L{2, 2}}) {
      const std::string what = std::string(f) + " tp " + std::to_string(l.tp) + " x dp " + std::to_string(l.dp) +
                               " + dp attention";
      LaunchConfig lc;
      lc.model.path = dir;
      lc.model.load_mtp = false;
      lc.backend = "cpu";
      lc.parallel.tp = l.tp;
      lc.parallel.dp = l.dp;
      lc.parallel.dp_attention = true;
      lc.cpu_group.timeout = std::chrono::seconds(60);
      auto lm = launch_model(lc);
      ASSERT_TRUE(lm.is_ok()) << what << ": " << lm.status().to_string();
      const int64_t V = (*lm)->config().vocab_size;
      // Prompts: A (group 0, blocks 0..2), B (group 1, blocks 8..10), C (group 0, blocks 3..4); batch order A, B, C.
      const std::vector<std::vector<int32_t>> blocks = {{0, 1, 2}, {8, 9, 10}, {3, 4}};
      const std::vector<int32_t> lens = {9, 7, 5};
      model::ForwardBatch prefill, decode, device_decode;
      for (int s = 0; s < 3; ++s) {
        model::SequenceSpan p = span(prefill.n_tokens(), lens[s], lens[s], blocks[s], -1);
        for (int32_t i = 0; i < lens[s]; ++i) {
          prefill.token_ids.push_back(static_cast<int32_t>((11 * i + 5 * s + 3) % V));
          prefill.positions.push_back(i);
        }
        prefill.logit_rows.push_back(prefill.n_tokens() - 1);
        prefill.seqs.push_back(p);
        decode.seqs.push_back(span(s, 1, lens[s] + 1, blocks[s], -1));
        decode.token_ids.push_back(static_cast<int32_t>((V - 1 - 3 * s) % V));
        decode.positions.push_back(lens[s]);
        decode.logit_rows.push_back(s);
      }
      device_decode = decode;
      for (int s = 0; s < 3; ++s) device_decode.seqs[s].table_row = s;
      auto pre_split = split_by_dp_rank(prefill, l.dp, kPool);
      auto split = split_by_dp_rank(decode, l.dp, kPool);
      ASSERT_TRUE(pre_split.is_ok() && split.is_ok());
      std::string why;
      const DpGraphRows groups = runtime::dp_graph_rows(device_decode, l.dp, kPool, &why);
      ASSERT_TRUE(why.empty()) << why;
      const int64_t cap = groups.bucket.seqs;  // q = 1: the fullest group's sequences (2)
      ASSERT_EQ(cap, 2);
      const int64_t T = l.dp * cap;
      std::vector<int32_t> host(runtime::kGraphRowFields * T), row_slot;
      const GraphPadding pad{kScratchRow, static_cast<int32_t>(kPool * kBlock)};
      runtime::stage_dp_graph_rows(device_decode, groups, cap, kBlock, pad, false, host.data(), nullptr, &row_slot);

      const int world = l.tp * l.dp;
      std::vector<Tensor> eager(world), device(world);
      std::vector<Status> st(world, Status::ok());
      std::vector<std::thread> threads;
      for (int r = 0; r < world; ++r)
        threads.emplace_back([&, r] {
          const int g = r / l.tp;
          model::CausalLM& m = (*lm)->rank_model(r);
          backend::Backend& be = (*lm)->rank_backend(r);
          auto alloc = [&](DType dt, Shape s) { return be.alloc(dt, std::move(s)); };
          kvcache::KvCache kv_e(m.kv_spec(kPool + 1, kBlock), alloc), kv_d(m.kv_spec(kPool + 1, kBlock), alloc);
          kv_d.enable_block_tables(kMaxRows + 1, 4, alloc,
                                   [&](Tensor& dst, int64_t off, const Tensor& h) { be.write_from_host(dst, off, h); });
          auto run = [&]() -> Status {
            kvcache::BlockTableStore& store = *kv_d.block_tables();
            for (int s = 0; s < 3; ++s) MX_RETURN_IF_ERROR(store.sync(s, 1 + s, blocks[s]));
            const std::vector<int32_t> scratch = {static_cast<int32_t>(kPool)};
            MX_RETURN_IF_ERROR(store.sync(kScratchRow, ~uint64_t{0}, scratch));
            MX_RETURN_IF_ERROR(m.forward(pre_split->parts[g], kv_e).status());
            MX_RETURN_IF_ERROR(m.forward(pre_split->parts[g], kv_d).status());
            MX_ASSIGN_OR_RETURN(model::ForwardOutput e, m.forward(split->parts[g], kv_e));
            eager[r] = be.to_host(e.logits);
            const Tensor inputs = be.upload(Tensor::view_of(host.data(), DType::kI32, {runtime::kGraphRowFields, T}));
            const backend::AttentionMeta meta =
                runtime::graph_attention_meta(inputs, Tensor(), store, l.dp * cap, 1, 16, kBlock, false);
            Tensor logits = be.alloc(DType::kF32, {T, V});
            MX_ASSIGN_OR_RETURN(DpGroupStep step,
                                dp_group_step(runtime::graph_row_field(inputs, runtime::kRowIds),
                                              runtime::graph_row_field(inputs, runtime::kRowPositions), meta, logits,
                                              nullptr, l.dp, g));
            MX_RETURN_IF_ERROR(m.forward_device(step.ids, step.positions, step.meta, kv_d, step.logits));
            device[r] = be.to_host(logits);
            return Status::ok();
          };
          st[r] = run();
          if (!st[r].is_ok()) (*lm)->rank_communicator(r).abort(st[r]);
        });
      for (auto& t : threads) t.join();
      for (int r = 0; r < world; ++r) ASSERT_TRUE(st[r].is_ok()) << what << " rank " << r << ": " << st[r].to_string();
      // Every real row: the eager logits of its group's part vs the device logits at its slot, on every rank of
      // the group (a group's tp ranks hold the same gathered logits).
      for (int g = 0; g < l.dp; ++g)
        for (size_t j = 0; j < split->logit_index[g].size(); ++j) {
          const int32_t row = split->logit_index[g][j];  // logit row = batch row here
          for (int r = g * l.tp; r < (g + 1) * l.tp; ++r) {
            const float* want = eager[r].data<float>() + j * V;
            const float* got = device[r].data<float>() + row_slot[row] * V;
            const double err = rel_l2(got, want, V);
            EXPECT_LE(err, 1e-5) << what << " row " << row << " (group " << g << ", slot " << row_slot[row]
                                 << ") rank " << r;
          }
        }
      std::printf("PASS-DPGRAPH %s: 3 rows in slots %d %d %d of %lld\n", what.c_str(), row_slot[0], row_slot[1],
                  row_slot[2], static_cast<long long>(T));
    }
  }
}

}  // namespace
}  // namespace mxserve::launch
