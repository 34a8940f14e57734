// RadixCache directly, hand-built cases: match/insert references, dedup on insert, LRU eviction order
// (leaves only, least recently used first), n_evictable with blocks still held by sequences.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "kvcache/radix_cache.h"

namespace mxserve::kvcache {
namespace {

std::vector<int32_t> alloc(BlockPool& pool, int64_t n) {
  std::vector<int32_t> b;
  EXPECT_TRUE(pool.allocate(n, b).is_ok());
  return b;
}

std::set<int32_t> cached_blocks(const RadixCache& c) {
  std::set<int32_t> s;
  c.for_each_block([&](int32_t b, int64_t) { s.insert(b); });
  return s;
}

TEST(RadixCache, InsertThenMatchRefsForTheCaller) {
  BlockPool pool(8);
  RadixCache cache(pool, 2);
  const std::vector<int32_t> toks = {1, 2, 3, 4, 5};  // two full blocks + a partial one
  auto blocks = alloc(pool, 3);
  EXPECT_EQ(cache.insert(toks, blocks), 2);  // the partial block is never cached
  EXPECT_EQ(cache.n_cached_blocks(), 2);
  EXPECT_EQ(pool.ref_count(blocks[0]), 2);
  EXPECT_EQ(pool.ref_count(blocks[2]), 1);
  pool.unref_all(blocks);  // the sequence finishes
  EXPECT_EQ(pool.n_free(), 8 - 2);
  EXPECT_EQ(cache.n_evictable(), 2);

  auto m = cache.match(std::vector<int32_t>{1, 2, 3, 4, 9, 9}, 6);
  EXPECT_EQ(m.n_tokens, 4);
  EXPECT_EQ(m.blocks, (std::vector<int32_t>{blocks[0], blocks[1]}));
  EXPECT_EQ(pool.ref_count(blocks[0]), 2);
  EXPECT_EQ(cache.n_evictable(), 0);
  // max_tokens limits the match to whole blocks inside it.
  auto m1 = cache.match(std::vector<int32_t>{1, 2, 3, 4}, 3);
  EXPECT_EQ(m1.n_tokens, 2);
  auto none = cache.match(std::vector<int32_t>{2, 1, 3, 4}, 4);
  EXPECT_EQ(none.n_tokens, 0);
  EXPECT_TRUE(none.blocks.empty());
  pool.unref_all(m.blocks);
  pool.unref_all(m1.blocks);
  EXPECT_EQ(cache.n_evictable(), 2);
}

TEST(RadixCache, DedupOnInsertKeepsTheCachedBlock) {
  BlockPool pool(8);
  RadixCache cache(pool, 2);
  const std::vector<int32_t> toks = {7, 7, 8, 8};
  auto first = alloc(pool, 2);
  EXPECT_EQ(cache.insert(toks, first), 2);
  // A second sequence computed the same tokens into its own blocks (it did not match first).
  auto second = alloc(pool, 2);
  EXPECT_EQ(cache.insert(toks, second), 0);
  EXPECT_EQ(cache.n_cached_blocks(), 2);
  EXPECT_EQ(cached_blocks(cache), (std::set<int32_t>(first.begin(), first.end())));
  EXPECT_EQ(pool.ref_count(second[0]), 1);  // only the sequence: freed when it finishes
  pool.unref_all(second);
  EXPECT_EQ(pool.ref_count(second[0]), 0);
  EXPECT_EQ(pool.ref_count(first[0]), 2);
  // Extending a cached path adds only the new block, under the cached one.
  const std::vector<int32_t> longer = {7, 7, 8, 8, 9, 9};
  auto third = alloc(pool, 3);
  EXPECT_EQ(cache.insert(longer, third), 1);
  EXPECT_EQ(pool.ref_count(third[2]), 2);
  EXPECT_EQ(pool.ref_count(third[0]), 1);
  pool.unref_all(first);
  pool.unref_all(third);
}

TEST(RadixCache, EvictsLeastRecentlyUsedLeavesFirst) {
  BlockPool pool(16);
  RadixCache cache(pool, 1);
  // Three paths: a=[1,2], b=[1,3], c=[4]; inserted in that order, then b touched by a match.
  auto a = alloc(pool, 2), b = alloc(pool, 2), c = alloc(pool, 1);
  cache.insert(std::vector<int32_t>{1, 2}, a);
  cache.insert(std::vector<int32_t>{1, 3}, b);  // shares [1] with a: b[0] stays the sequence's own
  cache.insert(std::vector<int32_t>{4}, c);
  pool.unref_all(a);
  pool.unref_all(b);
  pool.unref_all(c);
  auto touch = cache.match(std::vector<int32_t>{1, 3}, 2);
  pool.unref_all(touch.blocks);
  ASSERT_EQ(cache.n_cached_blocks(), 4);  // [1] [1,2] [1,3] [4]
  // Oldest leaf: [1,2] (a[1]); then [4]; then [1,3]; only then the inner [1], a leaf by then.
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(pool.ref_count(a[1]), 0);
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(pool.ref_count(c[0]), 0);
  EXPECT_EQ(cached_blocks(cache), (std::set<int32_t>{a[0], b[1]}));
  EXPECT_EQ(cache.evict(5), 2);
  EXPECT_EQ(cache.n_cached_blocks(), 0);
  EXPECT_EQ(pool.n_free(), 16);
  EXPECT_EQ(cache.evict(1), 0);
}

TEST(RadixCache, NeverEvictsWhatASequenceHolds) {
  BlockPool pool(8);
  RadixCache cache(pool, 1);
  auto a = alloc(pool, 3);
  cache.insert(std::vector<int32_t>{1, 2, 3}, a);
  pool.unref_all(a);
  auto held = cache.match(std::vector<int32_t>{1, 2}, 2);  // a sequence now uses [1] and [1,2]
  EXPECT_EQ(cache.n_evictable(), 1);
  EXPECT_EQ(cache.evict(10), 1);  // only [1,2,3]; its parents are held
  EXPECT_EQ(cache.n_cached_blocks(), 2);
  pool.unref_all(held.blocks);
  EXPECT_EQ(cache.n_evictable(), 2);
  EXPECT_EQ(cache.evict(10), 2);
}

// A tree-only node above a block a sequence still holds cannot be evicted (evict takes leaves only), so it
// is not evictable. Once n_evictable counted every tree-only node, overstating what evict() could free.
TEST(RadixCache, EvictableCountsWholeFreeSubtreesOnly) {
  BlockPool pool(8);
  RadixCache cache(pool, 1);
  auto a = alloc(pool, 1);
  cache.insert(std::vector<int32_t>{5}, a);
  pool.unref_all(a);
  auto b = alloc(pool, 2);  // computed [5, 6] itself: [5] is deduped, [5,6] is b[1], still held by b
  EXPECT_EQ(cache.insert(std::vector<int32_t>{5, 6}, b), 1);
  EXPECT_EQ(pool.ref_count(a[0]), 1);
  EXPECT_EQ(cache.n_evictable(), 0);
  EXPECT_EQ(cache.evict(10), 0);
  pool.unref_all(b);
  EXPECT_EQ(cache.n_evictable(), 2);
  EXPECT_EQ(cache.evict(10), 2);
}

TEST(RadixCache, DestructorReturnsTheTreesReferences) {
  BlockPool pool(4);
  {
    RadixCache cache(pool, 2);
    auto a = alloc(pool, 2);
    cache.insert(std::vector<int32_t>{1, 2, 3, 4}, a);
    pool.unref_all(a);
    EXPECT_EQ(pool.n_free(), 2);
  }
  EXPECT_EQ(pool.n_free(), 4);
}

}  // namespace
}  // namespace mxserve::kvcache
