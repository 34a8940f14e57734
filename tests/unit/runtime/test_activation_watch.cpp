// ActivationWatch (runtime/activation_watch.h): when a serving step's activation peak on a rank deserves a warning
// against the start-up dry run's reserve (over it; the first time, then only after another 10%), and
// describe_step's one-line shape of a forward batch (prefill chunks vs decode / verify sequences). One rank: the
// model executor's watch over its eager forwards (runtime/executor.h watch_activations), here with a scripted
// allocator interval on the tiny model. The device side of rank groups (each rank's allocator interval around its
// job) runs on the GPU stand-in (dev/gpu/s12.sh part 2).
#include <gtest/gtest.h>

#include "runtime/activation_watch.h"

#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"
#include "runtime/executor.h"

namespace mxserve::runtime {
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

TEST(ActivationWatch, OverReserveMessageNamesTheRankOnlyInAGroup) {
  const std::string one = activation_over_reserve_message(0, 1, 300ull << 20, 200ull << 20, "1 row: ...");
  EXPECT_EQ(one.rfind("a step used 300 MiB of activations, above the 200 MiB the start-up dry run measured (the "
                      "reserve left beside the KV pool); the step: 1 row: ...", 0),
            0u)
      << one;
  const std::string group = activation_over_reserve_message(1, 4, 300ull << 20, 200ull << 20, "x");
  EXPECT_EQ(group.rfind("rank 1 of 4: a step used 300 MiB", 0), 0u) << group;
  EXPECT_NE(group.find("measured for this rank"), std::string::npos) << group;
  EXPECT_NE(group.find("--max-num-batched-tokens"), std::string::npos) << group;
}

// One rank: the executor reads the allocator interval around each eager forward (the scripted probe: 100 bytes
// live before, the step's peak `used` above it) and warns as ActivationWatch::over decides; unwatched, it never
// reads the probe.
TEST(ActivationWatch, OneRankExecutorWatchesEachEagerForward) {
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  auto lm = model::load_causal_lm(std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_a", *be,
                                  model::LoadOptions{.load_mtp = false});
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  const std::vector<uint64_t> used = {800, 1200, 1200, 1400, 900};  // one entry per forward of the request below
  int calls = 0;
  auto probe = [&]() {
    const int step = calls / 2;
    const bool after = calls % 2 == 1;
    ++calls;
    backend::MemoryInterval m;
    m.known = true;
    m.in_use = 100;
    m.peak = after && step < static_cast<int>(used.size()) ? 100 + used[step] : 100;
    return m;
  };
  auto run = [&](uint64_t reserve) {
    EngineConfig cfg;
    cfg.scheduler.block_size = 4;
    cfg.n_blocks = 64;
    cfg.max_model_len = 128;
    auto ex = make_model_executor(**lm, *be, cfg.n_blocks, cfg.scheduler.block_size);
    ex->watch_activations(reserve, probe);
    ModelExecutor* raw = ex.get();
    Engine engine(cfg, std::move(ex));
    RequestSpec spec;
    spec.prompt = {5, 17, 99, 3, 250, 41};
    spec.sampling.temperature = 0;
    spec.sampling.max_tokens = static_cast<int32_t>(used.size());  // a prefill, then a decode per further token
    spec.sampling.ignore_eos = true;
    EXPECT_TRUE(engine.submit(spec, [](const TokenEvent&) {}).is_ok());
    while (!engine.idle()) engine.step();
    return raw->activation_warnings();
  };
  // 800: within 1000; 1200: over (said); 1200 again: said once; 1400: >= 10% above 1200 (said); 900: within.
  EXPECT_EQ(run(1000), 2);
  EXPECT_EQ(calls, 2 * static_cast<int>(used.size())) << "two probe reads around each forward";
  calls = 0;
  EXPECT_EQ(run(0), 0);
  EXPECT_EQ(calls, 0) << "a 0 reserve: not watched, the probe never read";
}

}  // namespace
}  // namespace mxserve::runtime
