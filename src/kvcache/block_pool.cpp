#include "kvcache/block_pool.h"

#include <algorithm>

#include "core/check.h"

namespace mxserve::kvcache {

BlockPool::BlockPool(int64_t n_blocks, int n_ranges) : refs_(n_blocks, 0), free_(n_ranges) {
  MX_CHECK_MSG(n_ranges >= 1 && n_ranges <= std::max<int64_t>(n_blocks, 1),
               "BlockPool: " << n_ranges << " ranges of " << n_blocks << " blocks");
  for (int r = 0; r < n_ranges; ++r) {
    const int64_t begin = range_begin(r), end = range_begin(n_blocks, n_ranges, r + 1);
    free_[r].reserve(end - begin);
    for (int64_t b = end - 1; b >= begin; --b) free_[r].push_back(static_cast<int32_t>(b));
  }
}

int64_t BlockPool::n_free() const {
  int64_t n = 0;
  for (const auto& f : free_) n += static_cast<int64_t>(f.size());
  return n;
}

int BlockPool::range_of(int32_t block) const {
  MX_CHECK_MSG(block >= 0 && block < n_blocks(), "invalid block " << block);
  int r = static_cast<int>(static_cast<int64_t>(block) * n_ranges() / n_blocks());
  while (r > 0 && block < range_begin(r)) --r;  // floor division may land one range late
  while (r + 1 < n_ranges() && block >= range_begin(r + 1)) ++r;
  return r;
}

Status BlockPool::allocate(int64_t n, std::vector<int32_t>& out, int range) {
  MX_CHECK_MSG(range >= 0 && range < n_ranges(), "BlockPool: range " << range << " of " << n_ranges());
  std::vector<int32_t>& free = free_[range];
  if (n > static_cast<int64_t>(free.size()))
    return out_of_memory("KV cache: " + std::to_string(n) + " blocks requested, " + std::to_string(free.size()) +
                         " free of " + std::to_string(n_blocks()) +
                         (n_ranges() > 1 ? " (in range " + std::to_string(range) + " of " +
                                               std::to_string(n_ranges()) + ")"
                                         : std::string()));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t b = free.back();
    free.pop_back();
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
  if (--refs_[block] == 0) free_[n_ranges() == 1 ? 0 : range_of(block)].push_back(block);
}

void BlockPool::unref_all(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) unref(b);
}

}  // namespace mxserve::kvcache
