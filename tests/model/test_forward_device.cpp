// CausalLM::forward_device -- the body the decode graphs capture (runtime/decode_graphs.h) -- on the CPU
// backend, for every architecture with one (glm4_moe, glm_moe_dsa): one plain decode step over S sequences,
// laid out as DecodeGraphs lays out a replay (a bucket of B > S rows, padded rows on a scratch block reading
// only their own slot, the context bound of a class instead of the batch's), gives the eager forward()'s
// logits and greedy tokens for the real rows. On glm_moe_dsa the contexts pass index_topk, so the sparse
// top-k path runs. Also glm_moe_dsa's refusals: no context bound, an installed decision hook.
// Speculation (issue 36 item 1): a chain verify step (1 + N rows per sequence) through forward_device gives the
// eager verify step's logits AND post-norm hidden rows; an MTP draft-chain continuation step through
// reserve_mtp_chain / stage_mtp_chain / forward_mtp_device (runtime/mtp_graphs.h's sequence) gives the eager
// forward_mtp's logits and hidden rows, glm_moe_dsa with index_share_for_mtp_iteration on too (the staged
// first-step top-k), and the padded row touches no real KV slot.
// The GPU side (identical greedy tokens with graphs on and off) is test_cuda_graphs (label gpu).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

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

std::vector<std::filesystem::path>& temp_dirs() {
  static std::vector<std::filesystem::path> dirs;
  return dirs;
}
struct RemoveTempDirs : ::testing::Environment {
  void TearDown() override {
    for (const auto& d : temp_dirs()) std::filesystem::remove_all(d);
  }
};
const auto* const kRemoveTempDirs = ::testing::AddGlobalTestEnvironment(new RemoveTempDirs);

// A copy of fixture `name` with index_share_for_mtp_iteration set (removed when the test binary ends).
std::string shared_index_fixture(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("mxserve_fd_share_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  temp_dirs().push_back(dir);
  for (const auto& e : fs::directory_iterator(fixture_dir(name))) fs::copy_file(e.path(), dir / e.path().filename());
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  cfg["index_share_for_mtp_iteration"] = true;
  std::ofstream(dir / "config.json") << cfg.dump(2);
  return dir.string();
}

double rel_diff(const float* a, const float* b, int64_t n) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(a[i]) * a[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : (diff > 0 ? 1.0 : 0.0);
}

struct DecodeRig {
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  std::unique_ptr<CausalLM> lm;
  std::unique_ptr<kvcache::KvCache> kv;
  std::vector<std::vector<int32_t>> prompts;
  int32_t scratch_block = static_cast<int32_t>(kSeqs * kBlocksPerSeq);

  void load(const std::string& name, bool share_index = false) {
    const std::string dir = share_index ? shared_index_fixture(name) : fixture_dir(name);
    auto m = load_causal_lm(dir, *be, LoadOptions{});
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    lm = std::move(*m);
    kv = std::make_unique<kvcache::KvCache>(lm->kv_spec(scratch_block + 1, kBlockSize),
                                            [this](DType dt, Shape s) { return be->alloc(dt, std::move(s)); });
    auto cases = cli::read_fixture_cases(dir, lm->config().vocab_size);
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
  // Every prompt as one prefill batch; returns each sequence's next (greedy) token (hidden: every row's).
  std::vector<int32_t> prefill(Tensor* hidden = nullptr) {
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
    b.want_hidden = hidden != nullptr;
    auto out = lm->forward(b, *kv);
    EXPECT_TRUE(out.is_ok()) << out.status().to_string();
    if (hidden != nullptr) *hidden = out->hidden;
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
  // Sequence s's rows tokens[s] at positions first_pos[s].. (KV indices = positions), then `pad` sequences of q
  // rows each on the scratch block (token 0, position 0, KV index 0: DecodeGraphs' padded rows); every row a
  // logit row.
  ForwardBatch step_batch(const std::vector<std::vector<int32_t>>& tokens, const std::vector<int32_t>& first_pos,
                          int64_t pad, int32_t q) const {
    ForwardBatch b;
    for (size_t s = 0; s < tokens.size(); ++s) {
      SequenceSpan sp;
      sp.token_begin = b.n_tokens();
      sp.n_tokens = static_cast<int32_t>(tokens[s].size());
      sp.kv_len = first_pos[s] + sp.n_tokens;
      sp.block_table = blocks(static_cast<int64_t>(s), sp.kv_len);
      for (int32_t i = 0; i < sp.n_tokens; ++i) {
        b.logit_rows.push_back(b.n_tokens());
        b.token_ids.push_back(tokens[s][i]);
        b.positions.push_back(first_pos[s] + i);
      }
      b.seqs.push_back(sp);
    }
    for (int64_t p = 0; p < pad; ++p) {
      SequenceSpan sp;
      sp.token_begin = b.n_tokens();
      sp.n_tokens = q;
      sp.kv_len = 1;
      sp.kv_indices.assign(q, 0);
      sp.block_table = {scratch_block};
      for (int32_t i = 0; i < q; ++i) {
        b.logit_rows.push_back(b.n_tokens());
        b.token_ids.push_back(0);
        b.positions.push_back(0);
      }
      b.seqs.push_back(sp);
    }
    return b;
  }
  struct DeviceInputs {
    Tensor ids, positions;
    backend::AttentionMeta meta;
  };
  // b's rows as a graph replay sees them: ids / positions on the backend, metadata with the class bound.
  Result<DeviceInputs> device_inputs(const ForwardBatch& b, int32_t leading_decode_rows) {
    DeviceInputs in;
    kernels::AttentionParams shape;
    MX_ASSIGN_OR_RETURN(in.meta, build_attention_meta(b, *be, kBlockSize, shape, /*store=*/nullptr));
    in.meta.params.max_kv_len = kContext;
    in.meta.params.n_leading_decode_rows = leading_decode_rows;
    const int64_t T = b.n_tokens();
    in.ids = be->upload(Tensor::view_of(const_cast<int32_t*>(b.token_ids.data()), DType::kI32, {T}));
    in.positions = be->upload(Tensor::view_of(const_cast<int32_t*>(b.positions.data()), DType::kI32, {T}));
    return in;
  }
  Tensor gather(const Tensor& x, const std::vector<int32_t>& rows) {
    const int64_t R = static_cast<int64_t>(rows.size());
    Tensor idx = be->upload(Tensor::view_of(const_cast<int32_t*>(rows.data()), DType::kI32, {R}));
    Tensor out = be->alloc(x.dtype(), {R, x.dim(1)});
    be->gather_rows(x, idx, out);
    return out;
  }
  // The MTP extend after the prefill (MtpRows over every prompt position: token x_{p+1}, the target's hidden
  // h_p); first_rows[s]: sequence s's last extend row, drafts[s] its greedy first draft.
  struct Extended {
    ForwardOutput out;
    std::vector<int32_t> first_rows, drafts;
  };
  Extended extend() {
    Tensor hidden;
    const std::vector<int32_t> next = prefill(&hidden);
    ForwardBatch e;
    for (int64_t s = 0; s < kSeqs; ++s) {
      const int32_t len = static_cast<int32_t>(prompts[s].size());
      SequenceSpan sp;
      sp.token_begin = e.n_tokens();
      sp.n_tokens = len;
      sp.kv_len = len;
      sp.block_table = blocks(s, len);
      for (int32_t p = 0; p < len; ++p) {
        e.token_ids.push_back(p + 1 < len ? prompts[s][p + 1] : next[s]);
        e.positions.push_back(p);
      }
      e.logit_rows.push_back(e.n_tokens() - 1);
      e.seqs.push_back(sp);
    }
    e.want_hidden = true;
    Extended x;
    auto out = lm->forward_mtp(e, hidden, *kv);
    EXPECT_TRUE(out.is_ok()) << out.status().to_string();
    if (!out.is_ok()) return x;
    x.out = std::move(*out);
    for (int64_t s = 0; s < kSeqs; ++s) {
      x.first_rows.push_back(e.logit_rows[s]);
      x.drafts.push_back(argmax(x.out.logits, s));
    }
    return x;
  }
  // The chain's second step: one row per sequence, draft 1 at position len(prompt s), fed the extend's hidden row.
  ForwardBatch continuation(const Extended& x, int64_t pad) const {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<int32_t> first;
    for (int64_t s = 0; s < kSeqs; ++s) {
      tokens.push_back({x.drafts[s]});
      first.push_back(static_cast<int32_t>(prompts[s].size()));
    }
    ForwardBatch b = step_batch(tokens, first, pad, 1);
    b.want_hidden = true;
    b.mtp_step.first_step_rows = x.first_rows;
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

// A chain verify step (x_last + 2 drafts per sequence: DecodeGraphs' q = 3 graphs) in a padded bucket at a class
// bound: the logits and the post-norm hidden rows (what the MTP extend reads) equal the eager verify step's.
TEST_P(ForwardDevice, ChainVerifyRowsAndHiddenEqualTheEagerVerifyStep) {
  constexpr int32_t kRows = 3;  // 1 + N, N = 2 drafts
  DecodeRig a, b;
  ASSERT_NO_FATAL_FAILURE(a.load(GetParam()));
  ASSERT_NO_FATAL_FAILURE(b.load(GetParam()));
  const std::vector<int32_t> next = a.prefill();
  ASSERT_EQ(b.prefill(), next);
  std::vector<std::vector<int32_t>> rows;
  std::vector<int32_t> first;
  for (int64_t s = 0; s < kSeqs; ++s) {  // drafts: arbitrary tokens (verification judges them, not this test)
    rows.push_back({next[s], a.prompts[s][2], a.prompts[s][5]});
    first.push_back(static_cast<int32_t>(a.prompts[s].size()));
  }
  ForwardBatch eager_batch = a.step_batch(rows, first, 0, kRows);
  eager_batch.want_hidden = true;
  auto eager = a.lm->forward(eager_batch, *a.kv);
  ASSERT_TRUE(eager.is_ok()) << eager.status().to_string();
  const ForwardBatch dev_batch = b.step_batch(rows, first, kBucket - kSeqs, kRows);
  auto in = b.device_inputs(dev_batch, /*leading_decode_rows=*/0);
  ASSERT_TRUE(in.is_ok()) << in.status().to_string();
  const int64_t T = kBucket * kRows, V = a.lm->config().vocab_size, H = a.lm->config().d_model;
  Tensor logits = b.be->alloc(DType::kF32, {T, V});
  Tensor hidden = b.be->alloc(b.be->activation_dtype(), {T, H});
  const Status st = b.lm->forward_device(in->ids, in->positions, in->meta, *b.kv, logits, &hidden);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  const Tensor dl = b.be->to_host(logits), dh = b.be->to_host(hidden), eh = a.be->to_host(eager->hidden);
  ASSERT_EQ(eager->logits.dim(0), kSeqs * kRows);
  for (int64_t r = 0; r < kSeqs * kRows; ++r) {
    EXPECT_LE(rel_diff(eager->logits.data<float>() + r * V, dl.data<float>() + r * V, V), 1e-6) << GetParam() << " row " << r;
    EXPECT_EQ(a.argmax(dl, r), a.argmax(eager->logits, r)) << GetParam() << " row " << r;
    EXPECT_LE(rel_diff(eh.data<float>() + r * H, dh.data<float>() + r * H, H), 1e-6) << GetParam() << " hidden row " << r;
  }
  // The padded sequence's rows wrote only the scratch block: the same verify step again, eagerly, is unchanged.
  auto again = b.lm->forward(eager_batch, *b.kv);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  for (int64_t r = 0; r < kSeqs * kRows; ++r)
    EXPECT_EQ(a.argmax(again->logits, r), a.argmax(eager->logits, r)) << GetParam() << " row " << r;
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
  // Tree rows are no refusal any more (tree verify graphs: test_spec_graphs_cpu's tree cases compare them with eager).
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

struct MtpCase {
  std::string fixture;
  bool share_index;  // index_share_for_mtp_iteration (glm_moe_dsa): the staged first-step top-k
};
class MtpForwardDevice : public ::testing::TestWithParam<MtpCase> {};

// The MTP chain's second step as MtpGraphs replays it (reserve_mtp_chain, stage_mtp_chain, forward_mtp_device
// over a padded bucket at a class bound) equals the eager forward_mtp of the same rows: logits, greedy drafts,
// and the MTP hidden rows the next step reads.
TEST_P(MtpForwardDevice, ContinuationStepEqualsTheEagerMtpStep) {
  const MtpCase c = GetParam();
  DecodeRig a, b;
  ASSERT_NO_FATAL_FAILURE(a.load(c.fixture, c.share_index));
  ASSERT_NO_FATAL_FAILURE(b.load(c.fixture, c.share_index));
  ASSERT_TRUE(a.lm->has_mtp());
  const DecodeRig::Extended xa = a.extend(), xb = b.extend();
  ASSERT_EQ(xa.drafts, xb.drafts);
  const ForwardBatch cont = a.continuation(xa, 0);
  auto eager = a.lm->forward_mtp(cont, a.gather(xa.out.hidden, xa.first_rows), *a.kv);
  ASSERT_TRUE(eager.is_ok()) << eager.status().to_string();

  const ForwardBatch dev_batch = b.continuation(xb, kBucket - kSeqs);
  auto in = b.device_inputs(dev_batch, /*leading_decode_rows=*/kBucket);
  ASSERT_TRUE(in.is_ok()) << in.status().to_string();
  const int64_t V = b.lm->config().vocab_size, H = b.lm->config().d_model;
  std::vector<int32_t> hidden_rows = xb.first_rows;
  hidden_rows.push_back(xb.first_rows[0]);  // the padded row: any finite hidden row
  Tensor hidden_in = b.gather(xb.out.hidden, hidden_rows);
  Tensor logits = b.be->alloc(DType::kF32, {kBucket, V});
  Tensor hidden_out = b.be->alloc(b.be->activation_dtype(), {kBucket, H});
  if (c.share_index) {  // the staged buffer must exist first: refused, naming the call that makes it
    const Status st = b.lm->forward_mtp_device(in->ids, in->positions, hidden_in, in->meta, *b.kv, logits, hidden_out);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("reserve_mtp_chain"), std::string::npos) << st.to_string();
  }
  ASSERT_TRUE(b.lm->reserve_mtp_chain(kBucket).is_ok());
  Tensor rows_dev = b.be->upload(Tensor::view_of(const_cast<int32_t*>(xb.first_rows.data()), DType::kI32, {kSeqs}));
  if (c.share_index) {  // a row outside the first step is an error naming it
    MtpStep bad;
    bad.first_step_rows = {0, 0, 10000};
    const Status st = b.lm->stage_mtp_chain(bad, rows_dev);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("mtp_first_step_rows"), std::string::npos) << st.to_string();
  }
  ASSERT_TRUE(b.lm->stage_mtp_chain(dev_batch.mtp_step, rows_dev).is_ok());
  const Status st = b.lm->forward_mtp_device(in->ids, in->positions, hidden_in, in->meta, *b.kv, logits, hidden_out);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  const Tensor dl = b.be->to_host(logits), dh = b.be->to_host(hidden_out), eh = a.be->to_host(eager->hidden);
  for (int64_t r = 0; r < kSeqs; ++r) {
    EXPECT_LE(rel_diff(eager->logits.data<float>() + r * V, dl.data<float>() + r * V, V), 1e-6) << c.fixture << " row " << r;
    EXPECT_EQ(a.argmax(dl, r), a.argmax(eager->logits, r)) << c.fixture << " row " << r;
    EXPECT_LE(rel_diff(eh.data<float>() + r * H, dh.data<float>() + r * H, H), 1e-6) << c.fixture << " hidden row " << r;
  }
  // The padded row wrote only the scratch block of the MTP layer's cache: the eager step again is unchanged.
  auto again = b.lm->forward_mtp(cont, b.gather(xb.out.hidden, xb.first_rows), *b.kv);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  for (int64_t r = 0; r < kSeqs; ++r)
    EXPECT_LE(rel_diff(eager->logits.data<float>() + r * V, again->logits.data<float>() + r * V, V), 1e-6) << r;
}

// The staging matters (the test above can fail): under index_share_for_mtp_iteration, a continuation replayed
// without stage_mtp_chain attends over the reserved buffer's zero rows, not the first step's top-k.
TEST(MtpForwardDeviceDsa, WithoutStagingTheSharedTopkDiffers) {
  DecodeRig a, b;
  ASSERT_NO_FATAL_FAILURE(a.load("glm_moe_dsa_tiny_a", true));
  ASSERT_NO_FATAL_FAILURE(b.load("glm_moe_dsa_tiny_a", true));
  const DecodeRig::Extended xa = a.extend(), xb = b.extend();
  auto eager = a.lm->forward_mtp(a.continuation(xa, 0), a.gather(xa.out.hidden, xa.first_rows), *a.kv);
  ASSERT_TRUE(eager.is_ok()) << eager.status().to_string();
  const ForwardBatch dev_batch = b.continuation(xb, kBucket - kSeqs);
  auto in = b.device_inputs(dev_batch, kBucket);
  ASSERT_TRUE(in.is_ok()) << in.status().to_string();
  const int64_t V = b.lm->config().vocab_size, H = b.lm->config().d_model;
  std::vector<int32_t> hidden_rows = xb.first_rows;
  hidden_rows.push_back(xb.first_rows[0]);
  Tensor hidden_in = b.gather(xb.out.hidden, hidden_rows);
  Tensor logits = b.be->alloc(DType::kF32, {kBucket, V});
  Tensor hidden_out = b.be->alloc(b.be->activation_dtype(), {kBucket, H});
  ASSERT_TRUE(b.lm->reserve_mtp_chain(kBucket).is_ok());
  ASSERT_TRUE(b.lm->forward_mtp_device(in->ids, in->positions, hidden_in, in->meta, *b.kv, logits, hidden_out).is_ok());
  const Tensor dl = b.be->to_host(logits);
  double worst = 0;
  for (int64_t r = 0; r < kSeqs; ++r)
    worst = std::max(worst, rel_diff(eager->logits.data<float>() + r * V, dl.data<float>() + r * V, V));
  EXPECT_GT(worst, 1e-3) << "an unstaged continuation matched the eager step: the test cannot see the staging";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpForwardDevice,
                         ::testing::Values(MtpCase{"glm4_moe_tiny_a", false}, MtpCase{"glm_moe_dsa_tiny_a", false},
                                           MtpCase{"glm_moe_dsa_tiny_a", true}, MtpCase{"glm_moe_dsa_tiny_b", true}),
                         [](const ::testing::TestParamInfo<MtpCase>& i) {
                           std::string n = i.param.fixture + (i.param.share_index ? "_shared_index" : "");
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace mxserve::model
