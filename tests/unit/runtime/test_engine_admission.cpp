// Admission counts only live requests (issue 31): a request whose client hung up (Engine::abort) stops
// counting against --max-queued-requests and the running slots at once, before the engine thread runs
// again. Deterministic: these engines are stepped by hand (never started), so a burst is submitted and
// dropped while the engine "never steps", and an abort can be injected in the middle of a step's forward
// (between the two publishes of the counts) through a hooked executor.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "fake_model.h"
#include "forwarding_executor.h"
#include "runtime/engine.h"

namespace mxserve::runtime {
namespace {

using testing::FakeModel;

constexpr int64_t kVocab = 97;
constexpr int64_t kBlock = 4;
constexpr int64_t kMaxRunning = 2;
constexpr int64_t kMaxWaiting = 3;
constexpr int64_t kCapacity = kMaxRunning + kMaxWaiting;  // what an idle engine admits before its next step

// Runs a hook (once) inside the forward, i.e. on the engine thread mid-step.
class HookedExecutor final : public ForwardingExecutor {
 public:
  using ForwardingExecutor::ForwardingExecutor;
  Result<ExecOutput> execute(const model::ForwardBatch& b) override {
    if (hook) std::exchange(hook, nullptr)();
    return ForwardingExecutor::execute(b);
  }
  std::function<void()> hook;
};

struct AdmissionSim {
  AdmissionSim() {
    cfg.scheduler.block_size = kBlock;
    cfg.scheduler.max_num_batched_tokens = 64;
    cfg.scheduler.chunked_prefill_size = 64;
    cfg.scheduler.max_running = kMaxRunning;
    cfg.max_waiting = kMaxWaiting;
    cfg.n_blocks = 128;
    cfg.max_model_len = 200;
    auto exec = std::make_unique<HookedExecutor>(std::make_unique<FakeModel>(cfg.n_blocks, kBlock, kVocab));
    hooked = exec.get();
    engine = std::make_unique<Engine>(cfg, std::move(exec));
  }
  // The request's id, or kRefused (the refusal must be the queue-full kUnavailable).
  static constexpr RequestId kRefused = ~RequestId{0};
  RequestId submit() {
    RequestSpec spec;
    spec.prompt = {1, 2, 3, static_cast<int32_t>(1 + submitted++ % (kVocab - 1))};
    spec.sampling.temperature = 0.f;
    spec.sampling.max_tokens = 100;
    spec.sampling.ignore_eos = true;
    auto id = engine->submit(spec, [this](const TokenEvent& ev) {
      if (ev.finish != FinishReason::kNone) finishes[ev.id].push_back(ev.finish);
    });
    if (id.is_ok()) return *id;
    EXPECT_EQ(id.status().code(), StatusCode::kUnavailable) << id.status().to_string();
    EXPECT_NE(id.status().message().find("waiting queue is full"), std::string::npos) << id.status().to_string();
    return kRefused;
  }
  // Submits until refused; returns the admitted ids (bounded, so a broken bound cannot loop forever).
  std::vector<RequestId> fill() {
    std::vector<RequestId> ids;
    for (int i = 0; i < 100; ++i) {
      const RequestId id = submit();
      if (id == kRefused) return ids;
      ids.push_back(id);
    }
    ADD_FAILURE() << "admission never refused (100 requests)";
    return ids;
  }
  void step() {
    engine->step();
    const Status s = engine->check_invariants();
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }
  EngineConfig cfg;
  HookedExecutor* hooked = nullptr;
  std::unique_ptr<Engine> engine;
  int submitted = 0;
  std::map<RequestId, std::vector<FinishReason>> finishes;
};

// The CI failure (ServerHostileClients): a burst is admitted, its clients hang up, and a new request comes
// before the engine thread has run (a loaded host). The dropped burst must not fill the queue.
TEST(EngineAdmission, BurstDroppedBeforeAnyStepFreesTheQueueAtOnce) {
  AdmissionSim sim;
  const std::vector<RequestId> burst = sim.fill();
  ASSERT_EQ(static_cast<int64_t>(burst.size()), kCapacity);
  for (RequestId id : burst) sim.engine->abort(id);
  sim.engine->abort(burst[0]);  // twice: counted once
  sim.engine->abort(12345);     // unknown: no effect
  const std::vector<RequestId> next = sim.fill();  // no step in between
  ASSERT_EQ(static_cast<int64_t>(next.size()), kCapacity) << "the dropped burst still counted";

  ASSERT_NO_FATAL_FAILURE(sim.step());
  for (RequestId id : burst) EXPECT_EQ(sim.finishes[id], std::vector<FinishReason>{FinishReason::kAbort}) << id;
  const EngineStats st = sim.engine->stats();
  EXPECT_EQ(st.aborted, kCapacity);
  EXPECT_EQ(st.running, kMaxRunning);
  EXPECT_EQ(st.waiting, kMaxWaiting);
  EXPECT_EQ(sim.submit(), AdmissionSim::kRefused) << "the live requests still fill the bound";
}

// After a step, the requests are published as waiting or running; dropping them uncounts them by phase.
TEST(EngineAdmission, DroppedWaitingAndRunningRequestsStopCounting) {
  AdmissionSim sim;
  const std::vector<RequestId> ids = sim.fill();
  ASSERT_EQ(static_cast<int64_t>(ids.size()), kCapacity);
  ASSERT_NO_FATAL_FAILURE(sim.step());
  ASSERT_EQ(sim.engine->stats().running, kMaxRunning);
  ASSERT_EQ(sim.engine->stats().waiting, kMaxWaiting);
  ASSERT_EQ(sim.submit(), AdmissionSim::kRefused);
  const RequestId run0 = ids[0], run1 = ids[1], wait0 = ids[2];

  // A dropped running request: while live requests wait, its slot goes to them, not to a newcomer.
  sim.engine->abort(run0);
  EXPECT_EQ(sim.submit(), AdmissionSim::kRefused) << "a freed running slot must not let the waiting queue exceed its bound";
  // A dropped waiting request frees its queue place at once.
  sim.engine->abort(wait0);
  const RequestId late = sim.submit();
  EXPECT_NE(late, AdmissionSim::kRefused) << "a dropped waiting request still counted";
  EXPECT_EQ(sim.submit(), AdmissionSim::kRefused);
  // Nothing live waits once the rest of the queue is dropped: the dropped running slot is free again.
  sim.engine->abort(ids[3]);
  sim.engine->abort(ids[4]);
  sim.engine->abort(late);
  EXPECT_EQ(static_cast<int64_t>(sim.fill().size()), kMaxWaiting + 1) << "queue + run0's slot";

  ASSERT_NO_FATAL_FAILURE(sim.step());
  for (RequestId id : {run0, wait0, ids[3], ids[4], late})
    EXPECT_EQ(sim.finishes[id], std::vector<FinishReason>{FinishReason::kAbort}) << id;
  EXPECT_TRUE(sim.finishes[run1].empty());
  EXPECT_EQ(sim.engine->stats().running, kMaxRunning);
  EXPECT_EQ(sim.engine->stats().waiting, kMaxWaiting);
  EXPECT_EQ(sim.submit(), AdmissionSim::kRefused);
}

// An abort that arrives while the engine thread is inside a step (after its drain, before it publishes the
// counts again) is not lost by that publish: the request stays uncounted until the next drain finishes it.
TEST(EngineAdmission, AbortDuringAStepStaysUncounted) {
  AdmissionSim sim;
  const std::vector<RequestId> ids = sim.fill();
  ASSERT_NO_FATAL_FAILURE(sim.step());  // 2 running, 3 waiting
  ASSERT_EQ(sim.submit(), AdmissionSim::kRefused);
  RequestId during = AdmissionSim::kRefused;  // stays so if the hook never ran
  sim.hooked->hook = [&] {
    sim.engine->abort(ids[4]);  // waiting: uncounted at once, and after the step's publish
    during = sim.submit();
  };
  ASSERT_NO_FATAL_FAILURE(sim.step());
  EXPECT_NE(during, AdmissionSim::kRefused) << "refused while a dropped request was counted";
  EXPECT_EQ(sim.submit(), AdmissionSim::kRefused) << "the step's publish counted the dropped request again (or lost the new one)";
  ASSERT_NO_FATAL_FAILURE(sim.step());
  EXPECT_EQ(sim.finishes[ids[4]], std::vector<FinishReason>{FinishReason::kAbort});
  EXPECT_EQ(sim.engine->stats().waiting, kMaxWaiting);
  EXPECT_EQ(sim.submit(), AdmissionSim::kRefused);
}

// Finished requests leave nothing behind: a long run of submit / abort / step keeps the bound exact.
TEST(EngineAdmission, ChurnKeepsTheBoundExact) {
  AdmissionSim sim;
  for (int round = 0; round < 20; ++round) {
    const std::vector<RequestId> ids = sim.fill();
    ASSERT_EQ(static_cast<int64_t>(ids.size()), round == 0 ? kCapacity : kCapacity - kMaxRunning) << round;
    ASSERT_NO_FATAL_FAILURE(sim.step());
    for (size_t i = 0; i < ids.size(); ++i)
      if (round == 0 ? i >= static_cast<size_t>(kMaxRunning) : true) sim.engine->abort(ids[i]);
    ASSERT_NO_FATAL_FAILURE(sim.step());
    ASSERT_EQ(sim.engine->stats().running, kMaxRunning) << round;
    ASSERT_EQ(sim.engine->stats().waiting, 0) << round;
  }
}

}  // namespace
}  // namespace mxserve::runtime
