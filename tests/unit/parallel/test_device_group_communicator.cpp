// The device-group communicator's host logic (the shared-device stand-in without its GPU: host-memory rank
// ops): every collective bitwise against the CPU thread communicator on the same inputs at 2 and 4 ranks
// (f32 and bf16, ragged all_gather_v / reduce_scatter_v, uneven all_to_all, zero rows); the event protocol
// (a rank waits only for marks the other rank has already recorded for this collective); mismatched calls
// reported on every rank; abort(), a device error and a missing rank poison the group, naming the rank,
// without a hang.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "core/numeric.h"
#include "parallel/cpu_communicator.h"
#include "parallel/device_group_communicator.h"

namespace mxserve::parallel {
namespace {

std::vector<RankLayout> world(int n) {
  std::vector<RankLayout> out;
  for (int r = 0; r < n; ++r) out.push_back(RankLayout{.tp = n, .rank = r});
  return out;
}

void run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// Host ops that check the protocol: wait_for(other, mark) must find other's mark recorded for this very
// collective (as many records of it as this rank has made of kInputReady / kReadsDone so far).
struct Protocol {
  std::atomic<int> violations{0};
  std::vector<std::atomic<int>> recorded[2];
  explicit Protocol(int n) : recorded{std::vector<std::atomic<int>>(n), std::vector<std::atomic<int>>(n)} {}
};
class CheckingOps final : public RankDeviceOps {
 public:
  CheckingOps(int rank, std::shared_ptr<Protocol> p, int fail_copies_after = -1)
      : rank_(rank), p_(std::move(p)), host_(make_host_rank_ops()), fail_after_(fail_copies_after) {}
  Device device() const override { return Device::cpu(); }
  Tensor alloc(DType dtype, const Shape& shape) override { return host_->alloc(dtype, shape); }
  Status copy(void* dst, const void* src, int64_t bytes) override {
    if (fail_after_ >= 0 && copies_++ >= fail_after_) return internal_error("injected copy failure");
    return host_->copy(dst, src, bytes);
  }
  Status copy_2d(void* dst, int64_t dp, const void* src, int64_t sp, int64_t w, int64_t rows) override {
    return host_->copy_2d(dst, dp, src, sp, w, rows);
  }
  Status reduce(void* dst, const std::vector<const void*>& srcs, int64_t n, DType dt, ReduceOp op) override {
    return host_->reduce(dst, srcs, n, dt, op);
  }
  Status reduce_add_rmsnorm(const std::vector<const void*>& srcs, void* residual, const void* weight, void* out,
                            int64_t rows, int64_t cols, float eps, DType dtype) override {
    ++fused_calls;
    return host_->reduce_add_rmsnorm(srcs, residual, weight, out, rows, cols, eps, dtype);
  }
  Status record(Mark m) override {
    ++p_->recorded[static_cast<int>(m)][rank_];
    return Status::ok();
  }
  Status wait_for(RankDeviceOps& other, Mark m) override {
    const int k = static_cast<int>(m);
    if (p_->recorded[k][static_cast<CheckingOps&>(other).rank_] < p_->recorded[k][rank_]) ++p_->violations;
    return Status::ok();
  }

 private:
  int rank_;
  std::shared_ptr<Protocol> p_;
  std::unique_ptr<RankDeviceOps> host_;
  int fail_after_;
  int copies_ = 0;

 public:
  int fused_calls = 0;
};

std::vector<std::unique_ptr<Communicator>> device_group(int n, std::shared_ptr<Protocol> p,
                                                        std::chrono::milliseconds timeout = std::chrono::seconds(30),
                                                        int failing_rank = -1) {
  std::vector<std::unique_ptr<RankDeviceOps>> ops;
  for (int r = 0; r < n; ++r) ops.push_back(std::make_unique<CheckingOps>(r, p, r == failing_rank ? 0 : -1));
  DeviceGroupOptions o;
  o.timeout = timeout;
  o.name = "test-group";
  auto comms = make_device_group_communicators(world(n), std::move(ops), o);
  EXPECT_TRUE(comms.is_ok()) << comms.status().to_string();
  return std::move(*comms);
}

// Rank r's input of `dtype`: mixed magnitudes so the reduction order shows in the bits.
Tensor input(int r, DType dtype, Shape shape, uint32_t seed = 7) {
  Tensor t = Tensor::empty(dtype, shape);
  std::mt19937 gen(seed * 131 + r);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = u(gen) * (i % 3 == 0 ? 1e3f : 1e-2f);
    if (dtype == DType::kF32) t.data<float>()[i] = v;
    else t.data<uint16_t>()[i] = f32_to_bf16(v);
  }
  return t;
}
Tensor to_f32(const Tensor& t) {
  if (t.dtype() == DType::kF32) return t;
  Tensor out = Tensor::empty(DType::kF32, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) out.data<float>()[i] = bf16_to_f32(t.data<uint16_t>()[i]);
  return out;
}
Tensor to_bf16(const Tensor& t) {
  Tensor out = Tensor::empty(DType::kBF16, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) out.data<uint16_t>()[i] = f32_to_bf16(t.data<float>()[i]);
  return out;
}
bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Every collective on rank r's inputs; the results in a fixed order. Reductions run on f32 copies of the
// inputs when `reduce_in_f32` (the CPU communicator reduces f32 only) and their results are rounded back.
std::vector<Tensor> scenario(Communicator& c, int r, DType dtype, bool reduce_in_f32) {
  const int n = c.size();
  std::vector<Tensor> out;
  auto red_in = [&](Tensor t) { return reduce_in_f32 ? to_f32(t) : t; };
  auto red_out = [&](Tensor t) { return reduce_in_f32 && dtype == DType::kBF16 ? to_bf16(t) : t; };
  auto ok = [&](Result<Tensor> t) {
    EXPECT_TRUE(t.is_ok()) << "rank " << r << ": " << t.status().to_string();
    return t.is_ok() ? *t : Tensor();
  };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
    Tensor x = red_in(input(r, dtype, {5, 7}));
    EXPECT_TRUE(c.all_reduce(x, op).is_ok());
    out.push_back(red_out(x));
  }
  Tensor empty = red_in(input(r, dtype, {0, 7}));
  EXPECT_TRUE(c.all_reduce(empty, ReduceOp::kSum).is_ok());
  out.push_back(ok(c.all_gather(input(r, dtype, {3, 4}))));
  out.push_back(ok(c.all_gather(input(r, dtype, {0, 4}))));
  out.push_back(red_out(ok(c.reduce_scatter(red_in(input(r, dtype, {2 * n, 3}, 9)), ReduceOp::kSum))));
  out.push_back(ok(c.all_gather_columns(input(r, dtype, {3, 5}))));
  out.push_back(ok(c.all_gather_columns(input(r, dtype, {0, 5}))));
  // Ragged: rank r brings r % 3 rows (rank 0 none).
  std::vector<int64_t> rows;
  int64_t total = 0;
  for (int q = 0; q < n; ++q) total += q % 3;
  std::vector<int64_t> got_rows;
  out.push_back(ok(c.all_gather_v(input(r, dtype, {r % 3, 6}), &got_rows)));
  for (int q = 0; q < n; ++q) rows.push_back(q % 3);
  EXPECT_EQ(got_rows, rows);
  out.push_back(red_out(ok(c.reduce_scatter_v(red_in(input(r, dtype, {total, 6}, 11)), rows, ReduceOp::kSum))));
  // Uneven all_to_all: rank s sends (s + d) % 3 rows to rank d (zero included).
  std::vector<int64_t> send;
  int64_t sent = 0;
  for (int d = 0; d < n; ++d) sent += send.emplace_back((r + d) % 3);
  std::vector<int64_t> recv;
  out.push_back(ok(c.all_to_all(input(r, dtype, {sent, 2}, 13), send, &recv)));
  for (int s = 0; s < n; ++s) EXPECT_EQ(recv[s], (s + r) % 3);
  EXPECT_TRUE(c.barrier().is_ok());
  return out;
}

class DeviceGroupSizes : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(DeviceGroupSizes, EveryCollectiveMatchesTheCpuCommunicatorBitwise) {
  const auto [n, dtype] = GetParam();
  auto ref_comms = make_cpu_communicators(world(n));
  ASSERT_TRUE(ref_comms.is_ok());
  auto protocol = std::make_shared<Protocol>(n);
  auto comms = device_group(n, protocol);
  EXPECT_EQ(comms[0]->name(), "test-group x" + std::to_string(n));
  std::vector<std::vector<Tensor>> want(n), got(n);
  run_ranks(n, [&](int r) { want[r] = scenario(*(*ref_comms)[r], r, dtype, true); });
  run_ranks(n, [&](int r) { got[r] = scenario(*comms[r], r, dtype, false); });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(got[r].size(), want[r].size());
    for (size_t i = 0; i < got[r].size(); ++i)
      EXPECT_TRUE(bitwise_equal(got[r][i], want[r][i]))
          << "rank " << r << " result " << i << ": " << got[r][i].describe() << " vs " << want[r][i].describe();
  }
  EXPECT_EQ(protocol->violations.load(), 0) << "a rank waited for a mark not yet recorded for its collective";
  EXPECT_GT(protocol->recorded[0][0].load(), 10);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceGroupSizes,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values(DType::kF32, DType::kBF16)));

// The fused all-reduce + add + RMSNorm collective (the shared-device stand-in's fused path): every rank's
// residual equals the CPU communicator's all-reduce then add, bit for bit (one rank-order f32 sum, rounded once
// in bf16), out equals RMSNorm of it; x is not modified; every rank gets the same bits; the event protocol holds
// (no wait on a mark not yet recorded) over 20 calls in a row, with zero rows too.
class FusedDeviceGroup : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(FusedDeviceGroup, MatchesAllReduceThenAddThenRmsnorm) {
  const auto [n, dtype] = GetParam();
  const int64_t R = 3, C = 16;
  const float eps = 1e-5f;
  auto protocol = std::make_shared<Protocol>(n);
  auto comms = device_group(n, protocol);
  auto ref_comms = make_cpu_communicators(world(n));
  ASSERT_TRUE(ref_comms.is_ok());
  const Tensor weight = input(99, dtype, {C});
  std::vector<Tensor> residual(n), out(n), want_res(n), want_out(n), xs(n);
  for (int r = 0; r < n; ++r) {
    residual[r] = input(50, dtype, {R, C});  // the same residual stream on every rank (as in the forward)
    want_res[r] = to_f32(input(50, dtype, {R, C}));
    out[r] = Tensor::empty(dtype, {R, C});
  }
  std::vector<Status> st(n, Status::ok());
  for (int call = 0; call < 20; ++call) {
    // Reference: the CPU communicator's f32 all-reduce, then the add (rounded once), then RMSNorm.
    run_ranks(n, [&](int r) {
      Tensor x = to_f32(input(r, dtype, {R, C}, 20 + call));
      ASSERT_TRUE((*ref_comms)[r]->all_reduce(x, ReduceOp::kSum).is_ok());
      Tensor& res = want_res[r];
      want_out[r] = Tensor::empty(DType::kF32, {R, C});
      for (int64_t row = 0; row < R; ++row) {
        float ss = 0.f;
        for (int64_t c = 0; c < C; ++c) {
          float v = res.data<float>()[row * C + c] + x.data<float>()[row * C + c];
          if (dtype == DType::kBF16) v = bf16_to_f32(f32_to_bf16(v));
          res.data<float>()[row * C + c] = v;
          ss += v * v;
        }
        const float inv = 1.0f / std::sqrt(ss / C + eps);
        for (int64_t c = 0; c < C; ++c)
          want_out[r].data<float>()[row * C + c] = to_f32(weight).data<float>()[c] * (res.data<float>()[row * C + c] * inv);
      }
    });
    run_ranks(n, [&](int r) {
      xs[r] = input(r, dtype, {R, C}, 20 + call);
      auto* fused = dynamic_cast<FusedReduceAddNorm*>(comms[r].get());
      ASSERT_NE(fused, nullptr);
      st[r] = fused->all_reduce_add_rmsnorm(xs[r], residual[r], weight, eps, out[r]);
      Tensor empty_x = input(r, dtype, {0, C}), empty_res = input(r, dtype, {0, C}), empty_out = input(r, dtype, {0, C});
      if (st[r].is_ok()) st[r] = fused->all_reduce_add_rmsnorm(empty_x, empty_res, weight, eps, empty_out);
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].is_ok()) << "call " << call << " rank " << r << ": " << st[r].to_string();
      EXPECT_TRUE(bitwise_equal(xs[r], input(r, dtype, {R, C}, 20 + call))) << "rank " << r << ": x was modified";
      const Tensor want_r = dtype == DType::kBF16 ? to_bf16(want_res[r]) : want_res[r];
      EXPECT_TRUE(bitwise_equal(residual[r], want_r)) << "call " << call << " rank " << r << ": residual";
      EXPECT_TRUE(bitwise_equal(residual[r], residual[0])) << "rank " << r << " differs from rank 0";
      EXPECT_TRUE(bitwise_equal(out[r], out[0])) << "rank " << r << " differs from rank 0";
      const Tensor got = to_f32(out[r]);
      for (int64_t i = 0; i < R * C; ++i) {
        const float w = want_out[r].data<float>()[i];
        const float tol = dtype == DType::kBF16 ? std::abs(w) * (1.0f / 128) + 1e-6f : std::abs(w) * 1e-5f + 1e-6f;
        ASSERT_NEAR(got.data<float>()[i], w, tol) << "call " << call << " rank " << r << " element " << i;
      }
    }
  }
  EXPECT_EQ(protocol->violations.load(), 0) << "a rank waited for a mark not yet recorded for its collective";
  EXPECT_EQ(protocol->recorded[0][0].load(), 40);  // one input-ready mark per call, the empty ones included
}

INSTANTIATE_TEST_SUITE_P(Ranks, FusedDeviceGroup,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values(DType::kF32, DType::kBF16)));

TEST(FusedDeviceGroup, MismatchesAndAliasesAreErrorsOnEveryRank) {
  auto comms = device_group(2, std::make_shared<Protocol>(2));
  std::vector<Status> st(2);
  const Tensor w = input(9, DType::kF32, {4});
  run_ranks(2, [&](int r) {  // different rows per rank: the same error on both, no hang
    Tensor x = input(r, DType::kF32, {r + 1, 4}), res = input(5, DType::kF32, {r + 1, 4}),
           out = Tensor::empty(DType::kF32, {r + 1, 4});
    st[r] = dynamic_cast<FusedReduceAddNorm&>(*comms[r]).all_reduce_add_rmsnorm(x, res, w, 1e-5f, out);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kInvalidArgument) << st[r].to_string();
    EXPECT_NE(st[r].message().find("all_reduce_add_rmsnorm: rank "), std::string::npos) << st[r].to_string();
  }
  Tensor x = input(0, DType::kF32, {2, 4}), res = input(1, DType::kF32, {2, 4});
  const Status alias = dynamic_cast<FusedReduceAddNorm&>(*comms[0]).all_reduce_add_rmsnorm(x, res, w, 1e-5f, res);
  EXPECT_EQ(alias.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(alias.message().find("distinct"), std::string::npos) << alias.to_string();
  Tensor out = Tensor::empty(DType::kF32, {2, 4});
  const Tensor w_bad = input(9, DType::kF32, {5});
  const Status width = dynamic_cast<FusedReduceAddNorm&>(*comms[0]).all_reduce_add_rmsnorm(x, res, w_bad, 1e-5f, out);
  EXPECT_EQ(width.code(), StatusCode::kInvalidArgument) << width.to_string();
  // The group still works (argument errors are found before the rendezvous or reported on every rank).
  run_ranks(2, [&](int r) { st[r] = comms[r]->barrier(); });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(st[r].is_ok()) << st[r].to_string();
}

TEST(DeviceGroup, MismatchedCallsFailOnEveryRankWithoutAHang) {
  auto comms = device_group(2, std::make_shared<Protocol>(2));
  std::vector<Status> st(2);
  run_ranks(2, [&](int r) {
    Tensor x = input(r, DType::kF32, {2, r + 1});
    st[r] = comms[r]->all_reduce(x, ReduceOp::kSum);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kInvalidArgument) << st[r].to_string();
    EXPECT_NE(st[r].message().find("all_reduce: rank "), std::string::npos) << st[r].to_string();
  }
  run_ranks(2, [&](int r) {  // out of step: one rank gathers while the other reduces
    Tensor x = input(r, DType::kF32, {2, 2});
    st[r] = r == 0 ? comms[r]->all_reduce(x, ReduceOp::kSum) : comms[r]->all_gather(x).status();
  });
  for (int r = 0; r < 2; ++r) EXPECT_NE(st[r].message().find("out of step"), std::string::npos) << st[r].to_string();
  // The group still works after a mismatch (it is not a failure of a rank).
  run_ranks(2, [&](int r) { st[r] = comms[r]->barrier(); });
  EXPECT_TRUE(st[0].is_ok() && st[1].is_ok());
  // Argument checks before any rendezvous: wrong device, dtype, counts.
  Tensor i32 = Tensor::empty(DType::kI32, {2});
  EXPECT_EQ(comms[0]->all_reduce(i32, ReduceOp::kSum).code(), StatusCode::kUnsupported);
  EXPECT_EQ(comms[0]->all_to_all(input(0, DType::kF32, {3, 2}), {1, 1}, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->reduce_scatter(input(0, DType::kF32, {3, 2}), ReduceOp::kSum).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->reduce_scatter_v(input(0, DType::kF32, {3, 2}), {1, -1}, ReduceOp::kSum).status().code(),
            StatusCode::kInvalidArgument);
  Tensor view = Tensor::view_of(i32.raw(), DType::kI32, {2}, Device::cuda(0));
  EXPECT_EQ(comms[0]->all_gather(view).status().code(), StatusCode::kInvalidArgument);
}

TEST(DeviceGroup, AbortMidCollectivePoisonsEveryRankNamingIt) {
  const int n = 4;
  auto comms = device_group(n, std::make_shared<Protocol>(n));
  std::vector<Status> st(n);
  run_ranks(n, [&](int r) {
    ASSERT_TRUE(comms[r]->barrier().is_ok());
    if (r == 2) {  // rank 2 fails while the others wait in an all_reduce for it
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      comms[r]->abort(internal_error("injected failure"));
      st[r] = comms[r]->barrier();
      return;
    }
    Tensor x = input(r, DType::kF32, {4, 4});
    st[r] = comms[r]->all_reduce(x, ReduceOp::kSum);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_FALSE(st[r].is_ok()) << "rank " << r;
    EXPECT_NE(st[r].message().find("rank 2 failed: injected failure"), std::string::npos) << st[r].to_string();
  }
  // Later collectives fail at once, on every rank, naming rank 2.
  run_ranks(n, [&](int r) { st[r] = comms[r]->all_gather(input(r, DType::kF32, {1, 1})).status(); });
  for (int r = 0; r < n; ++r)
    EXPECT_NE(st[r].message().find("rank 2 failed"), std::string::npos) << st[r].to_string();
}

TEST(DeviceGroup, ADeviceErrorPoisonsTheGroup) {
  auto comms = device_group(2, std::make_shared<Protocol>(2), std::chrono::seconds(30), /*failing_rank=*/1);
  std::vector<Status> st(2);
  run_ranks(2, [&](int r) { st[r] = comms[r]->all_gather(input(r, DType::kF32, {2, 2})).status(); });
  EXPECT_NE(st[1].message().find("rank 1 failed"), std::string::npos) << st[1].to_string();
  EXPECT_NE(st[1].message().find("injected copy failure"), std::string::npos) << st[1].to_string();
  // Rank 0 sees it at the barrier that ends the collective (which waits for rank 1, whose input it reads).
  EXPECT_NE(st[0].message().find("rank 1 failed"), std::string::npos) << st[0].to_string();
}

TEST(DeviceGroup, AMissingRankTimesOutNamingIt) {
  auto comms = device_group(3, std::make_shared<Protocol>(3), std::chrono::milliseconds(200));
  std::vector<Status> st(3);
  run_ranks(3, [&](int r) {
    if (r != 1) st[r] = comms[r]->barrier();
  });
  EXPECT_EQ(st[0].code(), StatusCode::kUnavailable) << st[0].to_string();
  EXPECT_NE(st[0].message().find("rank(s) 1, which never arrived"), std::string::npos) << st[0].to_string();
  EXPECT_NE(st[2].message().find("never arrived"), std::string::npos) << st[2].to_string();
  EXPECT_NE(comms[1]->barrier().message().find("never arrived"), std::string::npos);  // later: fails at once
}

TEST(DeviceGroup, FactoryChecksItsArguments) {
  std::vector<std::unique_ptr<RankDeviceOps>> ops;
  ops.push_back(make_host_rank_ops());
  EXPECT_FALSE(make_device_group_communicators(world(2), std::move(ops)).is_ok());  // 2 layouts, 1 device side
  std::vector<std::unique_ptr<RankDeviceOps>> two;
  two.push_back(make_host_rank_ops());
  two.push_back(nullptr);
  EXPECT_FALSE(make_device_group_communicators(world(2), std::move(two)).is_ok());
}

}  // namespace
}  // namespace mxserve::parallel
