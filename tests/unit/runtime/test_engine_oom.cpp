// A device allocation that fails mid-step (core/device_oom.h) fails that step's requests with an
// out_of_memory error naming the allocation, and the engine keeps serving: the next request decodes exactly
// what it decodes on an engine that never failed. The failure is injected through the test hook every
// backend checks (the CPU backend's alloc; on CUDA the caching allocator's cudaMalloc, both tries) -- the
// same source runs as test_engine_oom (CPU backend, label cpu) and test_engine_oom_cuda (label gpu).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "backend/backend.h"
#include "core/device_oom.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"

#ifndef MXSERVE_OOM_TEST_BACKEND
#define MXSERVE_OOM_TEST_BACKEND "cpu"
#endif

namespace mxserve::runtime {
namespace {

// MXSERVE_FIXTURE_ROOT overrides the fixtures directory (the GPU machine runs from a copied tree).
const std::string kModel = [] {
  const char* env = std::getenv("MXSERVE_FIXTURE_ROOT");
  return (env != nullptr ? std::string(env) : std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures") + "/glm4_moe_tiny_a";
}();

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  std::string error;
};

struct Rig {
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<model::CausalLM> lm;
  std::unique_ptr<Engine> engine;
  std::map<RequestId, Outcome> out;

  Rig() {
    auto b = backend::make_backend(MXSERVE_OOM_TEST_BACKEND);
    if (!b.is_ok()) return;  // no GPU: the test skips
    be = std::move(*b);
    auto m = model::load_causal_lm(kModel, *be, model::LoadOptions{.load_mtp = false});
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    lm = std::move(*m);
    EngineConfig cfg;
    cfg.scheduler.block_size = 4;
    cfg.scheduler.max_num_batched_tokens = 64;
    cfg.scheduler.chunked_prefill_size = 24;
    cfg.n_blocks = 64;
    cfg.max_model_len = 256;
    engine = std::make_unique<Engine>(cfg, make_model_executor(*lm, *be, cfg.n_blocks, cfg.scheduler.block_size));
  }
  RequestId submit(std::vector<int32_t> prompt) {
    RequestSpec spec;
    spec.prompt = std::move(prompt);
    spec.sampling.temperature = 0;
    spec.sampling.max_tokens = 5;
    spec.sampling.ignore_eos = true;
    auto id = engine->submit(spec, [this](const TokenEvent& ev) {
      Outcome& o = out[ev.id];
      if (ev.token >= 0) o.tokens.push_back(ev.token);
      if (ev.finish != FinishReason::kNone) o.finish = ev.finish, o.error = ev.error;
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    return *id;
  }
  void run() {
    for (int i = 0; i < 1000 && !engine->idle(); ++i) {
      engine->step();
      EXPECT_TRUE(engine->check_invariants().is_ok());
    }
    EXPECT_TRUE(engine->idle());
  }
};

void a_failed_allocation_fails_only_that_steps_requests() {
  const std::vector<int32_t> a = {5, 17, 3, 99, 42, 7, 8, 100, 11, 12, 250, 31};
  const std::vector<int32_t> b = {9, 8, 7, 6, 5, 4, 3, 2, 1, 77, 66};
  Rig ref;
  if (!ref.be) GTEST_SKIP() << "no " << MXSERVE_OOM_TEST_BACKEND << " backend here";
  const RequestId ref_b = ref.submit(b);
  ref.run();
  ASSERT_EQ(ref.out[ref_b].finish, FinishReason::kLength);
  ASSERT_EQ(ref.out[ref_b].tokens.size(), 5u);

  Rig rig;
  const RequestId id_a = rig.submit(a);
  // The first forward's allocations come from an empty cache: fail the next two device allocations (on CUDA
  // the allocator drops its cache and tries once more before it gives up).
  alloc_fault::arm(1, 2);
  rig.run();
  alloc_fault::arm(0, 0);
  const Outcome& fa = rig.out[id_a];
  EXPECT_EQ(fa.finish, FinishReason::kError);
  EXPECT_EQ(fa.error.rfind("out_of_memory: ", 0), 0u) << fa.error;
  EXPECT_NE(fa.error.find("bytes"), std::string::npos) << fa.error;  // names the allocation
  EXPECT_NE(fa.error.find("--max-num-batched-tokens"), std::string::npos) << fa.error;  // and what to change
  EXPECT_EQ(rig.engine->stats().running, 0);

  // The engine keeps serving: the next request decodes what it decodes on an engine that never failed.
  const RequestId id_b = rig.submit(b);
  rig.run();
  EXPECT_EQ(rig.out[id_b].finish, FinishReason::kLength) << rig.out[id_b].error;
  EXPECT_EQ(rig.out[id_b].tokens, ref.out[ref_b].tokens);
  // And the failed prompt itself, resubmitted, now succeeds.
  const RequestId again = rig.submit(a);
  rig.run();
  EXPECT_EQ(rig.out[again].finish, FinishReason::kLength) << rig.out[again].error;
  EXPECT_EQ(rig.out[again].tokens.size(), 5u);
}

// Distinct suite names per backend: ctest names the two binaries' tests apart.
#if defined(MXSERVE_OOM_TEST_CUDA)
TEST(EngineOomCuda, AFailedAllocationFailsOnlyThatStepsRequests) { a_failed_allocation_fails_only_that_steps_requests(); }
#else
TEST(EngineOom, AFailedAllocationFailsOnlyThatStepsRequests) { a_failed_allocation_fails_only_that_steps_requests(); }
#endif

}  // namespace
}  // namespace mxserve::runtime
