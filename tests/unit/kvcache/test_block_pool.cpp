// BlockPool directly: counts, all-or-nothing allocation, LIFO reuse, and misuse caught loudly.
#include <gtest/gtest.h>

#include "kvcache/block_pool.h"

namespace mxserve::kvcache {
namespace {

TEST(BlockPool, AllocateRefUnref) {
  BlockPool pool(4);
  EXPECT_EQ(pool.n_blocks(), 4);
  EXPECT_EQ(pool.n_free(), 4);
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.allocate(3, got).is_ok());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2}));  // a fresh pool hands out ids in order
  for (int32_t b : got) EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_EQ(pool.n_free(), 1);
  EXPECT_EQ(pool.n_referenced(), 3);
  pool.ref(1);
  pool.ref(1);
  EXPECT_EQ(pool.ref_count(1), 3);
  pool.unref(1);
  pool.unref(1);
  EXPECT_EQ(pool.ref_count(1), 1);
  EXPECT_EQ(pool.n_free(), 1);
  pool.unref(1);
  EXPECT_EQ(pool.ref_count(1), 0);
  EXPECT_EQ(pool.n_free(), 2);
  EXPECT_EQ(pool.n_free() + pool.n_referenced(), pool.n_blocks());
}

TEST(BlockPool, FailedAllocationAllocatesNothing) {
  BlockPool pool(3);
  std::vector<int32_t> got = {99};  // allocate appends; a failure leaves out untouched
  ASSERT_TRUE(pool.allocate(2, got).is_ok());
  const Status s = pool.allocate(2, got);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("2 blocks requested, 1 free of 3"), std::string::npos) << s.to_string();
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(pool.n_free(), 1);
  ASSERT_TRUE(pool.allocate(0, got).is_ok());
  EXPECT_EQ(got.size(), 3u);
}

TEST(BlockPool, RecentlyFreedBlocksAreReusedFirst) {
  BlockPool pool(5);
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.allocate(5, got).is_ok());
  pool.unref(3);
  pool.unref(0);
  pool.unref(4);
  std::vector<int32_t> again;
  ASSERT_TRUE(pool.allocate(3, again).is_ok());
  EXPECT_EQ(again, (std::vector<int32_t>{4, 0, 3}));
}

TEST(BlockPool, UnrefAll) {
  BlockPool pool(4);
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.allocate(4, got).is_ok());
  pool.ref(2);
  pool.unref_all(got);
  EXPECT_EQ(pool.n_free(), 3);
  EXPECT_EQ(pool.ref_count(2), 1);
}

using BlockPoolDeathTest = ::testing::Test;

TEST(BlockPoolDeathTest, MisuseIsCaught) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  BlockPool pool(2);
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.allocate(1, got).is_ok());
  EXPECT_DEATH(pool.ref(1), "ref of free or invalid block 1");
  EXPECT_DEATH(pool.unref(7), "unref of free or invalid block 7");
  EXPECT_DEATH(pool.ref(-1), "invalid block -1");
  pool.unref(got[0]);
  EXPECT_DEATH(pool.unref(got[0]), "unref of free or invalid block");  // double free
}

}  // namespace
}  // namespace mxserve::kvcache
