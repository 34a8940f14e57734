// The host KV tier's per-layer loads (kvcache/layer_load_gate.h, runtime/kv_host_mover.h) on the CPU:
//  - the decoder frame waits on the cache's gate once per cached layer, in layer order, before that layer's
//    attention reads the cache (a recording gate that fills layer l only when waited for: any read before the
//    wait would see zeros and change the logits), the MTP layer's forward too, on both architectures;
//  - the mover's loads land per layer in call order (an offload or an eviction of a target first completes them);
//  - a load that cannot be done is an error naming the slot and block, and through the engine the prefix is
//    recomputed: the output equals the run without the tier, never corrupt; the request's usage names its
//    host-tier tokens.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "fixture_requests.h"
#include "forwarding_executor.h"
#include "kvcache/layer_load_gate.h"
#include "runtime/engine.h"
#include "runtime/kv_host_mover.h"

namespace mxserve::runtime {
namespace {

// Per tensor of a cache: its bytes (a CPU backend cache lives in host memory).
using Snapshot = std::vector<std::vector<uint8_t>>;

Snapshot snapshot(kvcache::KvCache& kv) {
  Snapshot s;
  for (Tensor* t : kv.all_tensors()) {
    const auto* p = static_cast<const uint8_t*>(t->raw());
    s.emplace_back(p, p + t->nbytes());
  }
  return s;
}

// The cache tensors of one cached layer, as indices into all_tensors().
std::vector<size_t> layer_tensors(kvcache::KvCache& kv, int64_t layer) {
  std::vector<const Tensor*> mine;
  for (const auto& t : kv.spec().layers[layer].tensors) {
    mine.push_back(&kv.tensor(layer, t.role));
    if (const Tensor* sc = kv.scales_if_any(layer, t.role)) mine.push_back(sc);
  }
  std::vector<size_t> out;
  const auto all = kv.all_tensors();
  for (size_t i = 0; i < all.size(); ++i)
    for (const Tensor* t : mine)
      if (all[i] == t) out.push_back(i);
  return out;
}

// Rows [0, rows) of every tensor of `layer`: zeroed, or restored from a snapshot.
void fill_layer(kvcache::KvCache& kv, int64_t layer, int64_t rows, const Snapshot* from) {
  const auto all = kv.all_tensors();
  for (size_t i : layer_tensors(kv, layer)) {
    const uint64_t bytes = all[i]->nbytes() / static_cast<uint64_t>(all[i]->dim(0)) * static_cast<uint64_t>(rows);
    auto* p = static_cast<uint8_t*>(all[i]->raw());
    if (from) std::memcpy(p, (*from)[i].data(), bytes);
    else std::memset(p, 0, bytes);
  }
}

// Fills layer l's prefix rows only when the forward waits for layer l; records the waits.
class RecordingGate final : public kvcache::LayerLoadGate {
 public:
  RecordingGate(kvcache::KvCache& kv, const Snapshot& full, int64_t rows) : kv_(kv), full_(full), rows_(rows) {}
  Status wait(int64_t layer) override {
    waits.push_back(layer);
    fill_layer(kv_, layer, rows_, &full_);
    return Status::ok();
  }
  std::vector<int64_t> waits;

 private:
  kvcache::KvCache& kv_;
  const Snapshot& full_;
  int64_t rows_;
};

model::ForwardBatch batch_of(const std::vector<int32_t>& tokens, int32_t begin, int32_t n, int32_t block_size) {
  model::ForwardBatch b;
  for (int32_t i = 0; i < n; ++i) {
    b.token_ids.push_back(tokens[begin + i]);
    b.positions.push_back(begin + i);
    b.logit_rows.push_back(i);
  }
  model::SequenceSpan s;
  s.token_begin = 0;
  s.n_tokens = n;
  s.kv_len = begin + n;
  for (int32_t blk = 0; blk * block_size < begin + n; ++blk) s.block_table.push_back(blk);
  b.seqs.push_back(s);
  b.want_hidden = true;
  return b;
}

std::vector<float> host_floats(backend::Backend& be, const Tensor& t) {
  const Tensor h = be.to_host(t);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

class LayerLoadFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(LayerLoadFixture, FrameWaitsEachLayerOnceInOrderBeforeReading) {
  auto& m = testing::load_fixture(GetParam());
  ASSERT_TRUE(m.lm);
  constexpr int32_t kBs = 4, kPrefix = 8, kNew = 4;
  kvcache::KvCache kv(m.lm->kv_spec(4, kBs), [&](DType dt, Shape s) { return m.be->alloc(dt, std::move(s)); });
  const int64_t L = m.lm->config().n_layers;
  const bool mtp = m.lm->has_mtp();
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < kPrefix + kNew; ++i) tokens.push_back((i * 37 + 11) % static_cast<int32_t>(m.lm->config().vocab_size));

  // Reference: the prefix computed into the cache, then the continuation reads it (target and MTP forwards).
  const auto pre = batch_of(tokens, 0, kPrefix, kBs), cont = batch_of(tokens, kPrefix, kNew, kBs);
  auto out = m.lm->forward(pre, kv);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  if (mtp) ASSERT_TRUE(m.lm->forward_mtp(pre, out->hidden, kv).is_ok());
  const Snapshot full = snapshot(kv);
  auto ref = m.lm->forward(cont, kv);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  const std::vector<float> ref_logits = host_floats(*m.be, ref->logits);
  std::vector<float> ref_mtp;
  if (mtp) {
    auto r = m.lm->forward_mtp(cont, ref->hidden, kv);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ref_mtp = host_floats(*m.be, r->logits);
  }

  // The prefix rows of every cached layer wiped: without a gate the continuation's logits change (the test
  // can tell a read before the wait).
  for (int64_t l = 0; l < kv.spec().n_layers(); ++l) fill_layer(kv, l, kPrefix, nullptr);
  auto wiped = m.lm->forward(cont, kv);
  ASSERT_TRUE(wiped.is_ok());
  EXPECT_NE(host_floats(*m.be, wiped->logits), ref_logits) << "the wiped prefix must matter";

  // With the gate: layer l's rows come back only at wait(l); the logits are bit-identical, each layer waited
  // once, in order; the MTP forward waits for the MTP layer (cached layer n_layers) alone.
  for (int64_t l = 0; l < kv.spec().n_layers(); ++l) fill_layer(kv, l, kPrefix, nullptr);
  RecordingGate gate(kv, full, kPrefix);
  kv.set_load_gate(&gate);
  auto got = m.lm->forward(cont, kv);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  std::vector<int64_t> want;
  for (int64_t l = 0; l < L; ++l) want.push_back(l);
  EXPECT_EQ(gate.waits, want);
  EXPECT_EQ(host_floats(*m.be, got->logits), ref_logits);
  if (mtp) {
    auto r = m.lm->forward_mtp(cont, got->hidden, kv);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    want.push_back(L);
    EXPECT_EQ(gate.waits, want);
    EXPECT_EQ(host_floats(*m.be, r->logits), ref_mtp);
  }
  kv.set_load_gate(nullptr);
}

// A gate error stops the forward with that error (no logits computed over bytes that never arrived).
TEST_P(LayerLoadFixture, GateErrorFailsTheForward) {
  auto& m = testing::load_fixture(GetParam());
  kvcache::KvCache kv(m.lm->kv_spec(4, 4), [&](DType dt, Shape s) { return m.be->alloc(dt, std::move(s)); });
  struct Failing final : kvcache::LayerLoadGate {
    Status wait(int64_t layer) override {
      return layer == 1 ? internal_error("host KV tier: the loads of cached layer 1 into blocks [2] failed")
                        : Status::ok();
    }
  } gate;
  kv.set_load_gate(&gate);
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  auto out = m.lm->forward(batch_of(tokens, 0, 5, 4), kv);
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().to_string().find("blocks [2]"), std::string::npos) << out.status().to_string();
  kv.set_load_gate(nullptr);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LayerLoadFixture, ::testing::Values("glm4_moe_tiny_a", "glm_moe_dsa_tiny_a"));

// The mover on the CPU: a load is kept per layer until waited (or settled), so the per-layer contract is
// observable; an offload or the eviction of a load target completes pending loads first (call order).
class MoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_ = &testing::load_fixture("glm_moe_dsa_tiny_a");
    kv_ = std::make_unique<kvcache::KvCache>(m_->lm->kv_spec(4, 4),
                                             [this](DType dt, Shape s) { return m_->be->alloc(dt, std::move(s)); });
    // Distinct bytes everywhere.
    int k = 0;
    for (Tensor* t : kv_->all_tensors()) {
      auto* p = static_cast<uint8_t*>(t->raw());
      ++k;
      for (uint64_t i = 0; i < t->nbytes(); ++i) p[i] = static_cast<uint8_t>(((i + 1) * 2654435761u) >> 11 ^ k);
    }
    auto mv = KvHostMover::make(*m_->be, *kv_, 3);
    ASSERT_TRUE(mv.is_ok()) << mv.status().to_string();
    mover_ = std::move(*mv);
  }
  // Block b's rows of every tensor of `layer` (all layers: -1).
  std::vector<uint8_t> block_bytes(int32_t b, int64_t layer = -1) {
    std::vector<uint8_t> out;
    const auto all = kv_->all_tensors();
    for (int64_t l = 0; l < kv_->spec().n_layers(); ++l) {
      if (layer >= 0 && l != layer) continue;
      for (size_t i : layer_tensors(*kv_, l)) {
        const uint64_t per = all[i]->nbytes() / static_cast<uint64_t>(all[i]->dim(0)) * 4;
        const auto* p = static_cast<const uint8_t*>(all[i]->raw()) + per * static_cast<uint64_t>(b);
        out.insert(out.end(), p, p + per);
      }
    }
    return out;
  }
  std::vector<int32_t> v(std::initializer_list<int32_t> x) { return x; }

  testing::LoadedFixture* m_ = nullptr;
  std::unique_ptr<kvcache::KvCache> kv_;
  std::unique_ptr<KvHostMover> mover_;
};

TEST_F(MoverTest, LoadsLandPerLayerWhenWaited) {
  const auto b1 = block_bytes(1);
  ASSERT_TRUE(mover_->to_host(v({1}), v({2})).is_ok());  // block 1 -> slot 2
  ASSERT_TRUE(mover_->from_host(v({2}), v({3})).is_ok());  // slot 2 -> block 3, per layer
  EXPECT_EQ(kv_->load_gate(), mover_.get()) << "the gate is installed while loads are pending";
  EXPECT_TRUE(mover_->loads_pending());
  const int64_t L = kv_->spec().n_layers();
  ASSERT_GE(L, 2);
  EXPECT_NE(block_bytes(3, 0), block_bytes(1, 0)) << "nothing lands before the forward waits";
  ASSERT_TRUE(mover_->wait(0).is_ok());
  EXPECT_EQ(block_bytes(3, 0), block_bytes(1, 0)) << "layer 0 landed";
  EXPECT_NE(block_bytes(3, 1), block_bytes(1, 1)) << "layer 1 not yet";
  ASSERT_TRUE(mover_->wait(0).is_ok());  // idempotent
  for (int64_t l = 1; l < L; ++l) ASSERT_TRUE(mover_->wait(l).is_ok());
  EXPECT_EQ(block_bytes(3), b1);
  EXPECT_EQ(kv_->load_gate(), nullptr) << "nothing pending: the gate leaves the cache";
  EXPECT_FALSE(mover_->loads_pending());
  EXPECT_FALSE(mover_->wait(L).is_ok()) << "a layer outside the cache is an error";
}

// The benchmark baseline: per-layer off orders the whole load at once (nothing left for the forward to wait on).
TEST_F(MoverTest, PerLayerOffLoadsWholeAtOnce) {
  const auto b1 = block_bytes(1);
  ASSERT_TRUE(mover_->to_host(v({1}), v({0})).is_ok());
  mover_->set_per_layer(false);
  ASSERT_TRUE(mover_->from_host(v({0}), v({2})).is_ok());
  EXPECT_EQ(block_bytes(2), b1);
  EXPECT_FALSE(mover_->loads_pending());
  EXPECT_EQ(kv_->load_gate(), nullptr);
}

TEST_F(MoverTest, OffloadAndEvictionCompletePendingLoadsFirst) {
  const auto b1 = block_bytes(1), b0 = block_bytes(0);
  ASSERT_TRUE(mover_->to_host(v({1}), v({2})).is_ok());
  ASSERT_TRUE(mover_->from_host(v({2}), v({3})).is_ok());
  // Slot 2 is rewritten by the next offload: the pending load must have read it before.
  ASSERT_TRUE(mover_->to_host(v({0}), v({2})).is_ok());
  EXPECT_EQ(block_bytes(3), b1);
  EXPECT_EQ(kv_->load_gate(), nullptr);
  // A load target evicted before any forward waited: completed before the pool may hand it out.
  ASSERT_TRUE(mover_->from_host(v({2}), v({1})).is_ok());
  ASSERT_TRUE(mover_->before_free(v({0})).is_ok());
  EXPECT_TRUE(mover_->loads_pending()) << "not a target: nothing to complete";
  ASSERT_TRUE(mover_->before_free(v({1})).is_ok());
  EXPECT_FALSE(mover_->loads_pending());
  EXPECT_EQ(block_bytes(1), b0);
}

TEST_F(MoverTest, ALoadThatCannotBeDoneNamesTheBlock) {
  auto st = mover_->from_host(v({3}), v({1}));  // 3 slots: 0..2
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("host slot 3 into device block 1"), std::string::npos) << st.to_string();
  st = mover_->from_host(v({0}), v({4}));  // 4 blocks: 0..3
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("device block 4"), std::string::npos) << st.to_string();
  st = mover_->from_host(v({0, 1}), v({2}));
  EXPECT_FALSE(st.is_ok());
  EXPECT_EQ(kv_->load_gate(), nullptr) << "nothing was issued";
  EXPECT_FALSE(mover_->loads_pending());
}

// Through the engine: a mover whose loads are refused (a slot past the tier: a short host copy) -> the
// scheduler recomputes the prefix; the output equals the run without the tier and the error names the block.
class ShortLoadMover final : public kvcache::BlockMover {
 public:
  explicit ShortLoadMover(kvcache::BlockMover* inner) : inner_(inner) {}
  Status to_host(std::span<const int32_t> d, std::span<const int32_t> h) override { return inner_->to_host(d, h); }
  Status from_host(std::span<const int32_t> h, std::span<const int32_t> d) override {
    std::vector<int32_t> past(h.begin(), h.end());
    for (auto& s : past) s += 1 << 20;
    const Status st = inner_->from_host(past, d);
    errors.push_back(st.to_string());
    return st;
  }
  Status before_free(std::span<const int32_t> d) override { return inner_->before_free(d); }
  std::vector<std::string> errors;

 private:
  kvcache::BlockMover* inner_;
};

class ShortLoadExecutor final : public ForwardingExecutor {
 public:
  using ForwardingExecutor::ForwardingExecutor;
  Result<kvcache::BlockMover*> enable_host_tier(int64_t n_slots) override {
    MX_ASSIGN_OR_RETURN(kvcache::BlockMover * inner, inner_->enable_host_tier(n_slots));
    mover = std::make_unique<ShortLoadMover>(inner);
    return mover.get();
  }
  std::unique_ptr<ShortLoadMover> mover;
};

struct Served {
  std::vector<int32_t> tokens;
  Usage usage;
};

Served serve(Engine& e, const std::vector<int32_t>& prompt) {
  Served s;
  RequestSpec r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 4;
  r.sampling.ignore_eos = true;
  EXPECT_TRUE(e.submit(r, [&s](const TokenEvent& ev) {
                 if (ev.token >= 0) s.tokens.push_back(ev.token);
                 if (ev.finish != FinishReason::kNone) s.usage = ev.usage;
               }).is_ok());
  while (!e.idle()) {
    e.step();
    EXPECT_TRUE(e.check_invariants().is_ok());
  }
  return s;
}

std::unique_ptr<Engine> engine_for(testing::LoadedFixture& m, std::unique_ptr<ModelExecutor> exec, bool tier) {
  EngineConfig cfg;
  cfg.scheduler.block_size = 4;
  cfg.n_blocks = 32;
  cfg.max_model_len = 64;
  if (tier) cfg.kv_cache_host_memory = exec->kv_bytes_per_block() * 64;
  (void)m;
  return std::make_unique<Engine>(cfg, std::move(exec));
}

TEST(KvHostTierLoads, FailedLoadIsRecomputedNotCorrupt) {
  auto& m = testing::load_fixture("glm4_moe_tiny_a");
  std::vector<int32_t> p;
  for (int i = 0; i < 21; ++i) p.push_back((i * 29 + 3) % static_cast<int32_t>(m.lm->config().vocab_size));
  auto plain = engine_for(m, make_model_executor(*m.lm, *m.be, 32, 4), false);
  const Served ref = serve(*plain, p);

  auto owned = std::make_unique<ShortLoadExecutor>(make_model_executor(*m.lm, *m.be, 32, 4));
  ShortLoadExecutor* exec = owned.get();
  auto e = engine_for(m, std::move(owned), true);
  serve(*e, p);
  e->evict_prefix_cache();  // p's blocks now in the host tier only
  const Served again = serve(*e, p);
  EXPECT_EQ(again.tokens, ref.tokens) << "recomputed, not read from blocks that were never loaded";
  EXPECT_EQ(again.usage.cached_tokens, 0);
  EXPECT_EQ(again.usage.cached_host_tokens, 0);
  ASSERT_FALSE(exec->mover->errors.empty());
  EXPECT_NE(exec->mover->errors[0].find("into device block "), std::string::npos) << exec->mover->errors[0];
  EXPECT_GE(e->stats().host_tier.copy_errors, 1);
  EXPECT_EQ(e->stats().scheduler.prefix_host_hit_tokens, 0);
}

// A hit from the host tier: usage counts it in cached_tokens and names it in cached_host_tokens.
TEST(KvHostTierLoads, UsageNamesHostTierTokens) {
  auto& m = testing::load_fixture("glm_moe_dsa_tiny_a");
  std::vector<int32_t> p;
  for (int i = 0; i < 21; ++i) p.push_back((i * 31 + 5) % static_cast<int32_t>(m.lm->config().vocab_size));
  auto plain = engine_for(m, make_model_executor(*m.lm, *m.be, 32, 4), false);
  const Served ref = serve(*plain, p);
  auto e = engine_for(m, make_model_executor(*m.lm, *m.be, 32, 4), true);
  const Served first = serve(*e, p);
  EXPECT_EQ(first.usage.cached_host_tokens, 0);
  e->evict_prefix_cache();
  const Served again = serve(*e, p);
  EXPECT_EQ(again.tokens, ref.tokens);
  EXPECT_EQ(again.usage.cached_tokens, 20) << "5 whole blocks below the last token";
  EXPECT_EQ(again.usage.cached_host_tokens, 20);
  EXPECT_EQ(e->stats().scheduler.prefix_host_hit_tokens, 20);
  const Served device = serve(*e, p);  // now cached on the device again
  EXPECT_EQ(device.usage.cached_tokens, 20);
  EXPECT_EQ(device.usage.cached_host_tokens, 0);
  EXPECT_EQ(device.tokens, ref.tokens);
}

}  // namespace
}  // namespace mxserve::runtime
