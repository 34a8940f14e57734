// HostTier: the host-memory level of the prefix cache (--kv-cache-host-memory). Blocks the radix cache
// evicts from the device pool are copied, whole (every tensor of the cache layout: K/V, MLA latent, DSA
// indexer keys, scales, the MTP layer's cache), into host slots instead of being dropped; a request whose
// prefix continues past the device match into host entries gets fresh device blocks and the bytes copied
// back, layer by layer, while its prefill runs (the mover's loads are awaited per layer by the forward).
// An entry is keyed by the chain key of its prefix (chain_key(parent key, block tokens), root key 0, the same
// keys the radix cache gives its nodes) and holds its block tokens and parent key, both compared on lookup.
// Owns: the host slots (free list, LRU order, pins) and the key -> slot index. Does not own the bytes'
// transport (BlockMover: the executor's, over its whole cache layout) nor the device pool.
// Invariants: n_used() + n_free() == n_slots(); an entry lives in exactly one slot; a pinned entry (being
// loaded) is never evicted; a loaded entry leaves the tier (its block lives on the device again).
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace mxserve::kvcache {

// The chain key of a block: FNV-1a of the parent's key and the block's token ids.
uint64_t chain_key(uint64_t parent_key, std::span<const int32_t> block_tokens);

// Copies whole blocks between the device cache (block ids) and host slots (slot ids). Calls take effect in
// call order. from_host may complete later, layer by layer, overlapped with the next forward (the executor's
// mover: runtime/kv_host_mover.h, kvcache/layer_load_gate.h): its errors are the ones found when it is called
// (a slot or block out of range, named); the bytes are in place for every forward and copy that follows.
class BlockMover {
 public:
  virtual ~BlockMover() = default;
  virtual Status to_host(std::span<const int32_t> device_blocks, std::span<const int32_t> host_slots) = 0;
  virtual Status from_host(std::span<const int32_t> host_slots, std::span<const int32_t> device_blocks) = 0;
  // The device blocks are leaving the device cache (evicted; the pool may hand them out at once): a load
  // still in flight into one of them completes before any later device work.
  virtual Status before_free(std::span<const int32_t> device_blocks) {
    (void)device_blocks;
    return Status::ok();
  }
};

// A device block the radix cache is evicting (its contents still intact until the pool hands it out).
struct EvictedBlock {
  uint64_t parent_key = 0;
  uint64_t key = 0;
  std::vector<int32_t> tokens;  // [block_size]
  int32_t block = -1;
};

struct HostTierCounters {
  int64_t offloaded_blocks = 0;  // copied device -> host
  int64_t loaded_blocks = 0;     // copied host -> device (prefix hits served by the host tier)
  int64_t dropped_blocks = 0;    // host entries evicted (LRU) or offloads skipped for want of a slot
  int64_t copy_errors = 0;       // a mover call failed (logged; those blocks are dropped)
};

class HostTier {
 public:
  HostTier(int64_t n_slots, int64_t block_size, BlockMover& mover);

  // Copies the evicted device blocks into host slots (evicting least-recently-used unpinned entries when
  // full). Blocks already present under the same key only refresh their entry.
  void offload(const std::vector<EvictedBlock>& blocks);
  // The host entries continuing a prefix: tokens[begin, begin + bs), ... up to `limit` tokens, starting from
  // the chain key `parent_key` of tokens[0, begin). Pins and returns their slots in prefix order.
  std::vector<int32_t> match_and_pin(std::span<const int32_t> tokens, int64_t begin, int64_t limit,
                                     uint64_t parent_key);
  // Copies slots[i] into device_blocks[i] for i < device_blocks.size() and removes those entries; unpins the
  // rest of `slots` (left in the tier). A failed copy is returned (nothing is removed then).
  Status load(const std::vector<int32_t>& slots, std::span<const int32_t> device_blocks);
  void unpin(const std::vector<int32_t>& slots);

  int64_t n_slots() const { return static_cast<int64_t>(slot_entry_.size()); }
  int64_t n_used() const { return static_cast<int64_t>(index_.size()); }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t n_pinned() const;
  const HostTierCounters& counters() const { return counters_; }
  // Keys in LRU order, oldest first (tests).
  std::vector<uint64_t> lru_keys() const;
  // n_used() + n_free() == n_slots(), every slot in one place, the LRU list and the index agree.
  Status check() const;

 private:
  struct Entry {
    uint64_t key = 0;
    uint64_t parent_key = 0;
    std::vector<int32_t> tokens;
    int32_t slot = -1;
    int32_t pins = 0;
  };
  using Lru = std::list<Entry>;  // oldest first
  int32_t take_slot();           // a free slot, evicting the oldest unpinned entry if needed; -1: none
  void erase(Lru::iterator it);  // frees its slot

  int64_t block_size_;
  BlockMover& mover_;
  Lru lru_;
  std::unordered_map<uint64_t, Lru::iterator> index_;
  std::vector<Lru::iterator> slot_entry_;  // per slot: its entry, lru_.end() when free
  std::vector<int32_t> free_;
  HostTierCounters counters_;
};

}  // namespace mxserve::kvcache
