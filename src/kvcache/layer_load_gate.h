// LayerLoadGate: the per-layer readiness of a KV cache whose blocks are being copied in while a forward runs
// (the host KV tier, kvcache/host_tier.h: blocks a request hits in host memory are loaded back layer by
// layer on a copy stream, overlapped with the forward's compute). A forward calls wait(l) before its first
// read of cached layer l (the decoder frame does, before each layer's attention; the MTP layer is cached
// layer n_layers); after it returns, every byte of layer l the pending loads carry is in place for the work
// the forward enqueues next. CUDA: a stream wait on layer l's copy event (no host sync); CPU: the copies of
// layer l themselves. A KvCache without a gate installed (KvCache::load_gate() == nullptr: nothing pending,
// e.g. every decode step and every CUDA graph capture) costs the forward nothing.
// Invariant: wait(l) is cheap and idempotent; an error names the layer and the blocks whose copy failed.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace mxserve::kvcache {

class LayerLoadGate {
 public:
  virtual ~LayerLoadGate() = default;
  virtual Status wait(int64_t cache_layer) = 0;
};

}  // namespace mxserve::kvcache
