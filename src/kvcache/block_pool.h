// BlockPool: reference-counted KV blocks. A block's count is the number of sequences using it plus one
// while the prefix cache holds it. Count 0 = free. Owns which blocks are free and their counts; does not
// own what a block holds (the KV tensors) or which tokens it caches (RadixCache).
// Invariant: n_free() + n_referenced() == n_blocks(), and a freed block is never referenced again until
// handed out anew by allocate().
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace mxserve::kvcache {

class BlockPool {
 public:
  explicit BlockPool(int64_t n_blocks);

  // Appends n fresh blocks (count 1 each) to out, or fails allocating nothing.
  Status allocate(int64_t n, std::vector<int32_t>& out);
  void ref(int32_t block);
  // Drops one reference; the block is freed when the count reaches 0.
  void unref(int32_t block);
  void unref_all(const std::vector<int32_t>& blocks);

  int32_t ref_count(int32_t block) const { return refs_[block]; }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t n_blocks() const { return static_cast<int64_t>(refs_.size()); }
  int64_t n_referenced() const { return n_blocks() - n_free(); }

 private:
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // LIFO: recently freed (cache-warm) blocks are reused first
};

}  // namespace mxserve::kvcache
