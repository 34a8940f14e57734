// KvHostMover: the host KV tier's BlockMover (kvcache/host_tier.h) over a KvCache's whole layout -- every
// tensor of every cached layer (K/V, MLA latent, DSA indexer keys, their scales, the MTP layer's), through
// the backend's HostCopyEngine (backend/host_copy.h: pinned memory and a side stream on CUDA, memcpy on the
// CPU) -- and the cache's LayerLoadGate (kvcache/layer_load_gate.h) while loads are in flight.
// Host layout: slot s holds bytes [s * bytes_per_block, (s + 1) * bytes_per_block); inside it the tensors in
// KvCache::all_tensors() order (layer by layer, data then scales), each block_size rows. A device block's
// rows are contiguous in every tensor (slot of token j = block * block_size + j % block_size), so one block
// of one tensor is one copy.
// Loads (from_host) go per cached layer: every (slot, block) pair is checked when the scheduler calls (an
// error names the pair, nothing is copied and the prefix is recomputed), then layer 0's copies, layer 1's,
// ... are issued (CUDA: at once, on the copy stream, one event per layer; CPU: kept until waited) and the
// mover installs itself as the cache's gate: the forward's wait(l) before layer l's attention orders it
// after layer l's copies only (CUDA: a stream wait, no host sync; CPU: layer l's memcpys then), so the
// copies of later layers overlap the compute of earlier ones. Every layer not yet waited is completed before
// an offload (to_host), before a load target leaves the device cache (before_free) and on settle() (the
// executor's paths that read the cache without the gate: CUDA graph replays, slot copies).
// Invariant: the gate is installed exactly while some layer has copies not yet waited for.
// Refuses at construction a layout role it does not know (a new role must be added here knowingly) and a
// layout whose tensors do not add up to the spec's bytes per block (something would be left behind).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "kvcache/host_tier.h"
#include "kvcache/kv_cache.h"
#include "kvcache/layer_load_gate.h"

namespace mxserve::backend {
class HostCopyEngine;
}

namespace mxserve::runtime {

// The roles the host tier carries; an error naming the layer and role for any other.
Status check_host_tier_roles(const kvcache::KvCacheSpec& spec);

class KvHostMover final : public kvcache::BlockMover, public kvcache::LayerLoadGate {
 public:
  static Result<std::unique_ptr<KvHostMover>> make(backend::Backend& be, kvcache::KvCache& kv, int64_t n_slots);
  ~KvHostMover() override;

  Status to_host(std::span<const int32_t> device_blocks, std::span<const int32_t> host_slots) override;
  Status from_host(std::span<const int32_t> host_slots, std::span<const int32_t> device_blocks) override;
  Status before_free(std::span<const int32_t> device_blocks) override;
  Status wait(int64_t cache_layer) override;
  // Every layer's loads ordered before any later device work; the gate leaves the cache.
  Status settle();

  // Off: every load is ordered before all later device work as soon as it is issued (the whole hit before
  // the step's forward starts): the baseline the per-layer overlap is measured against (benchmarks). On by
  // default.
  void set_per_layer(bool on) { per_layer_ = on; }
  bool per_layer() const { return per_layer_; }

  bool loads_pending() const { return !targets_.empty(); }
  int64_t n_slots() const { return n_slots_; }

 private:
  struct Part {  // one cache tensor: its layer and where its block sits in a host slot
    Tensor* tensor = nullptr;
    int64_t layer = 0;
    uint64_t slot_offset = 0;      // bytes into the host slot
    uint64_t bytes_per_block = 0;  // block_size rows
  };
  KvHostMover(kvcache::KvCache& kv, std::unique_ptr<backend::HostCopyEngine> engine, std::vector<Part> parts,
              int64_t n_slots);

  kvcache::KvCache& kv_;
  std::unique_ptr<backend::HostCopyEngine> engine_;
  std::vector<Part> parts_;
  int64_t n_slots_, n_layers_, n_blocks_;  // n_blocks_: the cache's (the pool's + the scratch block)
  uint64_t bytes_per_block_;
  std::vector<bool> layer_pending_;       // per cached layer: copies issued, not yet waited
  std::unordered_set<int32_t> targets_;   // device blocks with a load not yet complete in every layer
  bool per_layer_ = true;
};

}  // namespace mxserve::runtime
