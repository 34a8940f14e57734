// A lockstep rank group recovers from one rank's device out-of-memory (launch/lockstep_model.h "Recovery") on
// the CPU backend, ranks as threads over the CPU communicator:
//   - tp 2: a rank that fails one step with an out-of-memory (test hook, at the start of its part, so the other
//     rank is left inside a collective; and the CPU backend's injected allocation failure, mid-forward) fails
//     that forward naming the rank; the next forward succeeds and its logits equal a fresh group's;
//   - tp 2 x dp 2 + DP attention, through an engine: the failed step's request ends with an out_of_memory error
//     naming the rank, the next request's greedy tokens equal a fresh group's;
//   - a failure that is not an out-of-memory keeps the group failed (every later forward fails at once).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "serve_one.h"
#include "core/check.h"
#include "core/device_oom.h"
#include "launch/launch.h"
#include "launch/lockstep_model.h"

namespace mxserve::launch {
namespace {

namespace fs = std::filesystem;

std::string first_fixture() {
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(fs::path(MXSERVE_SOURCE_DIR) / "tests/fixtures"))
    if (fs::exists(e.path() / "reference.safetensors")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs.front();
}

Result<std::unique_ptr<LaunchedModel>> launch(int tp, int dp, bool dp_attention) {
  LaunchConfig lc;
  lc.model.path = first_fixture();
  lc.model.load_mtp = false;
  lc.backend = "cpu";
  lc.parallel.tp = tp;
  lc.parallel.dp = dp;
  lc.parallel.dp_attention = dp_attention;
  lc.cpu_group.timeout = std::chrono::seconds(60);
  return launch_model(lc);
}

LockstepModel& lockstep(LaunchedModel& lm) {
  auto* group = dynamic_cast<LockstepModel*>(&lm.model());
  EXPECT_NE(group, nullptr);
  return *group;
}

model::ForwardBatch prefill_batch() {
  model::ForwardBatch batch;
  batch.token_ids = {1, 2, 3, 4, 5};
  batch.positions = {0, 1, 2, 3, 4};
  batch.logit_rows = {4};
  model::SequenceSpan span;
  span.n_tokens = 5;
  span.kv_len = 5;
  span.block_table = {0, 1};
  batch.seqs.push_back(span);
  return batch;
}

// Fails rank `rank`'s next `count` forward parts as `how` says: "throw" (DeviceOutOfMemory, as the allocator
// throws it) or a returned Status.
struct Fault {
  int rank;
  std::atomic<int> count{1};
  Status status = Status::ok();  // ok: throw DeviceOutOfMemory
  Status operator()(int r) {
    if (r != rank || count.load() <= 0 || count.fetch_sub(1) <= 0) return Status::ok();
    if (status.is_ok()) throw DeviceOutOfMemory("injected: rank " + std::to_string(r) + "'s device is full", 1 << 20);
    return status;
  }
};

std::vector<float> host_logits(LaunchedModel& lm, const Tensor& t) {
  const Tensor h = lm.backend().to_host(t);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

TEST(LockstepRecovery, Tp2RecoversFromOneRanksOutOfMemory) {
  auto fresh = launch(2, 1, false);
  ASSERT_TRUE(fresh.is_ok()) << fresh.status().to_string();
  auto lm = launch(2, 1, false);
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  const model::ForwardBatch batch = prefill_batch();
  auto alloc = [](LaunchedModel& m) {
    return [&m](DType dt, Shape s) { return m.backend().alloc(dt, std::move(s)); };
  };
  kvcache::KvCache ref_kv((*fresh)->model().kv_spec(8, 4), alloc(**fresh));
  auto ref = (*fresh)->model().forward(batch, ref_kv);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  const std::vector<float> want = host_logits(**fresh, ref->logits);

  LockstepModel& group = lockstep(**lm);
  kvcache::KvCache kv(group.kv_spec(8, 4), alloc(**lm));
  for (int failing : {1, 0}) {  // the failing rank left the other inside its first collective (a half-done exchange)
    Fault fault{failing};
    group.set_fault_hook_for_test([&fault](int r) { return fault(r); });
    auto failed = group.forward(batch, kv);
    group.set_fault_hook_for_test(nullptr);
    ASSERT_FALSE(failed.is_ok());
    EXPECT_EQ(failed.status().code(), StatusCode::kOutOfMemory) << failed.status().to_string();
    EXPECT_NE(failed.status().message().find("rank " + std::to_string(failing) + " of 2"), std::string::npos)
        << failed.status().message();
    // An out-of-memory failure names the step it happened in (runtime/activation_watch.h describe_step).
    EXPECT_NE(failed.status().message().find("(the step: " + runtime::describe_step(batch) + ")"), std::string::npos)
        << failed.status().message();
    auto next = group.forward(batch, kv);
    ASSERT_TRUE(next.is_ok()) << next.status().to_string();
    EXPECT_EQ(host_logits(**lm, next->logits), want);  // bitwise: the CPU ranks reduce in rank order
  }
  // A real allocation failure mid-forward (core/device_oom.h; whichever rank allocates first).
  alloc_fault::arm(1, 1);
  auto failed = group.forward(batch, kv);
  alloc_fault::arm(0, 0);
  ASSERT_FALSE(failed.is_ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kOutOfMemory) << failed.status().to_string();
  EXPECT_NE(failed.status().message().find(" of 2: cpu backend: allocation of"), std::string::npos)
      << failed.status().message();
  auto next = group.forward(batch, kv);
  ASSERT_TRUE(next.is_ok()) << next.status().to_string();
  EXPECT_EQ(host_logits(**lm, next->logits), want);
  EXPECT_EQ(group.recoveries(), 3);
}

TEST(LockstepRecovery, AFailureThatIsNotOutOfMemoryKeepsTheGroupFailed) {
  auto lm = launch(2, 1, false);
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  LockstepModel& group = lockstep(**lm);
  kvcache::KvCache kv(group.kv_spec(8, 4),
                      [&](DType dt, Shape s) { return (*lm)->backend().alloc(dt, std::move(s)); });
  const model::ForwardBatch batch = prefill_batch();
  Fault fault{1};
  fault.status = internal_error("injected device fault");
  group.set_fault_hook_for_test([&fault](int r) { return fault(r); });
  auto failed = group.forward(batch, kv);
  group.set_fault_hook_for_test(nullptr);
  ASSERT_FALSE(failed.is_ok());
  EXPECT_NE(failed.status().message().find("rank 1 of 2"), std::string::npos) << failed.status().message();
  EXPECT_NE(failed.status().message().find("injected device fault"), std::string::npos);
  for (int i = 0; i < 2; ++i) {  // failed for good, at once, naming the first failure
    auto again = group.forward(batch, kv);
    ASSERT_FALSE(again.is_ok());
    EXPECT_NE(again.status().message().find("the rank group failed earlier"), std::string::npos)
        << again.status().message();
    EXPECT_NE(again.status().message().find("injected device fault"), std::string::npos);
  }
  EXPECT_EQ(group.recoveries(), 0);
}

// A CHECK failure (a bug, or a library call the forward CHECKs: cuBLASLt's status 13 in session 13) aborts the
// process; its message names the rank whose worker hit it, as the ranks' Status errors do.
TEST(LockstepRecoveryDeathTest, ACheckFailureInsideARankNamesTheRank) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto lm = launch(2, 1, false);
        if (!lm.is_ok()) std::abort();
        LockstepModel& group = lockstep(**lm);
        kvcache::KvCache kv(group.kv_spec(8, 4),
                            [&](DType dt, Shape s) { return (*lm)->backend().alloc(dt, std::move(s)); });
        group.set_fault_hook_for_test([](int r) {
          MX_CHECK_MSG(r != 1, "injected check failure");
          return Status::ok();
        });
        (void)group.forward(prefill_batch(), kv);
      },
      "CHECK failed on rank 1 of 2 \\(CPU\\), at .*injected check failure");
}

using test::Outcome;
Outcome serve_one(runtime::Engine& engine, std::vector<int32_t> prompt) {
  return test::serve_one(engine, std::move(prompt), /*max_tokens=*/4, /*max_steps=*/200);
}

TEST(LockstepRecovery, Tp2Dp2WithDpAttentionServesAfterOneRanksOutOfMemory) {
  runtime::EngineConfig ec;
  ec.scheduler.block_size = 4;
  ec.n_blocks = 64;
  ec.max_model_len = 64;
  const std::vector<int32_t> first = {1, 2, 3, 4, 5, 6, 7}, second = {9, 8, 7, 6, 5, 4}, third = {3, 1, 4, 1, 5};
  auto fresh = launch(2, 2, true);
  ASSERT_TRUE(fresh.is_ok()) << fresh.status().to_string();
  const Outcome want = serve_one(*(*fresh)->make_engine(ec), third);
  ASSERT_EQ(want.finish, runtime::FinishReason::kLength) << want.error;

  auto lm = launch(2, 2, true);
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  auto engine = (*lm)->make_engine(ec);
  const Outcome ok = serve_one(*engine, first);
  ASSERT_EQ(ok.finish, runtime::FinishReason::kLength) << ok.error;
  LockstepModel& group = lockstep(**lm);
  Fault fault{3};  // DP rank 1's second tp rank (a group that may hold no rows: it still joins the MoE exchange)
  group.set_fault_hook_for_test([&fault](int r) { return fault(r); });
  const Outcome failed = serve_one(*engine, second);
  group.set_fault_hook_for_test(nullptr);
  EXPECT_EQ(failed.finish, runtime::FinishReason::kError);
  EXPECT_EQ(failed.error.rfind("out_of_memory: ", 0), 0u) << failed.error;
  EXPECT_NE(failed.error.find("rank 3 of 4"), std::string::npos) << failed.error;
  const Outcome after = serve_one(*engine, third);
  EXPECT_EQ(after.finish, runtime::FinishReason::kLength) << after.error;
  EXPECT_EQ(after.tokens, want.tokens);
  EXPECT_EQ(group.recoveries(), 1);
}

}  // namespace
}  // namespace mxserve::launch
