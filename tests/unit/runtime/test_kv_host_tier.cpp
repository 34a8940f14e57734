// The host KV tier (--kv-cache-host-memory) through the engine with the real tiny fixtures on the CPU: the
// self-test's bit-identical round trip (target and MTP logits, acceptance) on both architectures (GQA and
// MLA + DSA indexer keys), a repeated long prefix served from the host tier after the device pool churned,
// a request hitting host blocks while another one's admission evicts, and exact block / slot accounting.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "runtime/engine.h"
#include "runtime/kv_tier_self_test.h"
#include "fixture_requests.h"
#include "forwarding_executor.h"

namespace mxserve::runtime {
namespace {

class KvHostTierFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(KvHostTierFixture, SelfTestRoundTripIsBitIdentical) {
  auto& m = testing::load_fixture(GetParam());
  ASSERT_TRUE(m.lm);
  const int32_t spec_steps = m.lm->has_mtp() ? 2 : 0;
  auto rep = run_kv_tier_self_test(make_model_executor(*m.lm, *m.be, 64, 4), 4, spec_steps);
  ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
  EXPECT_TRUE(rep->identical) << rep->summary();
  EXPECT_GT(rep->cached_host, 0) << rep->summary();
  EXPECT_EQ(rep->cached_host, rep->cached_device) << rep->summary();
  EXPECT_GT(rep->logit_values, 0);
  if (spec_steps > 0) {
    EXPECT_GT(rep->mtp_logit_values, 0) << rep->summary();
    EXPECT_GT(rep->drafted_host, 0) << rep->summary();
  }
}

// Planted bug: a mover that copies nothing back. The self-test must see it (the freed device blocks were
// overwritten by another prompt before the load). Skipping any single cache tensor of either fixture's layout
// (K or V of any layer, the MLA latent, the DSA indexer keys, the MTP layer's) was checked by hand the same way.
class NoLoadMover final : public kvcache::BlockMover {
 public:
  explicit NoLoadMover(kvcache::BlockMover* inner) : inner_(inner) {}
  Status to_host(std::span<const int32_t> d, std::span<const int32_t> h) override { return inner_->to_host(d, h); }
  Status from_host(std::span<const int32_t>, std::span<const int32_t>) override { return Status::ok(); }

 private:
  kvcache::BlockMover* inner_;
};

class NoLoadExecutor final : public ForwardingExecutor {
 public:
  using ForwardingExecutor::ForwardingExecutor;
  Result<kvcache::BlockMover*> enable_host_tier(int64_t n_slots) override {
    MX_ASSIGN_OR_RETURN(kvcache::BlockMover * inner, inner_->enable_host_tier(n_slots));
    mover_ = std::make_unique<NoLoadMover>(inner);
    return mover_.get();
  }

 private:
  std::unique_ptr<NoLoadMover> mover_;
};

TEST_P(KvHostTierFixture, SelfTestCatchesBlocksNotCopiedBack) {
  auto& m = testing::load_fixture(GetParam());
  ASSERT_TRUE(m.lm);
  auto rep = run_kv_tier_self_test(std::make_unique<NoLoadExecutor>(make_model_executor(*m.lm, *m.be, 64, 4)), 4,
                                   m.lm->has_mtp() ? 2 : 0);
  ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
  EXPECT_FALSE(rep->identical) << rep->summary();
  EXPECT_GT(rep->cached_host, 0) << rep->summary();
}

// More blocks per layer in flight (12 blocks x 5 cached layers of MLA latent + DSA indexer keys).
TEST(KvHostTier, SelfTestLongPromptIsBitIdentical) {
  auto& m = testing::load_fixture("glm_moe_dsa_tiny_a");
  auto rep = run_kv_tier_self_test(make_model_executor(*m.lm, *m.be, 64, 4), 4, 2, 12, /*prompt_blocks=*/12);
  ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
  EXPECT_TRUE(rep->identical) << rep->summary();
  EXPECT_EQ(rep->cached_host, 48) << rep->summary();
  EXPECT_EQ(rep->accepted_host, rep->accepted_device) << rep->summary();
  EXPECT_GT(rep->drafted_host, 0) << rep->summary();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvHostTierFixture, ::testing::Values("glm4_moe_tiny_a", "glm_moe_dsa_tiny_a"));

// An FP8 E4M3 cache (codes + per-slot scale tensors): the scales travel too.
TEST(KvHostTier, SelfTestWithFp8CacheCarriesScales) {
  auto be = backend::make_cpu_backend();
  model::LoadOptions opts;
  opts.kv_cache_dtype = kvcache::KvCacheDtype::kFp8E4M3;
  auto lm = model::load_causal_lm(std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_a", *be, opts);
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  auto exec = make_model_executor(**lm, *be, 64, 4);
  EXPECT_GT(exec->kv_bytes_per_block(), 0u);
  auto rep = run_kv_tier_self_test(std::move(exec), 4, (*lm)->has_mtp() ? 2 : 0);
  ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
  EXPECT_TRUE(rep->identical) << rep->summary();
  EXPECT_GT(rep->cached_host, 0) << rep->summary();
}

// glm_moe_dsa's FP8 cache (packed u8 latent rows of 52 bytes and indexer-key rows of 20 on this fixture,
// kernels/mla_fp8.h): the tier carries the new row sizes byte for byte, MTP layer included.
TEST(KvHostTier, SelfTestWithFp8LatentCache) {
  auto be = backend::make_cpu_backend();
  model::LoadOptions opts;
  opts.kv_cache_dtype = kvcache::KvCacheDtype::kFp8E4M3;
  auto lm = model::load_causal_lm(std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm_moe_dsa_tiny_a", *be, opts);
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  auto exec = make_model_executor(**lm, *be, 64, 4);
  EXPECT_EQ(exec->kv_bytes_per_block(), 4u * (5 * 52 + 3 * 20));
  auto rep = run_kv_tier_self_test(std::move(exec), 4, (*lm)->has_mtp() ? 2 : 0);
  ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
  EXPECT_TRUE(rep->identical) << rep->summary();
  EXPECT_GT(rep->cached_host, 0) << rep->summary();
  if ((*lm)->has_mtp()) EXPECT_GT(rep->drafted_host, 0) << rep->summary();
}

std::vector<int32_t> prompt_of(int seed, int n, int64_t vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((seed * 131 + i * 17 + i * i) % vocab));
  return p;
}

struct Outcome {
  std::vector<int32_t> tokens;
  Usage usage;
};

class Runner {
 public:
  Runner(testing::LoadedFixture& m, bool host_tier, int64_t n_blocks) {
    EngineConfig cfg;
    cfg.scheduler.block_size = 4;
    cfg.scheduler.max_num_batched_tokens = 256;
    cfg.scheduler.chunked_prefill_size = 256;
    cfg.n_blocks = n_blocks;
    cfg.max_model_len = 128;
    cfg.spec.num_steps = m.lm->has_mtp() ? 2 : 0;
    cfg.spec.adaptive = false;
    auto exec = make_model_executor(*m.lm, *m.be, cfg.n_blocks, 4);
    if (host_tier) cfg.kv_cache_host_memory = exec->kv_bytes_per_block() * 64;  // 64 host blocks
    engine_ = std::make_unique<Engine>(cfg, std::move(exec));
  }
  // Submits every prompt, steps until idle (checking the invariants after every step); outcomes in order.
  std::vector<Outcome> serve(const std::vector<std::vector<int32_t>>& prompts, int32_t max_tokens = 4) {
    std::vector<Outcome> out(prompts.size());
    std::map<RequestId, size_t> index;
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestSpec r;
      r.prompt = prompts[i];
      r.sampling.temperature = 0;
      r.sampling.max_tokens = max_tokens;
      r.sampling.ignore_eos = true;
      auto id = engine_->submit(r, [&out, &index](const TokenEvent& ev) {
        const size_t k = index.at(ev.id);
        if (ev.token >= 0) out[k].tokens.push_back(ev.token);
        if (ev.finish != FinishReason::kNone) out[k].usage = ev.usage;
      });
      EXPECT_TRUE(id.is_ok()) << id.status().to_string();
      if (id.is_ok()) index[*id] = i;
    }
    while (!engine_->idle()) {
      engine_->step();
      const Status inv = engine_->check_invariants();
      EXPECT_TRUE(inv.is_ok()) << inv.to_string();
      if (!inv.is_ok()) break;
    }
    return out;
  }
  Engine& engine() { return *engine_; }

 private:
  std::unique_ptr<Engine> engine_;
};

// A long prefix served again after other requests churned the device pool: its blocks come back from the
// host tier (cached_tokens counts them), the output equals a run without the tier, and the pool and the
// tier's slots return to their starting counts.
TEST(KvHostTier, RepeatedPrefixAfterChurnIsServedFromHost) {
  auto& m = testing::load_fixture("glm4_moe_tiny_a");
  const int64_t V = m.lm->config().vocab_size;
  const auto p = prompt_of(1, 41, V);
  std::vector<std::vector<int32_t>> churn = {prompt_of(2, 41, V), prompt_of(3, 41, V), prompt_of(4, 41, V)};

  Runner plain(m, /*host_tier=*/false, 24);
  const auto ref = plain.serve({p});

  Runner tiered(m, /*host_tier=*/true, 24);
  const auto first = tiered.serve({p});
  EXPECT_EQ(first[0].tokens, ref[0].tokens);
  tiered.serve(churn);  // 3 x 12 blocks through a 24-block pool: p's cached blocks are evicted
  const EngineStats mid = tiered.engine().stats();
  EXPECT_GT(mid.host_tier.offloaded_blocks, 0);
  EXPECT_GT(mid.host_blocks_used, 0);
  const auto again = tiered.serve({p});
  const EngineStats st = tiered.engine().stats();
  EXPECT_EQ(again[0].tokens, ref[0].tokens);
  EXPECT_GT(again[0].usage.cached_tokens, 0);
  const int64_t host_tokens = st.scheduler.prefix_host_hit_tokens - mid.scheduler.prefix_host_hit_tokens;
  EXPECT_GT(host_tokens, 0);
  EXPECT_LE(host_tokens, again[0].usage.cached_tokens);
  EXPECT_EQ(st.host_tier.loaded_blocks * 4, st.scheduler.prefix_host_hit_tokens);
  // Accounting: with nothing running, every device block is free or held by the prefix cache alone; after
  // evicting the cache every block is free, and the tier's slots add up.
  EXPECT_EQ(st.blocks_free + st.blocks_cached, st.blocks_total);
  tiered.engine().evict_prefix_cache();
  tiered.engine().step();  // publishes the stats
  const EngineStats end = tiered.engine().stats();
  EXPECT_EQ(end.blocks_free, end.blocks_total);
  EXPECT_TRUE(tiered.engine().check_invariants().is_ok());
  EXPECT_LE(end.host_blocks_used, end.host_blocks_total);
}

// A request whose prefix sits in the host tier is admitted in the same step right after one that takes most
// of the free pool, so loading it back must evict device blocks (offloading them into the tier while its own
// entries are pinned): both outputs equal the plain engine's, invariants hold at every step.
TEST(KvHostTier, HostHitWhileAnotherRequestEvicts) {
  auto& m = testing::load_fixture("glm_moe_dsa_tiny_a");
  const int64_t V = m.lm->config().vocab_size;
  const auto p = prompt_of(5, 33, V), q = prompt_of(6, 33, V), r = prompt_of(7, 45, V);

  Runner plain(m, false, 24);
  const auto ref = plain.serve({r, p});

  Runner tiered(m, true, 24);
  tiered.serve({p});
  tiered.serve({q});
  tiered.engine().evict_prefix_cache();  // p and q now live in the host tier only
  tiered.serve({q});                     // q back on the device (cached), p stays in the host tier
  const EngineStats before = tiered.engine().stats();
  const auto out = tiered.serve({r, p});  // r takes most free blocks; p's load evicts q's cached blocks
  const EngineStats after = tiered.engine().stats();
  EXPECT_EQ(out[0].tokens, ref[0].tokens);
  EXPECT_EQ(out[1].tokens, ref[1].tokens);
  EXPECT_GT(out[1].usage.cached_tokens, 0);
  EXPECT_GT(after.scheduler.prefix_host_hit_tokens, before.scheduler.prefix_host_hit_tokens);
  EXPECT_GT(after.host_tier.offloaded_blocks, before.host_tier.offloaded_blocks);
  EXPECT_EQ(after.blocks_free + after.blocks_cached, after.blocks_total);
}

}  // namespace
}  // namespace mxserve::runtime
