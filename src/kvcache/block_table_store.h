// Persistent block tables on the device: one i32 tensor [max_rows, max_blocks_per_seq], a row per live
// sequence, so a step uploads only what changed instead of every sequence's whole table.
//   TableRows (host, the scheduler's): hands out rows at admission and takes them back on finish /
//   preemption / abort; every hand-out gets a fresh lease number, so a reused row is never mistaken for
//   its previous holder.
//   BlockTableStore (the KV cache's, on the backend): per row, the lease it was last synced for and how
//   many leading blocks the device row holds. sync() uploads only the blocks past that count (a tail copy);
//   a new lease re-uploads the row from block 0 (prefix-shared blocks at admission included).
// Invariant: for a row synced with lease L, device[row][0, synced) == the holder's host table[0, synced).
// This holds because a live sequence's table only grows at its end (blocks are appended by reserve; block
// ids are never replaced while the sequence holds them: tree compaction moves slots, not ids) and a
// released table is cleared together with its row.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace mxserve::kvcache {

struct TableLease {
  int32_t row = -1;    // -1: no row (not admitted)
  uint64_t lease = 0;  // unique per hand-out (never 0 for a held row)
};

class TableRows {
 public:
  explicit TableRows(int64_t max_rows);
  // A free row with a new lease; row -1 when every row is held.
  TableLease acquire();
  void release(int32_t row);  // CHECKs that the row is held
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t max_rows() const { return max_rows_; }

 private:
  int64_t max_rows_;
  std::vector<int32_t> free_;  // a stack: lowest rows first out
  std::vector<bool> held_;
  uint64_t next_lease_ = 1;
};

class BlockTableStore {
 public:
  using Allocator = std::function<Tensor(DType, Shape)>;
  // Copies host i32 values into the device tensor's flat elements starting at offset (stream ordered).
  using Writer = std::function<void(Tensor& dst, int64_t offset, const Tensor& host)>;
  BlockTableStore(int64_t max_rows, int64_t max_blocks_per_seq, int64_t n_blocks, const Allocator& alloc,
                  Writer write);

  // Makes device row `row` hold `table` (the holder's whole host table) for lease `lease`, uploading only
  // the blocks it does not hold yet. Errors name the row: out of range, lease 0, a table wider than a row,
  // a block id outside the pool.
  Status sync(int32_t row, uint64_t lease, std::span<const int32_t> table);

  const Tensor& device() const { return table_; }  // i32 [max_rows, max_blocks_per_seq]
  int64_t max_rows() const { return max_rows_; }
  int64_t max_blocks_per_seq() const { return max_blocks_; }
  int64_t synced(int32_t row) const { return rows_.at(row).synced; }
  uint64_t lease(int32_t row) const { return rows_.at(row).lease; }
  int64_t uploaded_blocks() const { return uploaded_blocks_; }  // total blocks written (incrementality checks)
  int64_t uploads() const { return uploads_; }                  // write calls

 private:
  struct Row {
    uint64_t lease = 0;
    int64_t synced = 0;
  };
  int64_t max_rows_, max_blocks_, n_blocks_;
  Writer write_;
  Tensor table_;
  std::vector<Row> rows_;
  int64_t uploaded_blocks_ = 0;
  int64_t uploads_ = 0;
};

}  // namespace mxserve::kvcache
