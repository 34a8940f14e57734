#include "kvcache/block_table_store.h"

#include <string>

#include "core/check.h"

namespace mxserve::kvcache {

TableRows::TableRows(int64_t max_rows) : max_rows_(max_rows), held_(static_cast<size_t>(max_rows), false) {
  MX_CHECK_GT(max_rows, 0);
  free_.reserve(static_cast<size_t>(max_rows));
  for (int64_t r = max_rows - 1; r >= 0; --r) free_.push_back(static_cast<int32_t>(r));
}

TableLease TableRows::acquire() {
  if (free_.empty()) return {};
  const int32_t row = free_.back();
  free_.pop_back();
  held_[row] = true;
  return {row, next_lease_++};
}

void TableRows::release(int32_t row) {
  MX_CHECK_MSG(row >= 0 && row < max_rows_ && held_[row], "TableRows: release of row " << row << ", not held");
  held_[row] = false;
  free_.push_back(row);
}

BlockTableStore::BlockTableStore(int64_t max_rows, int64_t max_blocks_per_seq, int64_t n_blocks,
                                 const Allocator& alloc, Writer write)
    : max_rows_(max_rows), max_blocks_(max_blocks_per_seq), n_blocks_(n_blocks), write_(std::move(write)),
      rows_(static_cast<size_t>(max_rows)) {
  MX_CHECK_GT(max_rows, 0);
  MX_CHECK_GT(max_blocks_per_seq, 0);
  table_ = alloc(DType::kI32, {max_rows, max_blocks_per_seq});
  // Rows are read only up to each holder's context; zero them anyway so a stray read stays in the pool.
  Tensor zeros = Tensor::zeros(DType::kI32, {max_rows * max_blocks_per_seq});
  write_(table_, 0, zeros);
}

Status BlockTableStore::sync(int32_t row, uint64_t lease, std::span<const int32_t> table) {
  const std::string where = "block-table store: row " + std::to_string(row);
  if (row < 0 || row >= max_rows_)
    return invalid_argument(where + " outside [0, " + std::to_string(max_rows_) + ")");
  if (lease == 0) return invalid_argument(where + ": lease 0 (the row was never acquired)");
  const int64_t n = static_cast<int64_t>(table.size());
  if (n > max_blocks_)
    return invalid_argument(where + ": " + std::to_string(n) + " blocks exceed the row width " +
                            std::to_string(max_blocks_) + " (max_model_len / block_size)");
  Row& r = rows_[row];
  if (r.lease != lease) {
    r.lease = lease;
    r.synced = 0;
  }
  if (n < r.synced) r.synced = n;  // a shorter table: the tail past it is never read
  if (n == r.synced) return Status::ok();
  for (int64_t i = r.synced; i < n; ++i)
    if (table[i] < 0 || table[i] >= n_blocks_)
      return invalid_argument(where + ": block id " + std::to_string(table[i]) + " at column " + std::to_string(i) +
                              " outside the pool [0, " + std::to_string(n_blocks_) + ")");
  const int64_t count = n - r.synced;
  Tensor tail = Tensor::view_of(const_cast<int32_t*>(table.data() + r.synced), DType::kI32, {count});
  write_(table_, static_cast<int64_t>(row) * max_blocks_ + r.synced, tail);
  uploaded_blocks_ += count;
  ++uploads_;
  r.synced = n;
  return Status::ok();
}

}  // namespace mxserve::kvcache
