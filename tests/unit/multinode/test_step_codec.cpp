// The multi-node step message (launch/step_codec.h): a batch with every kind of span (engine table rows with
// host tables, hand-built block tables, tree rows) and the MTP / slot-copy tensors survives encode -> decode
// field for field; truncated or foreign bytes are errors, never a crash.
#include <gtest/gtest.h>

#include <cstring>

#include "launch/step_codec.h"

namespace mxserve::launch {
namespace {

TEST(StepCodec, RoundTripsEveryField) {
  model::ForwardBatch b;
  b.token_ids = {5, 6, 7, 8};
  b.positions = {10, 11, 0, 1};
  b.logit_rows = {1, 3};
  b.want_hidden = true;
  b.want_host_logits = false;
  b.mtp_step.first_step_rows = {0, 1, 1, 0};
  std::vector<int32_t> host_table = {3, 4, 9};
  model::SequenceSpan a;
  a.token_begin = 0, a.n_tokens = 2, a.kv_len = 12, a.table_row = 5, a.table_lease = 77, a.host_table = &host_table;
  model::SequenceSpan t;
  t.token_begin = 2, t.n_tokens = 2, t.kv_len = 40, t.block_table = {1, 2, 8};
  t.kv_indices = {33, 34};
  t.tree_mask = {1, 3};
  t.tree_base = 33;
  b.seqs = {a, t};
  Tensor hidden = Tensor::empty(DType::kF32, {4, 3});
  for (int i = 0; i < 12; ++i) hidden.data<float>()[i] = 0.5f * i;
  StepCache c{9, 4, 128, 16, 64, 32};
  const std::string bytes = encode_step(StepKind::kForwardMtp, c, &b, &hidden, nullptr, nullptr);
  auto m = decode_step(bytes);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const StepMessage& d = **m;
  EXPECT_EQ(d.kind, StepKind::kForwardMtp);
  EXPECT_EQ(d.cache.id, 9u);
  EXPECT_EQ(d.cache.drop_id, 4u);
  EXPECT_EQ(d.cache.n_blocks, 128);
  EXPECT_EQ(d.cache.block_size, 16);
  EXPECT_EQ(d.cache.table_rows, 64);
  EXPECT_EQ(d.cache.table_max_blocks, 32);
  EXPECT_EQ(d.batch.token_ids, b.token_ids);
  EXPECT_EQ(d.batch.positions, b.positions);
  EXPECT_EQ(d.batch.logit_rows, b.logit_rows);
  EXPECT_TRUE(d.batch.want_hidden);
  EXPECT_FALSE(d.batch.want_host_logits);
  EXPECT_EQ(d.batch.mtp_step.first_step_rows, b.mtp_step.first_step_rows);
  ASSERT_EQ(d.batch.seqs.size(), 2u);
  const model::SequenceSpan& da = d.batch.seqs[0];
  EXPECT_EQ(da.kv_len, 12);
  EXPECT_EQ(da.table_row, 5);
  EXPECT_EQ(da.table_lease, 77u);
  ASSERT_NE(da.host_table, nullptr);
  EXPECT_EQ(*da.host_table, host_table);
  const model::SequenceSpan& dt = d.batch.seqs[1];
  EXPECT_EQ(dt.host_table, nullptr);
  EXPECT_EQ(dt.block_table, t.block_table);
  EXPECT_EQ(dt.kv_indices, t.kv_indices);
  EXPECT_EQ(dt.tree_mask, t.tree_mask);
  EXPECT_EQ(dt.tree_base, 33);
  EXPECT_EQ(dt.table_row, -1);
  ASSERT_EQ(d.hidden_in.shape(), hidden.shape());
  EXPECT_EQ(std::memcmp(d.hidden_in.raw(), hidden.raw(), hidden.nbytes()), 0);
  EXPECT_FALSE(d.src_slots.defined() && d.src_slots.raw() != nullptr);
}

TEST(StepCodec, SlotCopyAndQuit) {
  Tensor src = Tensor::empty(DType::kI32, {3}), dst = Tensor::empty(DType::kI32, {3});
  for (int i = 0; i < 3; ++i) src.data<int32_t>()[i] = i, dst.data<int32_t>()[i] = 10 + i;
  auto m = decode_step(encode_step(StepKind::kCopyKvSlots, StepCache{1, 0, 8, 16, -1, -1}, nullptr, nullptr, &src, &dst));
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ((*m)->kind, StepKind::kCopyKvSlots);
  EXPECT_EQ((*m)->dst_slots.data<int32_t>()[2], 12);
  EXPECT_EQ((*m)->cache.table_rows, -1);
  auto q = decode_step(encode_step(StepKind::kQuit, {}, nullptr, nullptr, nullptr, nullptr));
  ASSERT_TRUE(q.is_ok());
  EXPECT_EQ((*q)->kind, StepKind::kQuit);
}

TEST(StepCodec, TruncatedOrForeignBytesAreErrors) {
  model::ForwardBatch b;
  b.token_ids = {1, 2, 3};
  b.positions = {0, 1, 2};
  model::SequenceSpan s;
  s.n_tokens = 3, s.kv_len = 3, s.block_table = {0};
  b.seqs = {s};
  const std::string bytes = encode_step(StepKind::kForward, StepCache{1, 0, 4, 16, -1, -1}, &b, nullptr, nullptr, nullptr);
  for (size_t n = 0; n < bytes.size(); n += 7) {
    auto m = decode_step(bytes.substr(0, n));
    EXPECT_FALSE(m.is_ok()) << "a prefix of " << n << " bytes decoded";
  }
  auto foreign = decode_step("GET / HTTP/1.1\r\n\r\n");
  ASSERT_FALSE(foreign.is_ok());
  EXPECT_NE(foreign.status().message().find("unknown kind"), std::string::npos) << foreign.status().to_string();
}

}  // namespace
}  // namespace mxserve::launch
