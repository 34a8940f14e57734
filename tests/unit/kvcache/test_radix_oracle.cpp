// BlockPool + RadixCache against a reference model, driven by random operation sequences (sequences that
// match, allocate, insert, release; evictions). The oracle is deliberately naive: a LIFO free stack, a
// count per block, and the cache as a map from token prefix to {block, last use}; eviction scans every
// node for the least recently used unreferenced leaf. After every operation the two must agree on every
// count, every cached (block, depth) pair, n_cached_blocks, n_evictable and each call's result.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "kvcache/radix_cache.h"

namespace mxserve::kvcache {
namespace {

using Tokens = std::vector<int32_t>;

struct OraclePool {
  explicit OraclePool(int64_t n) : refs(n, 0) {
    for (int64_t b = n - 1; b >= 0; --b) free.push_back(static_cast<int32_t>(b));
  }
  bool allocate(int64_t n, std::vector<int32_t>& out) {
    if (n > static_cast<int64_t>(free.size())) return false;
    for (int64_t i = 0; i < n; ++i) {
      out.push_back(free.back());
      refs[free.back()] = 1;
      free.pop_back();
    }
    return true;
  }
  void ref(int32_t b) { ++refs[b]; }
  void unref(int32_t b) {
    if (--refs[b] == 0) free.push_back(b);
  }
  std::vector<int32_t> refs;
  std::vector<int32_t> free;
};

struct OracleCache {
  struct Node {
    int32_t block;
    uint64_t last;
  };
  OracleCache(OraclePool& p, int64_t bs) : pool(p), bs(bs) {}

  std::vector<int32_t> match(const Tokens& t, int64_t max_tokens) {
    const uint64_t now = ++clock;
    std::vector<int32_t> out;
    const int64_t limit = std::min<int64_t>(max_tokens, static_cast<int64_t>(t.size()));
    for (int64_t len = bs; len <= limit; len += bs) {
      auto it = nodes.find(Tokens(t.begin(), t.begin() + len));
      if (it == nodes.end()) break;
      it->second.last = now;
      pool.ref(it->second.block);
      out.push_back(it->second.block);
    }
    return out;
  }
  int64_t insert(const Tokens& t, const std::vector<int32_t>& blocks) {
    const uint64_t now = ++clock;
    const int64_t n_full = std::min<int64_t>(static_cast<int64_t>(t.size()) / bs, static_cast<int64_t>(blocks.size()));
    int64_t added = 0;
    for (int64_t i = 0; i < n_full; ++i) {
      Tokens key(t.begin(), t.begin() + (i + 1) * bs);
      auto it = nodes.find(key);
      if (it == nodes.end()) {
        it = nodes.emplace(key, Node{blocks[i], now}).first;
        pool.ref(blocks[i]);
        ++added;
      }
      it->second.last = now;
    }
    return added;
  }
  bool is_prefix(const Tokens& p, const Tokens& t) const {
    return p.size() <= t.size() && std::equal(p.begin(), p.end(), t.begin());
  }
  bool has_children(const Tokens& key) const {
    for (const auto& [k, n] : nodes)
      if (k.size() == key.size() + bs && is_prefix(key, k)) return true;
    return false;
  }
  int64_t evict(int64_t n) {
    int64_t freed = 0;
    while (freed < n) {
      const Tokens* victim = nullptr;
      uint64_t oldest = UINT64_MAX;
      for (const auto& [k, node] : nodes)
        if (pool.refs[node.block] == 1 && !has_children(k) && node.last < oldest) {
          oldest = node.last;
          victim = &k;
        }
      if (victim == nullptr) break;
      pool.unref(nodes.at(*victim).block);
      nodes.erase(*victim);
      ++freed;
    }
    return freed;
  }
  int64_t n_evictable() const {
    int64_t count = 0;
    for (const auto& [k, node] : nodes) {
      bool free = true;
      for (const auto& [k2, n2] : nodes)
        if (is_prefix(k, k2) && pool.refs[n2.block] != 1) free = false;
      count += free;
    }
    return count;
  }
  std::set<std::pair<int32_t, int64_t>> blocks() const {
    std::set<std::pair<int32_t, int64_t>> s;
    for (const auto& [k, node] : nodes) s.insert({node.block, static_cast<int64_t>(k.size()) / bs});
    return s;
  }

  OraclePool& pool;
  int64_t bs;
  std::map<Tokens, Node> nodes;
  uint64_t clock = 0;
};

struct LiveSeq {
  Tokens tokens;
  std::vector<int32_t> blocks;  // the sequence's references (matched + its own)
};

class RadixOracle : public ::testing::TestWithParam<int> {};

void expect_same(const BlockPool& pool, const RadixCache& cache, const OraclePool& opool, const OracleCache& ocache,
                 const std::string& where) {
  ASSERT_EQ(pool.n_free(), static_cast<int64_t>(opool.free.size())) << where;
  for (int32_t b = 0; b < pool.n_blocks(); ++b) ASSERT_EQ(pool.ref_count(b), opool.refs[b]) << where << " block " << b;
  ASSERT_EQ(cache.n_cached_blocks(), static_cast<int64_t>(ocache.nodes.size())) << where;
  std::set<std::pair<int32_t, int64_t>> got;
  cache.for_each_block([&](int32_t b, int64_t d) { got.insert({b, d}); });
  ASSERT_EQ(got, ocache.blocks()) << where;
  ASSERT_EQ(cache.n_evictable(), ocache.n_evictable()) << where;
}

TEST_P(RadixOracle, RandomOperationSequences) {
  const int seed = GetParam();
  std::mt19937 rng(seed);
  const int64_t bs = 1 + seed % 3, n_blocks = 24 + seed % 17;
  BlockPool pool(n_blocks);
  OraclePool opool(n_blocks);
  {
    RadixCache cache(pool, bs);
    OracleCache ocache(opool, bs);
    std::vector<LiveSeq> live;
    std::vector<Tokens> history;  // earlier prompts: new ones often extend them, so prefixes are shared
    auto rand = [&](int n) { return static_cast<int>(rng() % n); };
    for (int op = 0; op < 400; ++op) {
      const std::string where = "seed " + std::to_string(seed) + " op " + std::to_string(op);
      const int kind = rand(10);
      if (kind < 4) {  // a new sequence: match (usually), evict if short of blocks, allocate the rest
        Tokens t;
        if (!history.empty() && rand(3) > 0) {
          const Tokens& h = history[rand(static_cast<int>(history.size()))];
          t.assign(h.begin(), h.begin() + rand(static_cast<int>(h.size()) + 1));
        }
        const int extra = rand(3 * static_cast<int>(bs) + 2);
        for (int i = 0; i < extra; ++i) t.push_back(rand(3));
        if (t.empty()) t.push_back(0);
        history.push_back(t);
        LiveSeq s{t, {}};
        if (rand(4) > 0) {  // some sequences skip the lookup and compute everything themselves
          const int64_t max_tokens = static_cast<int64_t>(t.size()) - rand(2);
          auto m = cache.match(t, max_tokens);
          auto om = ocache.match(t, max_tokens);
          ASSERT_EQ(m.blocks, om) << where;
          ASSERT_EQ(m.n_tokens, static_cast<int64_t>(m.blocks.size()) * bs) << where;
          s.blocks = m.blocks;
        }
        const int64_t need = (static_cast<int64_t>(t.size()) + bs - 1) / bs - static_cast<int64_t>(s.blocks.size());
        if (pool.n_free() < need) {
          const int64_t want = need - pool.n_free();
          ASSERT_EQ(cache.evict(want), ocache.evict(want)) << where;
        }
        std::vector<int32_t> own, oown;
        const bool ok = pool.allocate(need, own).is_ok();
        ASSERT_EQ(ok, opool.allocate(need, oown)) << where;
        ASSERT_EQ(own, oown) << where;
        if (!ok) {
          pool.unref_all(s.blocks);
          for (int32_t b : s.blocks) opool.unref(b);
        } else {
          s.blocks.insert(s.blocks.end(), own.begin(), own.end());
          live.push_back(std::move(s));
        }
      } else if (kind < 6 && !live.empty()) {  // a sequence records its full blocks
        const LiveSeq& s = live[rand(static_cast<int>(live.size()))];
        ASSERT_EQ(cache.insert(s.tokens, s.blocks), ocache.insert(s.tokens, s.blocks)) << where;
      } else if (kind < 9 && !live.empty()) {  // a sequence finishes (inserting first, usually)
        const int i = rand(static_cast<int>(live.size()));
        if (rand(3) > 0) {
          ASSERT_EQ(cache.insert(live[i].tokens, live[i].blocks), ocache.insert(live[i].tokens, live[i].blocks)) << where;
        }
        pool.unref_all(live[i].blocks);
        for (int32_t b : live[i].blocks) opool.unref(b);
        live.erase(live.begin() + i);
      } else {  // memory pressure from elsewhere
        const int64_t n = rand(4);
        ASSERT_EQ(cache.evict(n), ocache.evict(n)) << where;
      }
      expect_same(pool, cache, opool, ocache, where);
      if (HasFatalFailure()) return;
    }
    for (auto& s : live) {
      pool.unref_all(s.blocks);
      for (int32_t b : s.blocks) opool.unref(b);
    }
    expect_same(pool, cache, opool, ocache, "after releasing every sequence");
    ASSERT_EQ(cache.n_evictable(), cache.n_cached_blocks());
    ASSERT_EQ(cache.evict(n_blocks), static_cast<int64_t>(ocache.nodes.size()));
  }
  EXPECT_EQ(pool.n_free(), n_blocks);  // nothing leaked: every reference came back
}

INSTANTIATE_TEST_SUITE_P(Seeds, RadixOracle, ::testing::Range(1, 41));

}  // namespace
}  // namespace mxserve::kvcache
