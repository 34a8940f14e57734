// CausalLM::forward_device -- the body the decode graphs capture (runtime/decode_graphs.h) -- on the CPU
// backend, for every architecture with one (glm4_moe, glm_moe_dsa): one plain decode step over S sequences,
// laid out as DecodeGraphs lays out a replay (a bucket of B > S rows, padded rows on a scratch block reading
// only their own slot, the context bound of a class instead of the batch's), gives the eager forward()'s
// logits and greedy tokens for the real rows. On glm_moe_dsa the contexts pass index_topk, so the sparse
// top-k path runs. Also glm_moe_dsa's refusals: tree rows, no context bound, an installed decision hook.
// The GPU side (identical greedy tokens with graphs on and off) is test_cuda_graphs (label gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "model/causal_lm.h"
#include "model/decisions.h"
#include "model/forward_batch.h"

namespace mxserve::model {
namespace {

constexpr int64_t kBlockSize = 4;
constexpr int64_t kBlocksPerSeq = 16;
constexpr int64_t kSeqs = 3;
constexpr int64_t kBucket = 4;      // the graph bucket: one padded row
constexpr int32_t kContext = 128;   // the context class bound (the batch's own is smaller)

std::string fixture_dir(const std::string& name) {
  return std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/" + name;
}

struct DecodeRig {
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  std::unique_ptr<CausalLM> lm;
  std::unique_ptr<kvcache::KvCache> kv;
  std::vector<std::vector<int32_t>> prompts;
  int32_t scratch_block = static_cast<int32_t>(kSeqs * kBlocksPerSeq);

  void load(const std::string& name) {
    auto m = load_causal_lm(fixture_dir(name), *be, LoadOptions{});
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    lm = std::move(*m);
    kv = std::make_unique<kvcache::KvCache>(lm->kv_spec(scratch_block + 1, kBlockSize),
                                            [this](DType dt, Shape s) { return be->alloc(dt, std::move(s)); });
    auto cases = cli::read_fixture_cases(fixture_dir(name), lm->config().vocab_size);
    ASSERT_TRUE(cases.is_ok()) << cases.status().to_string();
    ASSERT_FALSE(cases->empty());
    std::vector<int32_t> all;  // every case's prompt, in order: the token pool the prompts are cut from
    for (const auto& c : *cases) all.insert(all.end(), c.input_ids.begin(), c.input_ids.end());
    for (int64_t s = 0; s < kSeqs; ++s) {  // 11, 16, 21 tokens: past index_topk (6) and several KV blocks
      std::vector<int32_t> p;
      for (int64_t i = 0; i < 11 + 5 * s; ++i) p.push_back(all[(3 * s + i) % all.size()]);
      prompts.push_back(std::move(p));
    }
  }
  std::vector<int32_t> blocks(int64_t s, int64_t len) const {
    std::vector<int32_t> b;
    for (int64_t i = 0; i < (len + kBlockSize - 1) / kBlockSize; ++i)
      b.push_back(static_cast<int32_t>(s * kBlocksPerSeq + i));
    return b;
  }
  // Every prompt as one prefill batch; returns each sequence's next (greedy) token.
  std::vector<int32_t> prefill() {
    ForwardBatch b;
    for (int64_t s = 0; s < kSeqs; ++s) {
      SequenceSpan sp;
      sp.token_begin = b.n_tokens();
      sp.n_tokens = static_cast<int32_t>(prompts[s].size());
      sp.kv_len = sp.n_tokens;
      sp.block_table = blocks(s, sp.kv_len);
      for (int32_t i = 0; i < sp.n_tokens; ++i) {
        b.token_ids.push_back(prompts[s][i]);
        b.positions.push_back(i);
      }
      b.logit_rows.push_back(b.n_tokens() - 1);
      b.seqs.push_back(sp);
    }
    auto out = lm->forward(b, *kv);
    EXPECT_TRUE(out.is_ok()) << out.status().to_string();
    std::vector<int32_t> next;
    for (int64_t s = 0; s < kSeqs; ++s) next.push_back(argmax(out->logits, s));
    return next;
  }
  int32_t argmax(const Tensor& logits, int64_t row) const {
    const int64_t V = lm->config().vocab_size;
    const float* r = logits.data<float>() + row * V;
    return static_cast<int32_t>(std::max_element(r, r + V) - r);
  }
  // One decode row per sequence (token next[s] at position len(prompt s)), plus `pad` rows on the scratch block.
  ForwardBatch decode_batch(const std::vector<int32_t>& next, int64_t pad) const {
    ForwardBatch b;
    for (int64_t s = 0; s < kSeqs + pad; ++s) {
      const bool real = s < kSeqs;
      SequenceSpan sp;
      sp.token_begin = static_cast<int32_t>(s);
      sp.n_tokens = 1;
      sp.kv_len = real ? static_cast<int32_t>(prompts[s].size()) + 1 : 1;
      sp.block_table = real ? blocks(s, sp.kv_len) : std::vector<int32_t>{scratch_block};
      b.token_ids.push_back(real ? next[s] : 0);
      b.positions.push_back(real ? sp.kv_len - 1 : 0);
      b.logit_rows.push_back(static_cast<int32_t>(s));
      b.seqs.push_back(sp);
    }
    return b;
  }
  // The decode step through forward_device with graph-style inputs: logits f32 [kBucket, V].
  Result<Tensor> forward_device(const std::vector<int32_t>& next, bool tree_rows = false, int32_t max_kv_len = kContext) {
    const ForwardBatch b = decode_batch(next, kBucket - kSeqs);
    kernels::AttentionParams shape;
    MX_ASSIGN_OR_RETURN(backend::AttentionMeta meta,
                        build_attention_meta(b, *be, kBlockSize, shape, /*store=*/nullptr));
    meta.params.max_kv_len = max_kv_len;  // the class bound, as DecodeGraphs::capture sets it
    meta.params.n_leading_decode_rows = static_cast<int32_t>(kBucket);
    std::vector<int64_t> mask(kBucket, 1);
    if (tree_rows) meta.params.tree_mask = reinterpret_cast<const uint64_t*>(mask.data());
    Tensor ids = be->upload(Tensor::view_of(const_cast<int32_t*>(b.token_ids.data()), DType::kI32, {kBucket}));
    Tensor pos = be->upload(Tensor::view_of(const_cast<int32_t*>(b.positions.data()), DType::kI32, {kBucket}));
    Tensor logits = be->alloc(DType::kF32, {kBucket, lm->config().vocab_size});
    MX_RETURN_IF_ERROR(lm->forward_device(ids, pos, meta, *kv, logits));
    return be->to_host(logits);
  }
};

class ForwardDevice : public ::testing::TestWithParam<std::string> {};

TEST_P(ForwardDevice, PaddedBucketAtAClassBoundEqualsTheEagerDecodeStep) {
  DecodeRig a, b;  // two caches: the eager and the device step each read a cache only the prefill filled
  ASSERT_NO_FATAL_FAILURE(a.load(GetParam()));
  ASSERT_NO_FATAL_FAILURE(b.load(GetParam()));
  const std::vector<int32_t> next = a.prefill();
  ASSERT_EQ(b.prefill(), next);
  auto eager = a.lm->forward(a.decode_batch(next, 0), *a.kv);
  ASSERT_TRUE(eager.is_ok()) << eager.status().to_string();
  auto device = b.forward_device(next);
  ASSERT_TRUE(device.is_ok()) << device.status().to_string();
  const int64_t V = a.lm->config().vocab_size;
  for (int64_t s = 0; s < kSeqs; ++s) {
    double diff = 0, norm = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double e = eager->logits.data<float>()[s * V + v], d = device->data<float>()[s * V + v];
      diff += (e - d) * (e - d);
      norm += e * e;
    }
    EXPECT_GT(norm, 0) << "row " << s;
    EXPECT_LE(std::sqrt(diff / norm), 1e-6) << GetParam() << " row " << s;
    EXPECT_EQ(a.argmax(*device, s), a.argmax(eager->logits, s)) << GetParam() << " row " << s;
  }
  // The padded row wrote only the scratch block: a second eager step over the real rows is unchanged.
  auto again = b.lm->forward(b.decode_batch(next, 0), *b.kv);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  for (int64_t s = 0; s < kSeqs; ++s) EXPECT_EQ(a.argmax(again->logits, s), a.argmax(eager->logits, s));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ForwardDevice,
                         ::testing::Values("glm4_moe_tiny_a", "glm_moe_dsa_tiny_a", "glm_moe_dsa_tiny_b"));

struct NoopHook : DecisionHook {
  void on_decision(DecisionRows&) override {}
};

TEST(ForwardDeviceDsa, RefusesWhatAGraphCannotHold) {
  DecodeRig s;
  ASSERT_NO_FATAL_FAILURE(s.load("glm_moe_dsa_tiny_a"));
  const std::vector<int32_t> next = s.prefill();
  auto tree = s.forward_device(next, /*tree_rows=*/true);
  ASSERT_FALSE(tree.is_ok());
  EXPECT_EQ(tree.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tree.status().message().find("tree rows"), std::string::npos) << tree.status().to_string();
  auto unbounded = s.forward_device(next, false, /*max_kv_len=*/0);
  ASSERT_FALSE(unbounded.is_ok());
  EXPECT_NE(unbounded.status().message().find("max_kv_len 0"), std::string::npos) << unbounded.status().to_string();
  NoopHook hook;
  {
    ScopedDecisionHook scope(&hook);
    auto hooked = s.forward_device(next);
    ASSERT_FALSE(hooked.is_ok());
    EXPECT_EQ(hooked.status().code(), StatusCode::kUnsupported);
    EXPECT_NE(hooked.status().message().find("decision hook"), std::string::npos) << hooked.status().to_string();
  }
  EXPECT_TRUE(s.forward_device(next).is_ok());
}

}  // namespace
}  // namespace mxserve::model
