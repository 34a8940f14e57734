#include "kvcache/kv_cache.h"

#include "core/check.h"

namespace mxserve::kvcache {

uint64_t KvCacheSpec::bytes() const {
  return 2ull * n_layers * dtype_bytes(dtype, static_cast<uint64_t>(n_blocks * block_size * kv_width())).value_or(0);
}

KvCache::KvCache(const KvCacheSpec& spec, const Allocator& alloc) : spec_(spec) {
  for (int64_t l = 0; l < spec.n_layers; ++l) {
    k_.push_back(alloc(spec.dtype, {spec.n_blocks * spec.block_size, spec.kv_width()}));
    v_.push_back(alloc(spec.dtype, {spec.n_blocks * spec.block_size, spec.kv_width()}));
  }
}

}  // namespace mxserve::kvcache
