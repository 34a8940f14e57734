// BlockPool: reference-counted KV blocks. A block's count is the number of sequences using it plus one
// while the prefix cache holds it. Count 0 = free. Owns which blocks are free and their counts; does not
// own what a block holds (the KV tensors) or which tokens it caches (RadixCache).
// Ranges (data parallelism, docs/parallel.md): the ids split into n_ranges contiguous ranges, range r =
// [r * N / n_ranges, (r + 1) * N / n_ranges), one per DP rank; allocate() hands out blocks of one range only.
// Invariant: n_free() + n_referenced() == n_blocks(), and a freed block is never referenced again until
// handed out anew by allocate(); a block is always on its own range's free list.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace mxserve::kvcache {

class BlockPool {
 public:
  explicit BlockPool(int64_t n_blocks, int n_ranges = 1);

  // Appends n fresh blocks (count 1 each) of `range` to out, or fails allocating nothing.
  Status allocate(int64_t n, std::vector<int32_t>& out, int range = 0);
  void ref(int32_t block);
  // Drops one reference; the block is freed when the count reaches 0.
  void unref(int32_t block);
  void unref_all(const std::vector<int32_t>& blocks);

  int32_t ref_count(int32_t block) const { return refs_[block]; }
  int64_t n_free() const;
  int64_t n_free(int range) const { return static_cast<int64_t>(free_[range].size()); }
  int64_t n_blocks() const { return static_cast<int64_t>(refs_.size()); }
  int64_t n_referenced() const { return n_blocks() - n_free(); }
  int n_ranges() const { return static_cast<int>(free_.size()); }
  int64_t range_begin(int range) const { return range_begin(n_blocks(), n_ranges(), range); }
  int range_of(int32_t block) const;
  // The first block of `range` when n_blocks split into n_ranges (the end of range r is range_begin(r + 1)).
  static int64_t range_begin(int64_t n_blocks, int n_ranges, int range) { return range * n_blocks / n_ranges; }

 private:
  std::vector<int32_t> refs_;
  std::vector<std::vector<int32_t>> free_;  // per range, LIFO: recently freed (cache-warm) blocks are reused first
};

}  // namespace mxserve::kvcache
