#include "kvcache/host_tier.h"

#include <algorithm>
#include <string>

#include "core/check.h"
#include "core/logging.h"

namespace mxserve::kvcache {

uint64_t chain_key(uint64_t parent_key, std::span<const int32_t> block_tokens) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(parent_key, 8);
  for (int32_t t : block_tokens) mix(static_cast<uint32_t>(t), 4);
  return h == 0 ? 1 : h;  // 0 is the root's key
}

HostTier::HostTier(int64_t n_slots, int64_t block_size, BlockMover& mover)
    : block_size_(block_size), mover_(mover) {
  MX_CHECK_MSG(n_slots >= 0 && block_size > 0, "host tier: " << n_slots << " slots of block size " << block_size);
  slot_entry_.assign(static_cast<size_t>(n_slots), lru_.end());
  for (int64_t s = n_slots - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
}

void HostTier::erase(Lru::iterator it) {
  slot_entry_[it->slot] = lru_.end();
  free_.push_back(it->slot);
  index_.erase(it->key);
  lru_.erase(it);
}

int32_t HostTier::take_slot() {
  if (free_.empty()) {
    auto victim = std::find_if(lru_.begin(), lru_.end(), [](const Entry& e) { return e.pins == 0; });
    if (victim == lru_.end()) return -1;
    erase(victim);
    ++counters_.dropped_blocks;
  }
  const int32_t s = free_.back();
  free_.pop_back();
  return s;
}

void HostTier::offload(const std::vector<EvictedBlock>& blocks) {
  std::vector<int32_t> dev, slots;
  {  // a freed block may still be receiving a load (the mover's per-layer loads complete with the forward)
    std::vector<int32_t> freed;
    for (const EvictedBlock& b : blocks) freed.push_back(b.block);
    const Status st = mover_.before_free(freed);
    if (!st.is_ok()) {
      MX_LOG(kError) << "host KV tier: completing the loads into " << freed.size()
                     << " evicted blocks failed: " << st.to_string();
      ++counters_.copy_errors;
    }
  }
  std::vector<Lru::iterator> fresh;
  for (const EvictedBlock& b : blocks) {
    MX_CHECK_EQ(static_cast<int64_t>(b.tokens.size()), block_size_);
    auto found = index_.find(b.key);
    if (found != index_.end()) {  // already here (a request recomputed it meanwhile): refresh its age
      lru_.splice(lru_.end(), lru_, found->second);
      continue;
    }
    const int32_t slot = take_slot();
    if (slot < 0) {
      ++counters_.dropped_blocks;
      continue;
    }
    // Pinned until the copy is issued, so a later block of this batch never takes its slot.
    lru_.push_back(Entry{b.key, b.parent_key, b.tokens, slot, 1});
    auto it = std::prev(lru_.end());
    slot_entry_[slot] = it;
    index_.emplace(b.key, it);
    dev.push_back(b.block);
    slots.push_back(slot);
    fresh.push_back(it);
  }
  if (dev.empty()) return;
  for (auto it : fresh) --it->pins;
  const Status st = mover_.to_host(dev, slots);
  if (!st.is_ok()) {
    MX_LOG(kError) << "host KV tier: offloading " << dev.size() << " blocks failed (they are dropped): "
                   << st.to_string();
    counters_.copy_errors += 1;
    counters_.dropped_blocks += static_cast<int64_t>(fresh.size());
    for (auto it : fresh) erase(it);
    return;
  }
  counters_.offloaded_blocks += static_cast<int64_t>(dev.size());
}

std::vector<int32_t> HostTier::match_and_pin(std::span<const int32_t> tokens, int64_t begin, int64_t limit,
                                             uint64_t parent_key) {
  std::vector<int32_t> slots;
  limit = std::min<int64_t>(limit, static_cast<int64_t>(tokens.size()));
  uint64_t key = parent_key;
  for (int64_t b = begin; b + block_size_ <= limit; b += block_size_) {
    const auto block_tokens = tokens.subspan(b, block_size_);
    const uint64_t k = chain_key(key, block_tokens);
    auto found = index_.find(k);
    if (found == index_.end()) break;
    Entry& e = *found->second;
    if (e.parent_key != key || !std::equal(block_tokens.begin(), block_tokens.end(), e.tokens.begin())) break;
    ++e.pins;
    lru_.splice(lru_.end(), lru_, found->second);  // touched: most recently used
    slots.push_back(e.slot);
    key = k;
  }
  return slots;
}

void HostTier::unpin(const std::vector<int32_t>& slots) {
  for (int32_t s : slots) {
    MX_CHECK_MSG(s >= 0 && s < n_slots() && slot_entry_[s] != lru_.end() && slot_entry_[s]->pins > 0,
                 "host tier: unpin of slot " << s << " that is not pinned");
    --slot_entry_[s]->pins;
  }
}

Status HostTier::load(const std::vector<int32_t>& slots, std::span<const int32_t> device_blocks) {
  MX_CHECK_LE(device_blocks.size(), slots.size());
  const size_t n = device_blocks.size();
  std::vector<int32_t> loaded(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(n));
  const Status st = n > 0 ? mover_.from_host(loaded, device_blocks) : Status::ok();
  unpin(slots);
  if (!st.is_ok()) {
    ++counters_.copy_errors;
    return st;
  }
  // The slots are reused only by later copies, which the mover orders after this one (one copy stream).
  for (int32_t s : loaded) erase(slot_entry_[s]);
  counters_.loaded_blocks += static_cast<int64_t>(n);
  return Status::ok();
}

int64_t HostTier::n_pinned() const {
  int64_t n = 0;
  for (const Entry& e : lru_) n += e.pins > 0;
  return n;
}

std::vector<uint64_t> HostTier::lru_keys() const {
  std::vector<uint64_t> keys;
  for (const Entry& e : lru_) keys.push_back(e.key);
  return keys;
}

Status HostTier::check() const {
  if (n_used() + n_free() != n_slots() || static_cast<int64_t>(lru_.size()) != n_used())
    return internal_error("host tier: " + std::to_string(n_used()) + " used + " + std::to_string(n_free()) +
                          " free != " + std::to_string(n_slots()) + " slots (LRU holds " +
                          std::to_string(lru_.size()) + ")");
  std::vector<int> seen(slot_entry_.size(), 0);
  for (int32_t s : free_) ++seen[s];
  for (const Entry& e : lru_) {
    ++seen[e.slot];
    auto it = index_.find(e.key);
    if (it == index_.end() || &*it->second != &e) return internal_error("host tier: index and LRU disagree");
  }
  for (size_t s = 0; s < seen.size(); ++s)
    if (seen[s] != 1) return internal_error("host tier: slot " + std::to_string(s) + " is in " +
                                            std::to_string(seen[s]) + " places");
  return Status::ok();
}

}  // namespace mxserve::kvcache
