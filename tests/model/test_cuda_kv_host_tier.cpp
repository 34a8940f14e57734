// The host KV tier on the CUDA backend (label gpu): the self-test's round trip -- a prompt's blocks forced out
// to pinned host memory and copied back on the copy stream, layer by layer (one event per cached layer, the
// forward's layer l waiting for layer l's copies only) -- gives the target's logits, the MTP draft's logits
// and the accepted drafts bit for bit equal to a device prefix-cache hit, on both fixtures (GQA K/V; MLA
// latent + DSA indexer keys + the MTP layer's cache), short and long prompts. A benchmark line per fixture:
// the prefill of a new turn over a long cached prefix, the prefix hit in the device pool vs in the host tier
// vs not cached (same engine, same run): the host hit's extra time over the device hit is the load time the
// per-layer overlap did not hide. MXSERVE_FIXTURE_ROOT overrides the fixtures directory.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "backend/backend.h"
#include "model/causal_lm.h"
#include "../unit/runtime/forwarding_executor.h"
#include "runtime/engine.h"
#include "runtime/kv_host_mover.h"
#include "runtime/kv_tier_self_test.h"

namespace mxserve::runtime {
namespace {

std::string fixture_dir(const std::string& name) {
  const char* env = std::getenv("MXSERVE_FIXTURE_ROOT");
  return (env ? std::string(env) : std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures") + "/" + name;
}

class CudaKvHostTier : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaKvHostTier, RoundTripIsBitIdentical) {
  auto be = backend::make_backend("cuda");
  if (!be.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << be.status().to_string() << ")";
  auto lm = model::load_causal_lm(fixture_dir(GetParam()), **be, model::LoadOptions{});
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  const int32_t spec_steps = (*lm)->has_mtp() ? 2 : 0;
  struct Case {
    int64_t block_size, prompt_blocks;
  };
  // Each case with the loads one cudaMemcpyAsync per block and tensor (the default), then batched per layer
  // (MXSERVE_HOST_TIER_BATCH_COPIES=1, experimental: read when the tier's copy engine is made).
  for (const bool batched : {false, true})
  for (const Case c : {Case{16, 4}, Case{4, 4}, Case{16, 24}}) {  // 24 x 16 + 3 + 12 tokens: within 512 positions
    if (batched) setenv("MXSERVE_HOST_TIER_BATCH_COPIES", "1", 1);
    else unsetenv("MXSERVE_HOST_TIER_BATCH_COPIES");
    auto rep = run_kv_tier_self_test(make_model_executor(**lm, **be, 64, c.block_size), c.block_size, spec_steps,
                                     12, c.prompt_blocks);
    unsetenv("MXSERVE_HOST_TIER_BATCH_COPIES");
    ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
    std::printf("%s block %lld, %lld-block prompt%s: %s\n", GetParam().c_str(), static_cast<long long>(c.block_size),
                static_cast<long long>(c.prompt_blocks), batched ? ", batched copies" : "", rep->summary().c_str());
    EXPECT_TRUE(rep->identical) << rep->summary();
    EXPECT_EQ(rep->cached_host, c.prompt_blocks * c.block_size) << rep->summary();
    if (spec_steps > 0) {
      EXPECT_GT(rep->mtp_logit_values, 0) << rep->summary();
      EXPECT_GT(rep->drafted_host, 0) << rep->summary();
      EXPECT_EQ(rep->accepted_host, rep->accepted_device) << rep->summary();
      EXPECT_EQ(rep->drafted_host, rep->drafted_device) << rep->summary();
    }
  }
}

// Keeps the host tier's mover, to switch its per-layer overlap off for the baseline.
class MoverHandle final : public ForwardingExecutor {
 public:
  using ForwardingExecutor::ForwardingExecutor;
  Result<kvcache::BlockMover*> enable_host_tier(int64_t n_slots) override {
    MX_ASSIGN_OR_RETURN(kvcache::BlockMover * m, inner_->enable_host_tier(n_slots));
    mover = dynamic_cast<KvHostMover*>(m);
    return m;
  }
  KvHostMover* mover = nullptr;
};

// Time to the first token of one greedy request, and its output and usage.
struct Timed {
  double ms = 0;
  std::vector<int32_t> tokens;
  Usage usage;
};

Timed serve_timed(Engine& e, const std::vector<int32_t>& prompt, int32_t max_tokens) {
  Timed t;
  RequestSpec r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  EXPECT_TRUE(e.submit(r, [&t](const TokenEvent& ev) {
                 if (ev.token >= 0) t.tokens.push_back(ev.token);
                 if (ev.finish != FinishReason::kNone) t.usage = ev.usage;
               }).is_ok());
  const auto t0 = std::chrono::steady_clock::now();
  while (t.tokens.empty() && !e.idle()) e.step();  // a step ends with its tokens on the host (synchronized)
  t.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  while (!e.idle()) e.step();
  return t;
}

// Benchmark line (no timing assert): a new turn of kTurn tokens after a kPrefix-token shared context, its
// prefix hit in the device pool, then (after every cached block went to the host tier) in the host tier with
// the per-layer loads, again with the loads ordered whole before the forward (KvHostMover::set_per_layer(false),
// the baseline), and a turn over a context never seen (computed whole). Medians of kReps rounds; the cached
// token counts checked (the outputs' equality is RoundTripIsBitIdentical's).
void run_bench(const std::string& fixture, bool batched) {
  auto be = backend::make_backend("cuda");
  ASSERT_TRUE(be.is_ok()) << be.status().to_string();
  // MXSERVE_KV_TIER_BENCH_MODEL: a checkpoint directory to measure instead of the fixture (e.g. the trained model).
  const char* bench_model = std::getenv("MXSERVE_KV_TIER_BENCH_MODEL");
  const std::string dir = bench_model ? std::string(bench_model) : fixture_dir(fixture);
  auto lm = model::load_causal_lm(dir, **be, model::LoadOptions{});
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  // The context within the model's positions (the fixtures: 512): 3/4 of them, at most 4096, whole blocks.
  constexpr int64_t kBlock = 16, kReps = 5;
  const int64_t max_pos = (*lm)->config().max_position_embeddings > 0 ? (*lm)->config().max_position_embeddings : 4096;
  const int64_t kPrefix = std::min<int64_t>(4096, max_pos * 3 / 4) / kBlock * kBlock;
  const int64_t kTurn = std::max<int64_t>(kBlock, (max_pos - kPrefix) / 2);
  const int64_t V = (*lm)->config().vocab_size;
  EngineConfig cfg;
  cfg.scheduler.block_size = kBlock;
  cfg.scheduler.max_num_batched_tokens = 4096;
  cfg.scheduler.chunked_prefill_size = 4096;
  cfg.n_blocks = 4 * (kPrefix + kTurn) / kBlock;
  cfg.max_model_len = kPrefix + kTurn + 64;
  auto exec = std::make_unique<MoverHandle>(make_model_executor(**lm, **be, cfg.n_blocks, kBlock));
  MoverHandle* handle = exec.get();
  cfg.kv_cache_host_memory = exec->kv_bytes_per_block() * static_cast<uint64_t>(4 * cfg.n_blocks);
  const double prefix_mb = static_cast<double>(exec->kv_bytes_per_block()) * (kPrefix / kBlock) / 1e6;
  if (batched) setenv("MXSERVE_HOST_TIER_BATCH_COPIES", "1", 1);
  Engine e(cfg, std::move(exec));
  unsetenv("MXSERVE_HOST_TIER_BATCH_COPIES");
  ASSERT_NE(handle->mover, nullptr);
  auto tokens = [V](int64_t seed, int64_t n) {
    std::vector<int32_t> t;
    for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((seed * 7919 + i * 131 + i * i * 7) % V));
    return t;
  };
  std::vector<double> device_ms, host_ms, whole_ms, cold_ms;
  for (int64_t rep = 0; rep < kReps; ++rep) {
    auto context = tokens(100 + rep, kPrefix);
    auto turn = [&](int64_t k) {
      auto p = context;
      auto t = tokens(1000 + 10 * rep + k, kTurn);
      p.insert(p.end(), t.begin(), t.end());
      return p;
    };
    const Timed cold = serve_timed(e, turn(0), 2);  // computes the context: its blocks are cached
    const Timed dev = serve_timed(e, turn(1), 2);   // context from the device pool
    e.evict_prefix_cache();                         // every cached block to the host tier
    // Each turn new (a turn served before would hit its own blocks too): only the context is cached.
    const Timed host = serve_timed(e, turn(2), 2);  // context from the host tier, per-layer loads
    e.evict_prefix_cache();
    handle->mover->set_per_layer(false);
    const Timed whole = serve_timed(e, turn(3), 2);  // context from the host tier, loads before the forward
    handle->mover->set_per_layer(true);
    EXPECT_EQ(dev.usage.cached_tokens, kPrefix);
    EXPECT_EQ(dev.usage.cached_host_tokens, 0);
    EXPECT_EQ(host.usage.cached_tokens, kPrefix);
    EXPECT_EQ(host.usage.cached_host_tokens, kPrefix);
    EXPECT_EQ(whole.usage.cached_host_tokens, kPrefix);
    cold_ms.push_back(cold.ms);
    device_ms.push_back(dev.ms);
    host_ms.push_back(host.ms);
    whole_ms.push_back(whole.ms);
    e.evict_prefix_cache();
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double dev = median(device_ms), host = median(host_ms), whole = median(whole_ms);
  std::printf("host KV tier bench %s%s: %lld-token turn over a %lld-token context (%.2f MB of KV): TTFT with the "
              "context from the device pool %.2f ms; from the host tier, per-layer loads %.2f ms (+%.2f ms not "
              "hidden), loads before the forward %.2f ms (+%.2f ms); computed whole %.2f ms (median of %lld)\n",
              dir.c_str(), batched ? " (batched copies)" : "", static_cast<long long>(kTurn), static_cast<long long>(kPrefix), prefix_mb, dev, host,
              host - dev, whole, whole - dev, median(cold_ms), static_cast<long long>(kReps));
}

TEST_P(CudaKvHostTier, PrefillWithHostHitsHidesTheLoads) {
  if (!backend::make_backend("cuda").is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine";
  run_bench(GetParam(), /*batched=*/false);
  run_bench(GetParam(), /*batched=*/true);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaKvHostTier, ::testing::Values("glm4_moe_tiny_a", "glm_moe_dsa_tiny_a"));

}  // namespace
}  // namespace mxserve::runtime
