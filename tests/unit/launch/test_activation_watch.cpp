// ActivationWatch (launch/activation_watch.h): when a serving step's activation peak on a rank deserves a warning
// against the start-up dry run's reserve (over it; the first time, then only after another 10%), and
// describe_step's one-line shape of a forward batch (prefill chunks vs decode / verify sequences). The device
// side (each rank's allocator interval around its job) runs on the GPU stand-in (dev/gpu/s12.sh part 2).
#include <gtest/gtest.h>

#include "launch/activation_watch.h"

namespace mxserve::launch {
namespace {

TEST(ActivationWatch, WarnsOverTheReserveOnceThenEveryTenPercent) {
  ActivationWatch w;
  EXPECT_FALSE(w.over(0, 1ull << 40)) << "no reserve set: nothing is watched";
  w.set_reserve({1000, 0, 500});
  EXPECT_FALSE(w.over(0, 900));
  EXPECT_FALSE(w.over(0, 1000)) << "at the reserve is within it";
  EXPECT_TRUE(w.over(0, 1200));
  EXPECT_FALSE(w.over(0, 1200)) << "the same overshoot is said once";
  EXPECT_FALSE(w.over(0, 1319)) << "under 10% above the last warning";
  EXPECT_TRUE(w.over(0, 1320));
  EXPECT_FALSE(w.over(0, 1100)) << "a smaller overshoot after a larger one";
  EXPECT_FALSE(w.over(1, 1ull << 40)) << "a 0 reserve: not measured, not watched";
  EXPECT_TRUE(w.over(2, 501)) << "each rank has its own reserve and its own last warning";
  EXPECT_FALSE(w.over(3, 1ull << 40)) << "a rank beyond the reserve list";
  EXPECT_FALSE(w.over(-1, 1ull << 40));
  w.set_reserve({1000});
  EXPECT_TRUE(w.over(0, 1200)) << "a new reserve forgets the old warnings";
}

model::SequenceSpan span(int32_t begin, int32_t rows, int32_t kv_len) {
  model::SequenceSpan s;
  s.token_begin = begin;
  s.n_tokens = rows;
  s.kv_len = kv_len;
  return s;
}

TEST(ActivationWatch, DescribesPrefillChunksAndDecodeRows) {
  model::ForwardBatch b;
  b.seqs = {span(0, 800, 2000), span(800, 4, 2104), span(804, 1200, 1200), span(2004, 4, 300)};
  b.token_ids.assign(2008, 0);
  b.positions.assign(2008, 0);
  b.logit_rows = {799, 800, 801, 802, 803, 2003, 2004, 2005, 2006, 2007};
  EXPECT_EQ(describe_step(b),
            "2008 rows: 2 prefill chunks of 2000 rows (largest 1200, longest context 2000 keys), 2 decode / verify "
            "sequences of 8 rows; 10 rows with logits");
  model::ForwardBatch d;
  d.seqs = {span(0, 1, 50)};
  d.token_ids.assign(1, 0);
  d.positions.assign(1, 49);
  d.logit_rows = {0};
  EXPECT_EQ(describe_step(d), "1 row: 0 prefill chunks of 0 rows, 1 decode / verify sequence of 1 row; 1 row with logits");
}

}  // namespace
}  // namespace mxserve::launch
