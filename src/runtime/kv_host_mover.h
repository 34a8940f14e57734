// KvHostMover: the host KV tier's BlockMover (kvcache/host_tier.h) over a KvCache's whole layout -- every
// tensor of every cached layer as KvCache::all_tensors() lists them (K/V, MLA latent, DSA indexer keys,
// their scales, the MTP layer's), through the backend's HostCopyEngine (backend/host_copy.h: pinned
// memory and a side stream on CUDA, memcpy on the CPU).
// Host layout: slot s holds bytes [s * bytes_per_block, (s + 1) * bytes_per_block); inside it the tensors in
// all_tensors() order, each block_size rows. A device block's rows are contiguous in every tensor (slot of
// token j = block * block_size + j % block_size), so one block of one tensor is one copy.
// Refuses at construction a layout role it does not know (a new role must be added here knowingly) and a
// layout whose tensors do not add up to the spec's bytes per block (something would be left behind).
#pragma once

#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "kvcache/host_tier.h"
#include "kvcache/kv_cache.h"

namespace mxserve::runtime {

// The roles the host tier carries; an error naming the layer and role for any other.
Status check_host_tier_roles(const kvcache::KvCacheSpec& spec);

Result<std::unique_ptr<kvcache::BlockMover>> make_kv_host_mover(backend::Backend& be, kvcache::KvCache& kv,
                                                                int64_t n_slots);

}  // namespace mxserve::runtime
