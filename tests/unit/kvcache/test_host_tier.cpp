// The host KV tier's bookkeeping (kvcache/host_tier.h) with a fake mover whose "blocks" are one int each:
// LRU eviction order, pins, the radix cache's evict sink and chain keys, and exact slot / block accounting.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "kvcache/block_pool.h"
#include "kvcache/host_tier.h"
#include "kvcache/radix_cache.h"

namespace mxserve::kvcache {
namespace {

struct FakeMover final : BlockMover {
  std::vector<int> device;            // per device block: its "contents"
  std::map<int32_t, int> host;        // per host slot
  int calls = 0;
  explicit FakeMover(int n_blocks) : device(n_blocks, -1) {}
  Status to_host(std::span<const int32_t> dev, std::span<const int32_t> slots) override {
    ++calls;
    for (size_t i = 0; i < dev.size(); ++i) host[slots[i]] = device[dev[i]];
    return Status::ok();
  }
  Status from_host(std::span<const int32_t> slots, std::span<const int32_t> dev) override {
    ++calls;
    for (size_t i = 0; i < dev.size(); ++i) device[dev[i]] = host.at(slots[i]);
    return Status::ok();
  }
};

std::vector<int32_t> toks(int first, int n) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(first + i);
  return t;
}

EvictedBlock evicted(uint64_t parent, const std::vector<int32_t>& tokens, int32_t block) {
  return EvictedBlock{parent, chain_key(parent, tokens), tokens, block};
}

TEST(HostTier, EvictsLeastRecentlyUsedWhenFull) {
  FakeMover mover(8);
  HostTier tier(2, 2, mover);
  const auto a = evicted(0, toks(1, 2), 0), b = evicted(0, toks(3, 2), 1), c = evicted(0, toks(5, 2), 2);
  tier.offload({a, b});
  EXPECT_EQ(tier.lru_keys(), (std::vector<uint64_t>{a.key, b.key}));
  // A lookup touches a: b is now the oldest and goes first.
  const std::vector<int32_t> prompt = toks(1, 2);
  auto slots = tier.match_and_pin(prompt, 0, 2, 0);
  ASSERT_EQ(slots.size(), 1u);
  tier.unpin(slots);
  EXPECT_EQ(tier.lru_keys(), (std::vector<uint64_t>{b.key, a.key}));
  tier.offload({c});
  EXPECT_EQ(tier.lru_keys(), (std::vector<uint64_t>{a.key, c.key}));
  EXPECT_EQ(tier.counters().offloaded_blocks, 3);
  EXPECT_EQ(tier.counters().dropped_blocks, 1);
  EXPECT_TRUE(tier.check().is_ok()) << tier.check().to_string();
}

TEST(HostTier, PinnedEntriesAreNeverEvicted) {
  FakeMover mover(8);
  HostTier tier(1, 2, mover);
  const auto a = evicted(0, toks(1, 2), 0), b = evicted(0, toks(3, 2), 1);
  tier.offload({a});
  const std::vector<int32_t> prompt = toks(1, 2);
  auto slots = tier.match_and_pin(prompt, 0, 2, 0);
  ASSERT_EQ(slots.size(), 1u);
  EXPECT_EQ(tier.n_pinned(), 1);
  tier.offload({b});  // no unpinned victim: b is dropped, a stays
  EXPECT_EQ(tier.lru_keys(), (std::vector<uint64_t>{a.key}));
  EXPECT_EQ(tier.counters().dropped_blocks, 1);
  tier.unpin(slots);
  EXPECT_EQ(tier.n_pinned(), 0);
  EXPECT_TRUE(tier.check().is_ok());
}

TEST(HostTier, LookupComparesTokensAndParents) {
  FakeMover mover(8);
  HostTier tier(4, 2, mover);
  const auto a = evicted(0, toks(1, 2), 0);
  const auto b = evicted(a.key, toks(3, 2), 1);
  tier.offload({b, a});
  const std::vector<int32_t> p = {1, 2, 3, 4, 9};
  auto slots = tier.match_and_pin(p, 0, 4, 0);
  EXPECT_EQ(slots.size(), 2u);
  tier.unpin(slots);
  // Same second block under another first block: no match past the first.
  const std::vector<int32_t> q = {1, 7, 3, 4};
  slots = tier.match_and_pin(q, 0, 4, 0);
  EXPECT_EQ(slots.size(), 0u);
  // The limit stops at whole blocks below it.
  slots = tier.match_and_pin(p, 0, 3, 0);
  EXPECT_EQ(slots.size(), 1u);
  tier.unpin(slots);
  EXPECT_EQ(tier.n_pinned(), 0);
}

// Radix cache -> sink -> host tier -> back into fresh device blocks: contents and keys survive, and every
// block and slot is accounted for (counts return to the start).
TEST(HostTier, RadixEvictionRoundTripKeepsAccounting) {
  const int64_t bs = 2;
  BlockPool pool(6);
  FakeMover mover(6);
  HostTier tier(8, bs, mover);
  RadixCache cache(pool, bs);
  cache.set_evict_sink([&tier](const std::vector<EvictedBlock>& b) { tier.offload(b); });
  const std::vector<int32_t> tokens = toks(10, 6);  // 3 blocks
  std::vector<int32_t> blocks;
  ASSERT_TRUE(pool.allocate(3, blocks).is_ok());
  for (int i = 0; i < 3; ++i) mover.device[blocks[i]] = 100 + i;
  EXPECT_EQ(cache.insert(tokens, blocks), 3);
  pool.unref_all(blocks);  // the sequence finished: only the tree holds them
  EXPECT_EQ(cache.evict(3), 3);
  EXPECT_EQ(pool.n_free(), 6);
  EXPECT_EQ(tier.n_used(), 3);
  for (int32_t b : blocks) mover.device[b] = -7;  // the pool reuses them for something else
  // A new request with the same prefix: nothing on the device, all three blocks in the host tier.
  auto m = cache.match(tokens, 6);
  EXPECT_EQ(m.n_tokens, 0);
  EXPECT_EQ(m.key, 0u);
  auto slots = tier.match_and_pin(tokens, 0, 6, m.key);
  ASSERT_EQ(slots.size(), 3u);
  std::vector<int32_t> fresh;
  ASSERT_TRUE(pool.allocate(2, fresh).is_ok());  // room for two only: the third stays in the tier
  ASSERT_TRUE(tier.load(slots, fresh).is_ok());
  EXPECT_EQ(mover.device[fresh[0]], 100);
  EXPECT_EQ(mover.device[fresh[1]], 101);
  EXPECT_EQ(tier.n_used(), 1);
  EXPECT_EQ(tier.n_pinned(), 0);
  EXPECT_EQ(tier.counters().loaded_blocks, 2);
  // Back in the tree under the same chain keys: the third block continues from the device match.
  EXPECT_EQ(cache.insert(std::span<const int32_t>(tokens.data(), 4), fresh), 2);
  pool.unref_all(fresh);
  auto m2 = cache.match(tokens, 6);
  EXPECT_EQ(m2.n_tokens, 4);
  auto rest = tier.match_and_pin(tokens, 4, 6, m2.key);
  EXPECT_EQ(rest.size(), 1u);
  tier.unpin(rest);
  pool.unref_all(m2.blocks);
  // Everything out again: the pool is whole, every slot accounted for.
  EXPECT_EQ(cache.evict(10), 2);
  EXPECT_EQ(pool.n_free(), 6);
  EXPECT_EQ(cache.n_cached_blocks(), 0);
  EXPECT_EQ(tier.n_used(), 3);
  EXPECT_EQ(tier.n_used() + tier.n_free(), tier.n_slots());
  EXPECT_TRUE(tier.check().is_ok()) << tier.check().to_string();
}

TEST(HostTier, ChainKeyDependsOnParentAndTokens) {
  const std::vector<int32_t> t = {1, 2};
  EXPECT_NE(chain_key(0, t), chain_key(1, t));
  EXPECT_NE(chain_key(0, t), chain_key(0, std::vector<int32_t>{2, 1}));
  EXPECT_NE(chain_key(0, t), 0u);
}

}  // namespace
}  // namespace mxserve::kvcache

namespace mxserve::kvcache {
namespace {

// A batch larger than the tier: the batch's own fresh entries are never each other's victims; the surplus is
// dropped and every slot holds exactly one entry.
TEST(HostTier, BatchLargerThanTierDropsTheSurplus) {
  FakeMover mover(8);
  HostTier tier(2, 2, mover);
  std::vector<EvictedBlock> batch;
  for (int i = 0; i < 4; ++i) {
    batch.push_back(evicted(0, toks(10 * i, 2), i));
    mover.device[i] = 100 + i;
  }
  tier.offload(batch);
  EXPECT_EQ(tier.n_used(), 2);
  EXPECT_EQ(tier.counters().offloaded_blocks, 2);
  EXPECT_EQ(tier.counters().dropped_blocks, 2);
  EXPECT_EQ(tier.n_pinned(), 0);
  EXPECT_EQ(tier.lru_keys(), (std::vector<uint64_t>{batch[0].key, batch[1].key}));
  EXPECT_TRUE(tier.check().is_ok()) << tier.check().to_string();
  std::vector<int> held;
  for (const auto& [slot, v] : mover.host) held.push_back(v);
  EXPECT_EQ(held, (std::vector<int>{100, 101}));
}

}  // namespace
}  // namespace mxserve::kvcache
