// parallel/: rank layouts, shard slices (every rank's slices tile the tensor exactly; uneven splits are
// errors naming the tensor) and the single-rank communicator (identity collectives, checked shapes).
#include <gtest/gtest.h>

#include "parallel/communicator.h"
#include "parallel/rank_layout.h"
#include "parallel/shard.h"

namespace mxserve::parallel {
namespace {

TEST(RankLayout, RanksOfAConfig) {
  ParallelConfig pc{.tp = 2, .ep = 4, .dp = 2, .dp_attention = true, .first_device = 1};
  auto ranks = pc.ranks();
  ASSERT_TRUE(ranks.is_ok()) << ranks.status().to_string();
  ASSERT_EQ(ranks->size(), 4u);
  EXPECT_EQ((*ranks)[3].device, 4);
  EXPECT_EQ((*ranks)[3].tp_rank(), 1);
  EXPECT_EQ((*ranks)[3].dp_rank(), 1);
  EXPECT_EQ((*ranks)[3].ep_rank(), 3);
  EXPECT_NE((*ranks)[3].describe().find("rank 3/4"), std::string::npos);
}

TEST(RankLayout, InvalidConfigsNameTheSize) {
  EXPECT_NE((ParallelConfig{.tp = 0}).validate().message().find("tensor-parallel"), std::string::npos);
  EXPECT_NE((ParallelConfig{.tp = 2, .ep = 3}).validate().message().find("--ep-size 3 must be 1"), std::string::npos);
  // Whole experts: ep is the tp group or the world, so the ranks summing a MoE block hold each expert once.
  EXPECT_NE((ParallelConfig{.tp = 4, .ep = 2}).validate().message().find("the tensor-parallel size 4 or tp x dp = 4"),
            std::string::npos);
  EXPECT_TRUE((ParallelConfig{.tp = 2, .ep = 2, .dp = 2}).validate().is_ok());
  // ep = tp x dp only under DP attention (the MoE blocks are summed over all ranks); plain DP replicas each
  // partition their experts over their own tp group.
  EXPECT_TRUE((ParallelConfig{.tp = 2, .ep = 4, .dp = 2, .dp_attention = true}).validate().is_ok());
  EXPECT_NE((ParallelConfig{.tp = 2, .ep = 4, .dp = 2}).validate().message().find("must be 1 or the tensor-parallel size 2"),
            std::string::npos);
  EXPECT_FALSE((ParallelConfig{.first_device = -1}).validate().is_ok());
  EXPECT_TRUE((ParallelConfig{}).validate().is_ok());
}

TEST(Shard, NoneIsWhole) {
  auto s = shard_slice("w", {8, 4}, ShardAxis::kNone, RankLayout{.tp = 2, .rank = 1});
  ASSERT_TRUE(s.is_ok());
  EXPECT_TRUE(s->held);
  EXPECT_EQ(s->local_shape, (Shape{8, 4}));
}

TEST(Shard, RowAndColumnSlicesTileTheTensor) {
  for (ShardAxis axis : {ShardAxis::kRow, ShardAxis::kColumn}) {
    const Shape logical{12, 6};
    const int dim = axis == ShardAxis::kRow ? 0 : 1;
    int64_t next = 0;
    for (int r = 0; r < 3; ++r) {
      auto s = shard_slice("w", logical, axis, RankLayout{.tp = 3, .rank = r});
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      EXPECT_EQ(s->dim, dim);
      EXPECT_EQ(s->begin, next);
      next = s->end;
      Shape expect = logical;
      expect[dim] /= 3;
      EXPECT_EQ(s->local_shape, expect);
    }
    EXPECT_EQ(next, logical[dim]);
  }
}

TEST(Shard, UnevenSplitNamesTheTensor) {
  auto s = shard_slice("model.layers.0.self_attn.k_proj.weight", {64, 64}, ShardAxis::kRow, RankLayout{.tp = 3});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("k_proj"), std::string::npos);
  EXPECT_NE(s.status().message().find("tp 3"), std::string::npos);
}

TEST(Shard, ExpertsGoToTheirEpRank) {
  // 8 experts over ep 4: experts 2, 3 on ep rank 1.
  for (int64_t e = 0; e < 8; ++e) {
    auto s = shard_slice("e", {4, 4}, ShardAxis::kExpert, RankLayout{.tp = 4, .ep = 4, .rank = 1}, e, 8);
    ASSERT_TRUE(s.is_ok());
    EXPECT_EQ(s->held, e == 2 || e == 3) << e;
  }
  EXPECT_FALSE(shard_slice("e", {4}, ShardAxis::kExpert, RankLayout{}, -1, 8).is_ok());
  EXPECT_FALSE(shard_slice("e", {4}, ShardAxis::kExpert, RankLayout{.tp = 3, .ep = 3}, 0, 8).is_ok());
}

TEST(Shard, HeadGroupsSplitWholeHeadsOrReplicate) {
  // k_proj of 2 KV heads x 4 rows each.
  auto half = shard_slice("k", {8, 6}, ShardAxis::kRow, RankLayout{.tp = 2, .rank = 1}, -1, 0, ShardAxis::kNone, 2);
  ASSERT_TRUE(half.is_ok()) << half.status().to_string();
  EXPECT_EQ(half->begin, 4);
  EXPECT_EQ(half->end, 8);
  // tp 4 > 2 heads: ranks 0, 1 hold head 0; ranks 2, 3 head 1 (each whole).
  for (int r = 0; r < 4; ++r) {
    auto s = shard_slice("k", {8, 6}, ShardAxis::kRow, RankLayout{.tp = 4, .rank = r}, -1, 0, ShardAxis::kNone, 2);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    EXPECT_EQ(s->begin, r < 2 ? 0 : 4) << r;
    EXPECT_EQ(s->local_shape, (Shape{4, 6}));
  }
  auto bad = shard_slice("k_proj", {8, 6}, ShardAxis::kRow, RankLayout{.tp = 3}, -1, 0, ShardAxis::kNone, 2);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("2 heads neither split over tp 3"), std::string::npos) << bad.status().message();
}

TEST(Shard, ExpertsAreTensorSlicedWithoutEp) {
  // ep 1, tp 2: gate/up rows and down columns of every expert are halved; with ep 2 experts stay whole.
  auto gate = shard_slice("g", {8, 4}, ShardAxis::kExpert, RankLayout{.tp = 2, .rank = 1}, 3, 8, ShardAxis::kRow);
  ASSERT_TRUE(gate.is_ok());
  EXPECT_TRUE(gate->held);
  EXPECT_EQ(gate->dim, 0);
  EXPECT_EQ(gate->begin, 4);
  auto down = shard_slice("d", {4, 8}, ShardAxis::kExpert, RankLayout{.tp = 2, .rank = 0}, 3, 8, ShardAxis::kColumn);
  ASSERT_TRUE(down.is_ok());
  EXPECT_EQ(down->dim, 1);
  EXPECT_EQ(down->local_shape, (Shape{4, 4}));
  auto whole = shard_slice("g", {8, 4}, ShardAxis::kExpert, RankLayout{.tp = 2, .ep = 2, .rank = 0}, 3, 8,
                           ShardAxis::kRow);
  ASSERT_TRUE(whole.is_ok());
  EXPECT_EQ(whole->dim, -1);
  EXPECT_EQ(whole->local_shape, (Shape{8, 4}));
}

TEST(SingleRankCommunicator, CollectivesAreIdentity) {
  auto comm = make_single_rank_communicator(RankLayout{});
  ASSERT_TRUE(comm.is_ok());
  EXPECT_EQ((*comm)->size(), 1);
  Tensor x = Tensor::empty(DType::kF32, {3, 2});
  for (int i = 0; i < 6; ++i) x.data<float>()[i] = static_cast<float>(i);
  ASSERT_TRUE((*comm)->all_reduce(x, ReduceOp::kSum).is_ok());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(x.data<float>()[i], static_cast<float>(i));
  auto g = (*comm)->all_gather(x);
  ASSERT_TRUE(g.is_ok());
  EXPECT_EQ(g->shape(), x.shape());
  EXPECT_EQ(g->raw(), x.raw());
  auto rs = (*comm)->reduce_scatter(x, ReduceOp::kMax);
  ASSERT_TRUE(rs.is_ok());
  EXPECT_EQ(rs->raw(), x.raw());
  std::vector<int64_t> recv;
  auto a2a = (*comm)->all_to_all(x, {3}, &recv);
  ASSERT_TRUE(a2a.is_ok());
  EXPECT_EQ(recv, std::vector<int64_t>{3});
}

TEST(SingleRankCommunicator, WrongShapesAndWorldsAreErrors) {
  auto comm = make_single_rank_communicator(RankLayout{});
  ASSERT_TRUE(comm.is_ok());
  Tensor x = Tensor::empty(DType::kF32, {3, 2});
  EXPECT_FALSE((*comm)->all_to_all(x, {2}, nullptr).is_ok());
  EXPECT_FALSE((*comm)->all_to_all(x, {1, 2}, nullptr).is_ok());
  Tensor scalar = Tensor::empty(DType::kF32, {});
  EXPECT_FALSE((*comm)->all_gather(scalar).is_ok());
  EXPECT_FALSE(make_single_rank_communicator(RankLayout{.tp = 2}).is_ok());
}

}  // namespace
}  // namespace mxserve::parallel
