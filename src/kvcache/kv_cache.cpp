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

BlockAllocator::BlockAllocator(int64_t n_blocks) : n_blocks_(n_blocks) {
  free_.reserve(n_blocks);
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

Status BlockAllocator::allocate(int64_t n, std::vector<int32_t>& out) {
  if (n > n_free())
    return out_of_memory("KV cache: " + std::to_string(n) + " blocks requested, " + std::to_string(n_free()) +
                         " free of " + std::to_string(n_blocks_));
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(free_.back());
    free_.pop_back();
  }
  return Status::ok();
}

void BlockAllocator::free(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    MX_CHECK(b >= 0 && b < n_blocks_);
    free_.push_back(b);
  }
  MX_CHECK_LE(n_free(), n_blocks_);
}

}  // namespace mxserve::kvcache
