// BlockTableStore + TableRows against the sequences' host block tables: random admissions (fresh and
// prefix-shared tables), appends, preemptions, finishes and row reuse; after every step's sync each held
// row must equal its host table and exactly the blocks appended since the last sync were uploaded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "kvcache/block_table_store.h"

namespace mxserve::kvcache {
namespace {

struct Harness {
  int64_t writes_bytes = 0;
  BlockTableStore store;
  Harness(int64_t rows, int64_t width, int64_t n_blocks)
      : store(rows, width, n_blocks, [](DType dt, Shape s) { return Tensor::empty(dt, std::move(s)); },
              [this](Tensor& dst, int64_t offset, const Tensor& host) {
                ASSERT_LE(offset + host.numel(), dst.numel());
                std::memcpy(dst.data<int32_t>() + offset, host.raw(), host.nbytes());
                writes_bytes += static_cast<int64_t>(host.nbytes());
              }) {}
  std::vector<int32_t> row(int32_t r) const {
    const int32_t* p = store.device().data<int32_t>() + r * store.max_blocks_per_seq();
    return {p, p + store.max_blocks_per_seq()};
  }
};

TEST(TableRows, HandsOutEachRowOnceWithFreshLeases) {
  TableRows rows(3);
  const TableLease a = rows.acquire(), b = rows.acquire(), c = rows.acquire();
  EXPECT_EQ(rows.acquire().row, -1);  // all held
  EXPECT_NE(a.row, b.row);
  EXPECT_NE(b.row, c.row);
  rows.release(b.row);
  const TableLease d = rows.acquire();
  EXPECT_EQ(d.row, b.row);
  EXPECT_GT(d.lease, c.lease);  // a reused row never repeats a lease
  EXPECT_DEATH(rows.release(-1), "not held");
}

TEST(BlockTableStore, UploadsOnlyTheTailAndRestartsOnANewLease) {
  Harness h(2, 8, 100);
  std::vector<int32_t> t = {5, 6, 7};
  ASSERT_TRUE(h.store.sync(1, 1, t).is_ok());
  EXPECT_EQ(h.store.uploaded_blocks(), 3);
  ASSERT_TRUE(h.store.sync(1, 1, t).is_ok());  // nothing new
  EXPECT_EQ(h.store.uploaded_blocks(), 3);
  t.push_back(9);
  ASSERT_TRUE(h.store.sync(1, 1, t).is_ok());
  EXPECT_EQ(h.store.uploaded_blocks(), 4);
  EXPECT_EQ(h.store.uploads(), 2);
  std::vector<int32_t> u = {5, 6, 1};  // same row, next holder (shares two prefix blocks)
  ASSERT_TRUE(h.store.sync(1, 2, u).is_ok());
  EXPECT_EQ(h.store.uploaded_blocks(), 7);
  const std::vector<int32_t> row = h.row(1);
  EXPECT_EQ(std::vector<int32_t>(row.begin(), row.begin() + 3), u);
}

TEST(BlockTableStore, RejectsBadRowsLeasesWidthsAndBlockIds) {
  Harness h(2, 4, 10);
  const std::vector<int32_t> ok = {1, 2};
  EXPECT_NE(h.store.sync(2, 1, ok).message().find("row 2 outside"), std::string::npos);
  EXPECT_NE(h.store.sync(0, 0, ok).message().find("lease 0"), std::string::npos);
  EXPECT_NE(h.store.sync(0, 1, std::vector<int32_t>{1, 2, 3, 4, 5}).message().find("exceed the row width 4"),
            std::string::npos);
  EXPECT_NE(h.store.sync(0, 1, std::vector<int32_t>{1, 10}).message().find("block id 10 at column 1"),
            std::string::npos);
}

// The scheduler's life cycle, randomized: the store must mirror every held row after each step.
TEST(BlockTableStore, RandomLifecyclesMatchHostTables) {
  constexpr int64_t kRows = 6, kWidth = 24, kBlocks = 200;
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 20; ++trial) {
    Harness h(kRows, kWidth, kBlocks);
    TableRows rows(kRows);
    struct Seq {
      TableLease lease;
      std::vector<int32_t> table;
      int64_t synced = 0;  // what the store should hold after the last step
    };
    std::vector<Seq> live;
    std::vector<int32_t> shared_prefix = {3, 4, 5, 6};  // a prefix-cache hit's blocks
    auto block = [&] { return static_cast<int32_t>(rng() % kBlocks); };
    int64_t reuses = 0;
    for (int step = 0; step < 200; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 3 && rows.n_free() > 0) {  // admit: fresh or prefix-shared
        Seq s;
        s.lease = rows.acquire();
        const int64_t shared = rng() % 2 ? static_cast<int64_t>(rng() % (shared_prefix.size() + 1)) : 0;
        s.table.assign(shared_prefix.begin(), shared_prefix.begin() + shared);
        const int64_t fresh = 1 + rng() % 3;
        for (int64_t i = 0; i < fresh; ++i) s.table.push_back(block());
        reuses += h.store.lease(s.lease.row) != 0;
        live.push_back(std::move(s));
      } else if (op < 5 && !live.empty()) {  // finish or preempt: the row goes back, the table is cleared
        const size_t i = rng() % live.size();
        rows.release(live[i].lease.row);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
      for (Seq& s : live)  // decodes/prefill chunks append blocks now and then
        if (rng() % 3 == 0 && static_cast<int64_t>(s.table.size()) < kWidth) s.table.push_back(block());
      // The step: sync every running sequence (in a random order: batch order must not matter).
      std::shuffle(live.begin(), live.end(), rng);
      int64_t expect_new = 0;
      for (const Seq& s : live) expect_new += static_cast<int64_t>(s.table.size()) - s.synced;
      const int64_t before = h.store.uploaded_blocks();
      for (Seq& s : live) {
        ASSERT_TRUE(h.store.sync(s.lease.row, s.lease.lease, s.table).is_ok());
        s.synced = static_cast<int64_t>(s.table.size());
      }
      ASSERT_EQ(h.store.uploaded_blocks() - before, expect_new) << "trial " << trial << " step " << step;
      for (const Seq& s : live) {
        const std::vector<int32_t> dev = h.row(s.lease.row);
        ASSERT_TRUE(std::equal(s.table.begin(), s.table.end(), dev.begin()))
            << "trial " << trial << " step " << step << " row " << s.lease.row;
        ASSERT_EQ(h.store.synced(s.lease.row), static_cast<int64_t>(s.table.size()));
      }
    }
    EXPECT_GT(reuses, 0) << "the trial never reused a row";
  }
}

}  // namespace
}  // namespace mxserve::kvcache
