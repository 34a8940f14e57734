#include "kvcache/radix_cache.h"

#include <algorithm>
#include <queue>

#include "core/check.h"

namespace mxserve::kvcache {

struct RadixCache::Node {
  std::vector<int32_t> tokens;  // [block_size]
  int32_t block = -1;
  Node* parent = nullptr;
  uint64_t last_access = 0;
  uint64_t key = 0;  // chain_key(parent->key, tokens) (host_tier.h); the root's is 0
  // Children by the hash of their block's tokens; collisions resolved by comparing tokens.
  std::unordered_multimap<uint64_t, std::unique_ptr<Node>> children;
};

RadixCache::RadixCache(BlockPool& pool, int64_t block_size)
    : pool_(pool), block_size_(block_size), root_(std::make_unique<Node>()) {}

RadixCache::~RadixCache() {
  // Return the tree's references so the pool's accounting stays exact if the pool outlives the cache.
  std::vector<Node*> stack = {root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (n->block >= 0) pool_.unref(n->block);
    for (auto& [h, c] : n->children) stack.push_back(c.get());
  }
}

uint64_t RadixCache::hash_block(std::span<const int32_t> t) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the 4 bytes of each id
  for (int32_t v : t) {
    for (int i = 0; i < 4; ++i) {
      h ^= static_cast<uint64_t>((static_cast<uint32_t>(v) >> (8 * i)) & 0xff);
      h *= 1099511628211ull;
    }
  }
  return h;
}

RadixCache::Node* RadixCache::child(Node* parent, std::span<const int32_t> block_tokens) const {
  auto range = parent->children.equal_range(hash_block(block_tokens));
  for (auto it = range.first; it != range.second; ++it)
    if (std::equal(block_tokens.begin(), block_tokens.end(), it->second->tokens.begin())) return it->second.get();
  return nullptr;
}

RadixCache::Match RadixCache::match(std::span<const int32_t> tokens, int64_t max_tokens) {
  Match m;
  const int64_t limit = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  Node* node = root_.get();
  const uint64_t now = ++clock_;
  for (int64_t begin = 0; begin + block_size_ <= limit; begin += block_size_) {
    Node* c = child(node, tokens.subspan(begin, block_size_));
    if (c == nullptr) break;
    c->last_access = now;
    pool_.ref(c->block);
    m.blocks.push_back(c->block);
    m.key = c->key;
    node = c;
  }
  m.n_tokens = static_cast<int64_t>(m.blocks.size()) * block_size_;
  return m;
}

int64_t RadixCache::match_length(std::span<const int32_t> tokens, int64_t max_tokens) const {
  const int64_t limit = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  Node* node = root_.get();
  int64_t n = 0;
  for (; n + block_size_ <= limit; n += block_size_) {
    node = child(node, tokens.subspan(n, block_size_));
    if (node == nullptr) break;
  }
  return n;
}

int64_t RadixCache::insert(std::span<const int32_t> tokens, std::span<const int32_t> blocks) {
  const int64_t n_full = std::min<int64_t>(static_cast<int64_t>(tokens.size()) / block_size_,
                                           static_cast<int64_t>(blocks.size()));
  Node* node = root_.get();
  const uint64_t now = ++clock_;
  int64_t added = 0;
  for (int64_t i = 0; i < n_full; ++i) {
    auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    Node* c = child(node, block_tokens);
    if (c == nullptr) {
      auto fresh = std::make_unique<Node>();
      fresh->tokens.assign(block_tokens.begin(), block_tokens.end());
      fresh->block = blocks[i];
      fresh->parent = node;
      fresh->key = chain_key(node->key, block_tokens);
      pool_.ref(blocks[i]);
      c = fresh.get();
      node->children.emplace(hash_block(block_tokens), std::move(fresh));
      ++n_nodes_;
      ++added;
    }
    c->last_access = now;
    node = c;
  }
  return added;
}

void RadixCache::visit_blocks(const std::function<void(int32_t, int64_t)>& f) const {
  std::vector<std::pair<const Node*, int64_t>> stack = {{root_.get(), 0}};
  while (!stack.empty()) {
    auto [n, depth] = stack.back();
    stack.pop_back();
    if (n->block >= 0) f(n->block, depth);
    for (const auto& [h, c] : n->children) stack.push_back({c.get(), depth + 1});
  }
}

int64_t RadixCache::n_evictable() const {
  // A node is evictable once no sequence references its block or any block below it (evict() takes leaves
  // only, so a tree-only node above a sequence's block stays until that block is released). Post-order with
  // an explicit stack of frames (each frame ANDs its children's answers into `free`): no allocation per node.
  struct Frame {
    const Node* n;
    decltype(root_->children.cbegin()) next;  // the next child to visit
    bool free;                                // every finished child's subtree is free
  };
  int64_t count = 0;
  std::vector<Frame> stack = {{root_.get(), root_->children.cbegin(), true}};
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.next != f.n->children.cend()) {
      const Node* c = (f.next++)->second.get();
      stack.push_back({c, c->children.cbegin(), true});  // f is not used after this
      continue;
    }
    const Node* n = f.n;
    const bool free = f.free && (n == root_.get() || pool_.ref_count(n->block) == 1);
    stack.pop_back();
    if (free && n != root_.get()) ++count;
    if (!stack.empty()) stack.back().free = stack.back().free && free;
  }
  return count;
}

int64_t RadixCache::evict(int64_t n) {
  if (n <= 0) return 0;
  auto older = [](const Node* a, const Node* b) { return a->last_access > b->last_access; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(older)> leaves(older);
  std::vector<Node*> stack = {root_.get()};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (node != root_.get() && node->children.empty() && pool_.ref_count(node->block) == 1) leaves.push(node);
    for (auto& [h, c] : node->children) stack.push_back(c.get());
  }
  int64_t freed = 0;
  std::vector<EvictedBlock> evicted;
  while (freed < n && !leaves.empty()) {
    Node* leaf = leaves.top();
    leaves.pop();
    Node* parent = leaf->parent;
    if (sink_) evicted.push_back(EvictedBlock{parent->key, leaf->key, leaf->tokens, leaf->block});
    pool_.unref(leaf->block);
    --n_nodes_;
    ++freed;
    auto range = parent->children.equal_range(hash_block(leaf->tokens));
    for (auto it = range.first; it != range.second; ++it)
      if (it->second.get() == leaf) {
        parent->children.erase(it);
        break;
      }
    // The parent may have become an evictable leaf itself.
    if (parent != root_.get() && parent->children.empty() && pool_.ref_count(parent->block) == 1) leaves.push(parent);
  }
  // The freed blocks keep their contents until the pool hands them out again, which only happens after
  // this returns: the sink copies them out now.
  if (sink_ && !evicted.empty()) sink_(evicted);
  return freed;
}

}  // namespace mxserve::kvcache
