// A CUDA rank group on the one-GPU shared-device stand-in recovers from one rank's device out-of-memory
// (launch/lockstep_model.h "Recovery"): glm4_moe_tiny_a at tp 2 and at tp 2 x dp 2 + DP attention, through an
// engine: a request served; then one rank's forward fails with DeviceOutOfMemory (the test hook, as the caching
// allocator throws it) and that step's request ends with an out_of_memory error naming the rank; then a request
// decodes exactly what a fresh launch decodes (every rank's stream synchronized, the device-group communicators
// reset). Then a real allocator failure (core/device_oom.h alloc_fault, at a cudaMalloc of whichever rank comes
// first) is survived the same way. NCCL's recovery path (a fresh ncclGetUniqueId, ncclCommInitRank again) on a
// one-rank NCCL communicator: aborted by an out-of-memory, reset, and its all-reduce works again; a failure that
// is not an out-of-memory refuses. The start-up budget sized by --gpu-memory-utilization alone on the stand-in
// at tp 2 x dp 2 + DP attention (launch/launch_memory.h: the dry run's largest step and its --max-num-seqs
// decoding together) serves --max-num-seqs concurrent requests without a failure. And the caching allocators of several backends on one device: an allocation
// that does not fit releases the other allocators' cached blocks first (kernels/cuda/common/caching_allocator.h).
// Label gpu; skips without a CUDA device.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "serve_one.h"
#include "backend/backend.h"
#include "backend/device_memory.h"
#include "core/device_oom.h"
#include "launch/launch.h"
#include "launch/launch_memory.h"
#include "launch/lockstep_model.h"
#include "parallel/nccl_communicator.h"
#include "parallel/recoverable.h"
#include "runtime/engine.h"

namespace mxserve::launch {
namespace {

const std::string kFixture = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_a";

Result<std::unique_ptr<LaunchedModel>> launch(const parallel::ParallelConfig& p) {
  LaunchConfig lc;
  lc.model.path = kFixture;
  lc.model.load_mtp = false;
  lc.backend = "cuda";
  lc.communicator = "shared-device";
  lc.parallel = p;
  lc.cpu_group.timeout = std::chrono::seconds(60);
  return launch_model(lc);
}

using test::Outcome;
Outcome serve_one(runtime::Engine& engine, std::vector<int32_t> prompt) {
  return test::serve_one(engine, std::move(prompt), /*max_tokens=*/5, /*max_steps=*/500);
}

runtime::EngineConfig engine_config() {
  runtime::EngineConfig ec;
  ec.scheduler.block_size = 16;
  ec.n_blocks = 64;
  ec.max_model_len = 256;
  ec.cuda_graphs = false;  // eager steps: under DP they are anyway; at dp 1 the joined capture is tested elsewhere
  return ec;
}

class CudaLockstepRecovery : public ::testing::Test {
 protected:
  void SetUp() override {
    auto be = backend::make_backend("cuda");
    if (!be.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << be.status().to_string() << ")";
  }
};

TEST_F(CudaLockstepRecovery, StandInServesAfterOneRanksOutOfMemory) {
  const std::vector<int32_t> first = {5, 17, 3, 99, 42, 7, 8, 100, 11}, second = {9, 8, 7, 6, 5, 4, 3, 2},
                             third = {31, 41, 59, 26, 53, 58, 97, 93, 23, 84}, fourth = {2, 7, 18, 28, 18, 28, 45};
  const struct {
    const char* name;
    parallel::ParallelConfig p;
    int failing;
  } layouts[] = {{"tp2", {.tp = 2}, 1}, {"tp2 x dp2 + DP attention", {.tp = 2, .dp = 2, .dp_attention = true}, 3}};
  for (const auto& l : layouts) {
    SCOPED_TRACE(l.name);
    Outcome want3, want4;
    {
      auto fresh = launch(l.p);
      ASSERT_TRUE(fresh.is_ok()) << fresh.status().to_string();
      auto engine = (*fresh)->make_engine(engine_config());
      want3 = serve_one(*engine, third);
      want4 = serve_one(*engine, fourth);
      ASSERT_EQ(want3.finish, runtime::FinishReason::kLength) << want3.error;
      ASSERT_EQ(want4.finish, runtime::FinishReason::kLength) << want4.error;
    }
    auto lm = launch(l.p);
    ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
    auto* group = dynamic_cast<LockstepModel*>(&(*lm)->model());
    ASSERT_NE(group, nullptr);
    auto engine = (*lm)->make_engine(engine_config());
    const Outcome ok = serve_one(*engine, first);
    ASSERT_EQ(ok.finish, runtime::FinishReason::kLength) << ok.error;

    int left = 1;  // the failing rank's next forward meets a full device (as the caching allocator throws it)
    group->set_fault_hook_for_test([&left, &l](int r) -> Status {
      if (r == l.failing && left-- > 0) throw DeviceOutOfMemory("injected: CUDA out of memory on this rank", 1 << 20);
      return Status::ok();
    });
    const Outcome failed = serve_one(*engine, second);
    group->set_fault_hook_for_test(nullptr);
    EXPECT_EQ(failed.finish, runtime::FinishReason::kError);
    EXPECT_EQ(failed.error.rfind("out_of_memory: ", 0), 0u) << failed.error;
    EXPECT_NE(failed.error.find("rank " + std::to_string(l.failing) + " of "), std::string::npos) << failed.error;
    const Outcome after = serve_one(*engine, third);
    EXPECT_EQ(after.finish, runtime::FinishReason::kLength) << after.error;
    EXPECT_EQ(after.tokens, want3.tokens);
    EXPECT_EQ(group->recoveries(), 1);

    // A real allocation failure: the next two cudaMallocs (the allocator drops its cache and tries once more)
    // fail on whichever rank allocates first. A new prompt length makes new block sizes; if no cudaMalloc came
    // (all served from the caches), the step simply succeeds.
    alloc_fault::arm(1, 2);
    const Outcome maybe = serve_one(*engine, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                              21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37});
    alloc_fault::arm(0, 0);
    if (maybe.finish == runtime::FinishReason::kError) {
      EXPECT_EQ(maybe.error.rfind("out_of_memory: ", 0), 0u) << maybe.error;
      EXPECT_EQ(group->recoveries(), 2);
    } else {
      EXPECT_EQ(maybe.finish, runtime::FinishReason::kLength) << maybe.error;
    }
    const Outcome last = serve_one(*engine, fourth);
    EXPECT_EQ(last.finish, runtime::FinishReason::kLength) << last.error;
    EXPECT_EQ(last.tokens, want4.tokens);
  }
}

TEST_F(CudaLockstepRecovery, AnAllocationThatDoesNotFitReleasesTheOtherAllocatorsCaches) {
  auto a = backend::make_backend("cuda");
  auto b = backend::make_backend("cuda");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  const uint64_t free_b = backend::device_memory(**a).device_free;
  ASSERT_GT(free_b, 0u);
  // A holds 60% of the free memory in its cache (allocated, then dropped: cached, not in use).
  const int64_t big = static_cast<int64_t>(static_cast<double>(free_b) * 0.6);
  { Tensor t = (*a)->alloc(DType::kU8, {big}); }
  EXPECT_GE(backend::device_memory(**a).cached, static_cast<uint64_t>(big));
  // B needs as much: it fits only once A's cache is released (B's own cache is empty).
  Tensor t;
  try {
    t = (*b)->alloc(DType::kU8, {big});
  } catch (const DeviceOutOfMemory& oom) {
    FAIL() << "B's allocation failed although A's cache could be released: " << oom.what();
  }
  EXPECT_EQ(backend::device_memory(**a).cached, 0u);
}

TEST_F(CudaLockstepRecovery, UtilizationSizedStandInServesMaxNumSeqsTogether) {
  auto lm = launch({.tp = 2, .dp = 2, .dp_attention = true});
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  KvBudgetRequest kr;
  kr.block_size = 16;
  kr.max_num_batched_tokens = kr.chunked_prefill_size = 128;
  kr.max_model_len = 256;
  kr.max_num_seqs = 8;
  kr.utilization_given = true;
  kr.gpu_memory_utilization = 0.5;
  auto budget = plan_kv_budget(**lm, kr);
  ASSERT_TRUE(budget.is_ok()) << budget.status().to_string();
  EXPECT_GT(budget->peak_activation_bytes, 0u);
  ASSERT_GT(budget->kv_bytes_per_rank, 0u);
  runtime::EngineConfig ec = engine_config();
  ec.scheduler.max_num_batched_tokens = ec.scheduler.chunked_prefill_size = 128;
  ec.scheduler.max_running = 8;
  ec.n_blocks = std::min<int64_t>((*lm)->kv_blocks_for_bytes(16, budget->kv_bytes_per_rank), 1 << 16) / 2 * 2;
  ASSERT_GE(ec.n_blocks, 64);
  auto engine = (*lm)->make_engine(ec);
  std::vector<Outcome> outs(8);
  for (int i = 0; i < 8; ++i) {
    runtime::RequestSpec req;
    for (int j = 0; j < 40 + 7 * i; ++j) req.prompt.push_back(1 + (j * 13 + i * 29) % 300);
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 12;
    req.sampling.ignore_eos = true;
    Outcome* o = &outs[i];
    ASSERT_TRUE(engine
                    ->submit(req,
                             [o](const runtime::TokenEvent& ev) {
                               if (ev.token >= 0) o->tokens.push_back(ev.token);
                               if (ev.finish != runtime::FinishReason::kNone) o->finish = ev.finish, o->error = ev.error;
                             })
                    .is_ok());
  }
  for (int i = 0; i < 2000 && !engine->idle(); ++i) engine->step();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(outs[i].finish, runtime::FinishReason::kLength) << "request " << i << ": " << outs[i].error;
    EXPECT_EQ(outs[i].tokens.size(), 12u) << "request " << i;
  }
}

TEST_F(CudaLockstepRecovery, NcclReinitialisesAfterAnOutOfMemoryAbort) {
  auto be = backend::make_backend("cuda");
  ASSERT_TRUE(be.is_ok());
  const parallel::RankLayout one{.tp = 1, .rank = 0};
  auto made = parallel::make_nccl_communicators({one}, {be->get()}, nullptr, {});
  if (!made.is_ok()) GTEST_SKIP() << "no NCCL here: " << made.status().to_string();
  parallel::Communicator& comm = *(*made)[0];
  auto sum_works = [&] {
    Tensor host = Tensor::empty(DType::kF32, {4});
    for (int i = 0; i < 4; ++i) host.data<float>()[i] = static_cast<float>(i + 1);
    Tensor x = (*be)->upload(host);
    const Status st = comm.all_reduce(x, parallel::ReduceOp::kSum);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    (*be)->synchronize();
    const Tensor back = (*be)->to_host(x);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(back.data<float>()[i], static_cast<float>(i + 1));
    return st.is_ok();
  };
  ASSERT_TRUE(sum_works());
  auto* resettable = dynamic_cast<parallel::RecoverableGroup*>(&comm);
  ASSERT_NE(resettable, nullptr);
  comm.abort(out_of_memory("injected: the device is full"));  // ncclCommAbort: terminal for that communicator
  Tensor y = (*be)->alloc(DType::kF32, {4});
  EXPECT_FALSE(comm.all_reduce(y, parallel::ReduceOp::kSum).is_ok());
  (*be)->synchronize();
  const Status reset = resettable->reset_after_abort();
  ASSERT_TRUE(reset.is_ok()) << reset.to_string();
  EXPECT_TRUE(sum_works());
  EXPECT_TRUE(sum_works());
  comm.abort(internal_error("injected: a device fault"));  // not recoverable: refused, stays failed
  const Status refused = resettable->reset_after_abort();
  EXPECT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("cannot recover"), std::string::npos) << refused.to_string();
  EXPECT_FALSE(comm.all_reduce(y, parallel::ReduceOp::kSum).is_ok());
}

}  // namespace
}  // namespace mxserve::launch
