// The CPU thread-group communicator: every collective against a serial reference over the same inputs
// (bitwise: the reductions add in rank order), all ranks getting the same bits, mismatched calls reported
// on every rank, and failure propagation without a hang (an aborting rank, a rank that never arrives).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "parallel/cpu_communicator.h"

namespace mxserve::parallel {
namespace {

std::vector<RankLayout> world(int n) {
  std::vector<RankLayout> out;
  for (int r = 0; r < n; ++r) out.push_back(RankLayout{.tp = n, .rank = r});
  return out;
}

std::vector<std::unique_ptr<Communicator>> group(int n, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto comms = make_cpu_communicators(world(n), CpuGroupOptions{timeout});
  EXPECT_TRUE(comms.is_ok()) << comms.status().to_string();
  return std::move(*comms);
}

// Runs fn(rank) on one thread per rank and joins them all.
void run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// Rank r's input: values that make float addition order-sensitive (mixed magnitudes).
Tensor input(int r, Shape shape, uint32_t seed = 7) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::mt19937 gen(seed * 131 + r);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(gen) * (i % 3 == 0 ? 1e6f : 1e-3f);
  return t;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

class CpuCommunicatorSizes : public ::testing::TestWithParam<int> {};

TEST_P(CpuCommunicatorSizes, AllReduceMatchesRankOrderSerialSum) {
  const int n = GetParam();
  const Shape shape{5, 7};
  Tensor ref = input(0, shape), ref_max = input(0, shape);
  for (int r = 1; r < n; ++r) {
    Tensor x = input(r, shape);
    for (int64_t i = 0; i < x.numel(); ++i) {
      ref.data<float>()[i] += x.data<float>()[i];
      ref_max.data<float>()[i] = std::max(ref_max.data<float>()[i], x.data<float>()[i]);
    }
  }
  auto comms = group(n);
  std::vector<Tensor> sums(n), maxes(n);
  run_ranks(n, [&](int r) {
    sums[r] = input(r, shape);
    maxes[r] = input(r, shape);
    ASSERT_TRUE(comms[r]->all_reduce(sums[r], ReduceOp::kSum).is_ok());
    ASSERT_TRUE(comms[r]->all_reduce(maxes[r], ReduceOp::kMax).is_ok());
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(bitwise_equal(sums[r], ref)) << "rank " << r;
    EXPECT_TRUE(bitwise_equal(maxes[r], ref_max)) << "rank " << r;
  }
}

TEST_P(CpuCommunicatorSizes, AllGatherRowsAndColumns) {
  const int n = GetParam();
  auto comms = group(n);
  std::vector<Tensor> rows(n), cols(n);
  run_ranks(n, [&](int r) {
    auto g = comms[r]->all_gather(input(r, {2, 3}));
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    rows[r] = *g;
    auto c = comms[r]->all_gather_columns(input(r, {2, 3}));
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    cols[r] = *c;
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(rows[r].shape(), (Shape{2 * n, 3}));
    ASSERT_EQ(cols[r].shape(), (Shape{2, 3 * n}));
    for (int s = 0; s < n; ++s) {
      Tensor x = input(s, {2, 3});
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j) {
          EXPECT_EQ(rows[r].data<float>()[(s * 2 + i) * 3 + j], x.data<float>()[i * 3 + j]);
          EXPECT_EQ(cols[r].data<float>()[i * 3 * n + s * 3 + j], x.data<float>()[i * 3 + j]);
        }
    }
  }
}

TEST_P(CpuCommunicatorSizes, ReduceScatterIsTheRankBlockOfTheSum) {
  const int n = GetParam();
  const Shape shape{2 * n, 3};
  Tensor ref = input(0, shape);
  for (int r = 1; r < n; ++r) {
    Tensor x = input(r, shape);
    for (int64_t i = 0; i < x.numel(); ++i) ref.data<float>()[i] += x.data<float>()[i];
  }
  auto comms = group(n);
  std::vector<Tensor> out(n);
  run_ranks(n, [&](int r) {
    auto rs = comms[r]->reduce_scatter(input(r, shape), ReduceOp::kSum);
    ASSERT_TRUE(rs.is_ok()) << rs.status().to_string();
    out[r] = *rs;
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(bitwise_equal(out[r], ref.slice_rows(2 * r, 2 * r + 2))) << r;
}

TEST_P(CpuCommunicatorSizes, AllToAllVariableRows) {
  const int n = GetParam();
  // Rank s sends (s + d) % 3 rows to rank d; row values encode (source, destination, index).
  auto send_rows = [&](int s) {
    std::vector<int64_t> v;
    for (int d = 0; d < n; ++d) v.push_back((s + d) % 3);
    return v;
  };
  auto comms = group(n);
  std::vector<Tensor> out(n);
  std::vector<std::vector<int64_t>> recv(n);
  run_ranks(n, [&](int s) {
    const std::vector<int64_t> rows = send_rows(s);
    int64_t total = 0;
    for (int64_t x : rows) total += x;
    Tensor in = Tensor::empty(DType::kI32, {total, 2});
    int64_t k = 0;
    for (int d = 0; d < n; ++d)
      for (int64_t i = 0; i < rows[d]; ++i, ++k) {
        in.data<int32_t>()[2 * k] = s * 100 + d;
        in.data<int32_t>()[2 * k + 1] = static_cast<int32_t>(i);
      }
    auto a = comms[s]->all_to_all(in, rows, &recv[s]);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    out[s] = *a;
  });
  for (int d = 0; d < n; ++d) {
    int64_t k = 0;
    for (int s = 0; s < n; ++s) {
      EXPECT_EQ(recv[d][s], send_rows(s)[d]);
      for (int64_t i = 0; i < recv[d][s]; ++i, ++k) {
        EXPECT_EQ(out[d].data<int32_t>()[2 * k], s * 100 + d);
        EXPECT_EQ(out[d].data<int32_t>()[2 * k + 1], i);
      }
    }
    EXPECT_EQ(out[d].dim(0), k);
  }
}

TEST_P(CpuCommunicatorSizes, VariableRowGatherAndReduceScatterInvertEachOther) {
  // Rank r brings r % 3 rows (rank 0 none): all_gather_v stacks them in rank order; reduce_scatter_v of
  // per-rank [sum, 4] tensors hands rank r the rank-order sum of its own rows.
  const int n = GetParam();
  std::vector<int64_t> want_rows(n);
  int64_t total = 0;
  for (int r = 0; r < n; ++r) total += want_rows[r] = r % 3;
  auto comms = group(n);
  std::vector<Tensor> gathered(n), mine(n);
  std::vector<std::vector<int64_t>> rows(n);
  run_ranks(n, [&](int r) {
    auto g = comms[r]->all_gather_v(input(r, {want_rows[r], 4}), &rows[r]);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    gathered[r] = *g;
    auto s = comms[r]->reduce_scatter_v(input(r, {total, 4}, 11), rows[r], ReduceOp::kSum);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    mine[r] = *s;
  });
  int64_t begin = 0;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(rows[r], want_rows) << "rank " << r;
    ASSERT_EQ(gathered[r].shape(), (Shape{total, 4}));
    int64_t offset = 0;
    for (int q = 0; q < n; ++q) {
      Tensor part = input(q, {want_rows[q], 4});
      EXPECT_EQ(std::memcmp(gathered[r].data<float>() + offset * 4, part.raw(), part.nbytes()), 0) << r << " " << q;
      offset += want_rows[q];
    }
    Tensor ref = Tensor::empty(DType::kF32, {want_rows[r], 4});
    for (int64_t i = 0; i < ref.numel(); ++i) {
      float acc = input(0, {total, 4}, 11).data<float>()[begin * 4 + i];
      for (int q = 1; q < n; ++q) acc += input(q, {total, 4}, 11).data<float>()[begin * 4 + i];
      ref.data<float>()[i] = acc;
    }
    EXPECT_TRUE(bitwise_equal(mine[r], ref)) << "rank " << r;
    begin += want_rows[r];
  }
}

TEST(CpuCommunicator, VariableRowCollectivesCheckTheirArguments) {
  auto comms = group(2);
  std::vector<Status> gather(2), scatter(2);
  run_ranks(2, [&](int r) {  // row shapes differ: refused on every rank, naming both
    gather[r] = comms[r]->all_gather_v(input(r, {1, r == 0 ? 4 : 5}), nullptr).status();
    // counts that disagree between the ranks: refused on every rank
    scatter[r] = comms[r]->reduce_scatter_v(input(r, {3, 2}), r == 0 ? std::vector<int64_t>{1, 2}
                                                                      : std::vector<int64_t>{2, 1},
                                            ReduceOp::kSum).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(gather[r].message().find("row shape must agree"), std::string::npos) << gather[r].message();
    EXPECT_NE(scatter[r].message().find("different row counts"), std::string::npos) << scatter[r].message();
  }
  // Counts that do not sum to the rows: refused before any exchange.
  EXPECT_FALSE(comms[0]->reduce_scatter_v(input(0, {3, 2}), {1, 1}, ReduceOp::kSum).is_ok());
}

INSTANTIATE_TEST_SUITE_P(Worlds, CpuCommunicatorSizes, ::testing::Values(1, 2, 3, 4));

TEST(CpuCommunicator, MismatchedShapesFailOnEveryRank) {
  auto comms = group(2);
  std::vector<Status> st(2);
  run_ranks(2, [&](int r) {
    Tensor x = input(r, {r + 1, 2});
    st[r] = comms[r]->all_reduce(x, ReduceOp::kSum);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(st[r].is_ok());
    EXPECT_NE(st[r].message().find("all_reduce"), std::string::npos) << st[r].message();
  }
}

TEST(CpuCommunicator, OutOfStepCollectivesAreNamed) {
  auto comms = group(2);
  std::vector<Status> st(2);
  run_ranks(2, [&](int r) {
    Tensor x = input(r, {2, 2});
    st[r] = r == 0 ? comms[r]->all_reduce(x, ReduceOp::kSum) : comms[r]->barrier();
  });
  for (int r = 0; r < 2; ++r) EXPECT_NE(st[r].message().find("out of step"), std::string::npos) << st[r].message();
}

TEST(CpuCommunicator, AnAbortingRankFailsTheOthersWithoutAHang) {
  // The timeout is long: the others must be woken by the abort, not by the clock.
  auto comms = group(4, std::chrono::seconds(60));
  std::vector<Status> st(4);
  const auto t0 = std::chrono::steady_clock::now();
  run_ranks(4, [&](int r) {
    Tensor x = input(r, {3});
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      comms[r]->abort(internal_error("out of device memory in layer 1"));
      return;
    }
    st[r] = comms[r]->all_reduce(x, ReduceOp::kSum);
    if (st[r].is_ok()) st[r] = comms[r]->barrier();
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  for (int r : {0, 1, 3}) {
    ASSERT_FALSE(st[r].is_ok()) << r;
    EXPECT_NE(st[r].message().find("rank 2 failed: out of device memory in layer 1"), std::string::npos)
        << st[r].message();
  }
  Tensor x = input(0, {3});
  EXPECT_FALSE(comms[0]->all_reduce(x, ReduceOp::kSum).is_ok());  // the group stays failed
}

TEST(CpuCommunicator, AMissingRankTimesOutNamingIt) {
  auto comms = group(3, std::chrono::milliseconds(200));
  std::vector<Status> st(3);
  run_ranks(3, [&](int r) {
    if (r == 1) return;  // never arrives
    st[r] = comms[r]->barrier();
  });
  for (int r : {0, 2}) {
    ASSERT_FALSE(st[r].is_ok());
    EXPECT_NE(st[r].message().find("rank(s) 1, which never arrived"), std::string::npos) << st[r].message();
  }
}

TEST(CpuCommunicator, BadArgumentsAreErrors) {
  EXPECT_FALSE(make_cpu_communicators({}).is_ok());
  EXPECT_FALSE(make_cpu_communicators({RankLayout{.tp = 2, .rank = 0}}).is_ok());
  auto comms = group(1);
  Tensor ints = Tensor::empty(DType::kI32, {2});
  EXPECT_EQ(comms[0]->all_reduce(ints, ReduceOp::kSum).code(), StatusCode::kUnsupported);
  Tensor x = input(0, {3, 2});
  EXPECT_FALSE(comms[0]->all_to_all(x, {2}, nullptr).is_ok());
  EXPECT_FALSE(comms[0]->all_gather_columns(input(0, {3})).is_ok());
}

}  // namespace
}  // namespace mxserve::parallel
