#include "kvcache/block_pool.h"

#include "core/check.h"

namespace mxserve::kvcache {

BlockPool::BlockPool(int64_t n_blocks) : refs_(n_blocks, 0) {
  free_.reserve(n_blocks);
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

Status BlockPool::allocate(int64_t n, std::vector<int32_t>& out) {
  if (n > n_free())
    return out_of_memory("KV cache: " + std::to_string(n) + " blocks requested, " + std::to_string(n_free()) +
                         " free of " + std::to_string(n_blocks()));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t b = free_.back();
    free_.pop_back();
    MX_CHECK_EQ(refs_[b], 0);
    refs_[b] = 1;
    out.push_back(b);
  }
  return Status::ok();
}

void BlockPool::ref(int32_t block) {
  MX_CHECK_MSG(block >= 0 && block < n_blocks() && refs_[block] > 0, "ref of free or invalid block " << block);
  ++refs_[block];
}

void BlockPool::unref(int32_t block) {
  MX_CHECK_MSG(block >= 0 && block < n_blocks() && refs_[block] > 0, "unref of free or invalid block " << block);
  if (--refs_[block] == 0) free_.push_back(block);
}

void BlockPool::unref_all(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) unref(b);
}

}  // namespace mxserve::kvcache
