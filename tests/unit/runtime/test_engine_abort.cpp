// Reliability: an aborted request (a client that hung up) gives its KV blocks back by the end of the next
// engine step, whatever its stage (waiting, mid-prefill, decoding, sharing prefix blocks with another
// request); blocks it shares stay with their other holders, its computed prompt blocks stay in the prefix
// cache and serve the next request correctly. (KV exhaustion -> preemption with no lost request is
// EngineSim.RandomTrafficUnderMemoryPressure; the HTTP-level hang-up is ServerLoad.*DisconnectAbortsAndFreesBlocks.)
#include <gtest/gtest.h>

#include <map>

#include "fake_model.h"
#include "runtime/engine.h"

namespace mxserve::runtime {
namespace {

using testing::FakeModel;
using testing::fake_greedy;

constexpr int64_t kVocab = 97;
constexpr int64_t kBlock = 4;

struct AbortSim {
  explicit AbortSim(int64_t max_running = 8, int64_t chunk = 64) {
    cfg.scheduler.block_size = kBlock;
    cfg.scheduler.max_num_batched_tokens = chunk;
    cfg.scheduler.chunked_prefill_size = chunk;
    cfg.scheduler.max_running = max_running;
    cfg.n_blocks = 128;
    cfg.max_model_len = 400;
    engine = std::make_unique<Engine>(cfg, std::make_unique<FakeModel>(cfg.n_blocks, kBlock, kVocab));
  }
  RequestId submit(std::vector<int32_t> prompt, int32_t max_tokens = 200) {
    RequestSpec spec;
    spec.prompt = std::move(prompt);
    spec.sampling.temperature = 0.f;
    spec.sampling.max_tokens = max_tokens;
    spec.sampling.ignore_eos = true;
    auto id = engine->submit(spec, [this](const TokenEvent& ev) {
      if (ev.token >= 0) tokens[ev.id].push_back(ev.token);
      if (ev.finish != FinishReason::kNone) finishes[ev.id].push_back(ev);
    });
    EXPECT_TRUE(id.is_ok());
    return *id;
  }
  void step() {
    engine->step();
    const Status s = engine->check_invariants();
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }
  // Blocks held by requests (not free, not held only by the prefix cache).
  int64_t held() const {
    const EngineStats st = engine->stats();
    return st.blocks_total - st.blocks_free - st.blocks_cached;
  }
  EngineConfig cfg;
  std::unique_ptr<Engine> engine;
  std::map<RequestId, std::vector<int32_t>> tokens;
  std::map<RequestId, std::vector<TokenEvent>> finishes;
};

std::vector<int32_t> prompt_of(int32_t len, int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < len; ++i) p.push_back(1 + (i * 7 + salt * 13) % (kVocab - 1));
  return p;
}

int64_t blocks_for(int64_t tokens) { return (tokens + kBlock - 1) / kBlock; }

TEST(EngineAbort, DecodingRequestFreesItsBlocksAtTheNextStep) {
  AbortSim sim;
  std::vector<int32_t> shared = prompt_of(16, 1);
  std::vector<int32_t> pa = shared, pb = shared;
  pa.insert(pa.end(), {5, 6, 7});
  pb.insert(pb.end(), {8, 9});
  const RequestId a = sim.submit(pa);
  ASSERT_NO_FATAL_FAILURE(sim.step());  // a prefills (its 4 full prompt blocks go to the prefix cache)
  const RequestId b = sim.submit(pb);   // b matches them: 4 blocks shared by a, b and the cache
  for (int i = 0; i < 10; ++i) ASSERT_NO_FATAL_FAILURE(sim.step());
  ASSERT_EQ(sim.tokens[a].size(), 11u);
  ASSERT_EQ(sim.tokens[b].size(), 10u);
  // computed = prompt + generated - 1 (the last sampled token is not computed yet); shared blocks count once.
  const int64_t a_blocks = blocks_for(19 + 11 - 1), b_blocks = blocks_for(18 + 10 - 1);
  EXPECT_EQ(sim.held(), a_blocks + b_blocks - 4);

  sim.engine->abort(a);
  ASSERT_NO_FATAL_FAILURE(sim.step());
  ASSERT_EQ(sim.finishes[a].size(), 1u);
  EXPECT_EQ(sim.finishes[a][0].finish, FinishReason::kAbort);
  EXPECT_EQ(sim.finishes[a][0].usage.completion_tokens, 11);
  EXPECT_EQ(sim.tokens[a].size(), 11u) << "no token after the abort";
  EXPECT_EQ(sim.held(), blocks_for(18 + 11 - 1)) << "only b's blocks are held, the shared ones included";
  EXPECT_EQ(sim.engine->stats().aborted, 1);
  EXPECT_EQ(sim.engine->stats().running, 1);

  sim.engine->abort(b);
  ASSERT_NO_FATAL_FAILURE(sim.step());
  EXPECT_EQ(sim.held(), 0);
  const EngineStats st = sim.engine->stats();
  EXPECT_GT(st.blocks_cached, 4) << "the aborted requests' computed blocks stay reusable";
  EXPECT_EQ(st.blocks_free + st.blocks_cached, st.blocks_total);

  // The cached blocks are correct: a new request over a's prompt hits them and decodes a's oracle.
  const RequestId c = sim.submit(pa, 12);
  while (!sim.engine->idle()) ASSERT_NO_FATAL_FAILURE(sim.step());
  ASSERT_EQ(sim.finishes[c].size(), 1u);
  EXPECT_GE(sim.finishes[c][0].usage.cached_tokens, 16);
  EXPECT_EQ(sim.tokens[c], fake_greedy(pa, 12, kVocab, {}));
  EXPECT_EQ(sim.held(), 0);
}

TEST(EngineAbort, MidPrefillAndWaitingRequestsFreeEverything) {
  AbortSim sim(/*max_running=*/1, /*chunk=*/8);
  const RequestId a = sim.submit(prompt_of(40, 2));  // 5 chunks of 8
  const RequestId b = sim.submit(prompt_of(12, 3));  // waits: one running slot
  ASSERT_NO_FATAL_FAILURE(sim.step());
  ASSERT_NO_FATAL_FAILURE(sim.step());
  EXPECT_EQ(sim.held(), 4) << "16 prompt tokens computed: 4 blocks (held by a and by the prefix cache)";
  EXPECT_EQ(sim.engine->stats().waiting, 1);
  sim.engine->abort(a);
  sim.engine->abort(b);
  ASSERT_NO_FATAL_FAILURE(sim.step());
  for (RequestId id : {a, b}) {
    ASSERT_EQ(sim.finishes[id].size(), 1u) << id;
    EXPECT_EQ(sim.finishes[id][0].finish, FinishReason::kAbort);
    EXPECT_TRUE(sim.tokens[id].empty());
  }
  EXPECT_EQ(sim.held(), 0);
  EXPECT_TRUE(sim.engine->idle());
  EXPECT_EQ(sim.engine->stats().aborted, 2);
  // Aborting again, or an unknown id, is a no-op.
  sim.engine->abort(a);
  sim.engine->abort(12345);
  ASSERT_NO_FATAL_FAILURE(sim.step());
  EXPECT_EQ(sim.finishes[a].size(), 1u);
  EXPECT_EQ(sim.engine->stats().aborted, 2);
}

}  // namespace
}  // namespace mxserve::runtime
