// parallel/recoverable.h on the communicators a lockstep group resets after a recoverable failure: the CPU
// thread group and the device group (the shared-device stand-in's host logic, on host memory). An abort that
// leaves a rank waiting inside a collective (a half-done exchange) is cleared by reset_after_abort() on every
// rank, and the next collective computes the right values; a group that lost a rank (a wait timed out) refuses.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "parallel/cpu_communicator.h"
#include "parallel/device_group_communicator.h"
#include "parallel/recoverable.h"

namespace mxserve::parallel {
namespace {

using Comms = std::vector<std::unique_ptr<Communicator>>;
using Factory = std::function<Comms(std::chrono::milliseconds timeout)>;

std::vector<RankLayout> world2() { return {RankLayout{.tp = 2, .rank = 0}, RankLayout{.tp = 2, .rank = 1}}; }

Comms cpu_group(std::chrono::milliseconds timeout) {
  auto made = make_cpu_communicators(world2(), {.timeout = timeout});
  EXPECT_TRUE(made.is_ok()) << made.status().to_string();
  return std::move(made).value();
}

Comms device_group(std::chrono::milliseconds timeout) {
  std::vector<std::unique_ptr<RankDeviceOps>> ops;
  ops.push_back(make_host_rank_ops());
  ops.push_back(make_host_rank_ops());
  DeviceGroupOptions o;
  o.timeout = timeout;
  auto made = make_device_group_communicators(world2(), std::move(ops), o);
  EXPECT_TRUE(made.is_ok()) << made.status().to_string();
  return std::move(made).value();
}

Status reset(Communicator& c) {
  auto* r = dynamic_cast<RecoverableGroup*>(&c);
  if (r == nullptr) return unsupported(c.name() + " is not a RecoverableGroup");
  return r->reset_after_abort();
}

// Both ranks all-reduce {1,2,3} * (rank + 1) * 10^rank; every rank must get {11, 22, 33}.
void expect_sum_works(Comms& comms) {
  std::vector<Tensor> x(2);
  std::vector<Status> st(2, Status::ok());
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      x[r] = Tensor::empty(DType::kF32, {3});
      for (int i = 0; i < 3; ++i) x[r].data<float>()[i] = static_cast<float>((i + 1) * (r == 0 ? 1 : 10));
      st[r] = comms[r]->all_reduce(x[r], ReduceOp::kSum);
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(st[r].is_ok()) << st[r].to_string();
    for (int i = 0; i < 3; ++i) EXPECT_EQ(x[r].data<float>()[i], 11.0f * (i + 1)) << "rank " << r << " element " << i;
  }
}

void abort_mid_exchange_then_reset(const Factory& make) {
  Comms comms = make(std::chrono::seconds(30));
  expect_sum_works(comms);
  // Rank 0 waits in an all_reduce; rank 1 fails (its device is full) and aborts instead of joining.
  Status waited = Status::ok();
  std::thread rank0([&] {
    Tensor x = Tensor::empty(DType::kF32, {3});
    waited = comms[0]->all_reduce(x, ReduceOp::kSum);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // not needed for correctness: either order works
  comms[1]->abort(out_of_memory("injected: rank 1's device is full"));
  rank0.join();
  ASSERT_FALSE(waited.is_ok());
  EXPECT_EQ(waited.code(), StatusCode::kOutOfMemory) << waited.to_string();
  EXPECT_NE(waited.message().find("the rank group failed"), std::string::npos) << waited.to_string();
  Tensor y = Tensor::empty(DType::kF32, {1});
  EXPECT_FALSE(comms[1]->all_reduce(y, ReduceOp::kSum).is_ok());  // poisoned until reset
  for (auto& c : comms) ASSERT_TRUE(reset(*c).is_ok());            // quiet point: no rank inside a collective
  expect_sum_works(comms);
  expect_sum_works(comms);
}

void a_lost_rank_refuses_reset(const Factory& make) {
  Comms comms = make(std::chrono::milliseconds(200));
  const Status alone = comms[0]->barrier();  // rank 1 never comes: the wait times out and poisons the group
  ASSERT_FALSE(alone.is_ok());
  EXPECT_EQ(alone.code(), StatusCode::kUnavailable) << alone.to_string();
  const Status refused = reset(*comms[0]);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("cannot recover"), std::string::npos) << refused.to_string();
  EXPECT_NE(refused.message().find("never arrived"), std::string::npos) << refused.to_string();
  EXPECT_FALSE(comms[1]->barrier().is_ok());  // still failed
}

TEST(CommunicatorReset, CpuGroupClearsAnAbortMidExchange) { abort_mid_exchange_then_reset(cpu_group); }
TEST(CommunicatorReset, DeviceGroupClearsAnAbortMidExchange) { abort_mid_exchange_then_reset(device_group); }
TEST(CommunicatorReset, CpuGroupThatLostARankStaysFailed) { a_lost_rank_refuses_reset(cpu_group); }
TEST(CommunicatorReset, DeviceGroupThatLostARankStaysFailed) { a_lost_rank_refuses_reset(device_group); }

}  // namespace
}  // namespace mxserve::parallel
