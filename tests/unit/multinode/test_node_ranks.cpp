// A multi-node launch's share of the world (launch/multinode.h node_ranks): consecutive global ranks per node,
// devices from first_device per node; uneven spreads and data parallelism across nodes refused, naming flags.
#include <gtest/gtest.h>

#include "launch/multinode.h"

namespace mxserve::launch {
namespace {

parallel::DistInit nodes(int n, int rank) {
  parallel::DistInit d;
  d.nnodes = n;
  d.node_rank = rank;
  d.host = "127.0.0.1";
  d.port = 5000;
  return d;
}

TEST(NodeRanks, ConsecutiveRanksPerNode) {
  parallel::ParallelConfig p;
  p.tp = 8;
  p.ep = 8;
  p.first_device = 1;
  auto world = p.ranks();
  ASSERT_TRUE(world.is_ok());
  for (int node = 0; node < 2; ++node) {
    auto local = node_ranks(*world, p, nodes(2, node));
    ASSERT_TRUE(local.is_ok()) << local.status().to_string();
    ASSERT_EQ(local->size(), 4u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ((*local)[i].rank, node * 4 + i);
      EXPECT_EQ((*local)[i].tp, 8);
      EXPECT_EQ((*local)[i].ep, 8);
      EXPECT_EQ((*local)[i].device, 1 + i);  // each node numbers its own GPUs
    }
  }
  auto one = node_ranks(*world, p, nodes(1, 0));
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ(one->size(), 8u);
}

TEST(NodeRanks, RefusedLayoutsNameTheFlags) {
  parallel::ParallelConfig p;
  p.tp = 3;
  auto world = p.ranks();
  ASSERT_TRUE(world.is_ok());
  auto uneven = node_ranks(*world, p, nodes(2, 0));
  ASSERT_FALSE(uneven.is_ok());
  EXPECT_NE(uneven.status().message().find("do not spread evenly over --nnodes 2"), std::string::npos)
      << uneven.status().to_string();
  parallel::ParallelConfig dp;
  dp.tp = 2;
  dp.dp = 2;
  auto dp_world = dp.ranks();
  ASSERT_TRUE(dp_world.is_ok());
  auto refused = node_ranks(*dp_world, dp, nodes(2, 1));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("--data-parallel-size 2"), std::string::npos) << refused.status().to_string();
}

}  // namespace
}  // namespace mxserve::launch
