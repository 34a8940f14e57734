// RadixCache: prefix reuse at block granularity. Each node is one full block of block_size tokens
// (its token ids and the KV block holding them); a path from the root spells a cached prefix.
// Owns: the tree, one BlockPool reference per node, LRU eviction of unreferenced leaves.
// Does not own: sequences' own references (they ref/unref through the pool).
// With a host tier (host_tier.h) an evict sink receives the evicted blocks (their chain keys, tokens and
// block ids, contents still intact) before evict() returns, so it can copy them out instead of losing them.
// Invariants: a node's block is referenced by the tree exactly once; only leaves are evicted, so every
// cached path stays a valid prefix; lookup cost is linear in the prompt length (one hash per block).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvcache/block_pool.h"
#include "kvcache/host_tier.h"

namespace mxserve::kvcache {

class RadixCache {
 public:
  RadixCache(BlockPool& pool, int64_t block_size);
  ~RadixCache();

  struct Match {
    std::vector<int32_t> blocks;  // one per matched full block, each ref'd for the caller
    int64_t n_tokens = 0;         // blocks.size() * block_size
    uint64_t key = 0;             // chain key of the last matched block (0: none matched)
  };
  // Longest cached prefix of tokens[0 : max_tokens) in whole blocks. The caller owns one reference to
  // each returned block (unref when done). Touches the matched path (LRU).
  Match match(std::span<const int32_t> tokens, int64_t max_tokens);
  // The token count match() would return, without taking references or touching the LRU order.
  int64_t match_length(std::span<const int32_t> tokens, int64_t max_tokens) const;

  // Records the full blocks of a sequence: blocks[i] holds tokens[i*bs : (i+1)*bs]. Blocks already cached
  // for the same tokens are kept as they are (the sequence keeps using its own copy). Returns the number
  // of new nodes.
  int64_t insert(std::span<const int32_t> tokens, std::span<const int32_t> blocks);

  // Frees up to n blocks by evicting least-recently-used leaves that no sequence references.
  // Returns the number of blocks actually freed.
  int64_t evict(int64_t n);
  // Receives every batch of blocks evict() frees (called once per evict() call that freed any), before
  // the pool can hand them out again. Unset: evicted blocks are simply dropped.
  using EvictSink = std::function<void(const std::vector<EvictedBlock>&)>;
  void set_evict_sink(EvictSink sink) { sink_ = std::move(sink); }

  int64_t n_cached_blocks() const { return n_nodes_; }
  // Cached blocks evict() could free by repeated calls: only the tree references them or anything below them.
  int64_t n_evictable() const;
  int64_t block_size() const { return block_size_; }
  // Visits every cached block (for invariant checks): f(block, depth) with depth 1 = first block.
  template <typename F>
  void for_each_block(F&& f) const;

 private:
  struct Node;
  Node* child(Node* parent, std::span<const int32_t> block_tokens) const;
  uint64_t hash_block(std::span<const int32_t> block_tokens) const;
  void visit_blocks(const std::function<void(int32_t, int64_t)>& f) const;

  BlockPool& pool_;
  int64_t block_size_;
  std::unique_ptr<Node> root_;
  int64_t n_nodes_ = 0;
  uint64_t clock_ = 0;
  EvictSink sink_;
};

template <typename F>
void RadixCache::for_each_block(F&& f) const {
  visit_blocks([&](int32_t block, int64_t depth) { f(block, depth); });
}

}  // namespace mxserve::kvcache
