// MTP speculative decoding with the real tiny models on the CPU backend: lossless for greedy (identical
// outputs with and without speculation, alone and batched, with and without prefix reuse), the draft's
// logits equal the fixture's mtp_logits, and the counters add up.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"
#include "runtime/spec/self_test.h"
#include "fake_model.h"
#include "fixture_requests.h"
#include "forwarding_executor.h"
#include "oracle_mtp_model.h"

namespace mxserve::runtime {
namespace {

using Loaded = testing::LoadedFixture;
Loaded& fixture(const std::string& name) { return testing::load_fixture(name); }

// What the recorder saw: the first MTP call (the extend over the prompt), all rows' logits.
struct MtpRecord {
  model::ForwardBatch first_batch_;
  Tensor first_logits_;
};

// Records the MTP layer's logits of every row (the engine only asks for the last row's).
class RecordingExecutor final : public ForwardingExecutor {
 public:
  RecordingExecutor(std::unique_ptr<ModelExecutor> inner, MtpRecord* record)
      : ForwardingExecutor(std::move(inner)), record_(record) {}
  Result<ExecOutput> execute_mtp(const model::ForwardBatch& b, const Tensor& h) override {
    model::ForwardBatch all = b;
    all.logit_rows.clear();
    all.want_host_logits = true;  // recorded in full; the engine then reads the picked rows' logits
    for (int32_t r = 0; r < b.n_tokens(); ++r) all.logit_rows.push_back(r);
    MX_ASSIGN_OR_RETURN(ExecOutput out, inner_->execute_mtp(all, h));
    const int64_t V = vocab_size();
    if (first_ && record_) {  // keep the first MTP call (the extend over the prompt)
      record_->first_batch_ = b;
      record_->first_logits_ = out.logits;
      first_ = false;
    }
    Tensor picked = Tensor::empty(DType::kF32, {static_cast<int64_t>(b.logit_rows.size()), V});
    for (size_t i = 0; i < b.logit_rows.size(); ++i)
      std::memcpy(picked.data<float>() + i * V, out.logits.data<float>() + b.logit_rows[i] * V, sizeof(float) * V);
    out.logits = picked;
    out.argmax.clear();  // rows changed: greedy tokens come from the picked logits
    return out;
  }

 private:
  MtpRecord* record_;
  bool first_ = true;
};

struct Result_ {
  std::map<size_t, std::vector<int32_t>> tokens;
  std::map<size_t, std::vector<float>> logprobs;
  std::map<size_t, std::vector<std::vector<TopLogprob>>> top;
  std::map<size_t, Usage> usage;
  EngineStats stats;
};

Result_ run(Loaded& m, const std::vector<RequestSpec>& specs, int32_t spec_steps, bool prefix_cache, bool batched,
            MtpRecord* record = nullptr, std::optional<double> simulate = std::nullopt, bool adaptive = false,
            int32_t topk = 1, int32_t draft_tokens = 0) {
  EngineConfig cfg;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_num_batched_tokens = 256;
  cfg.scheduler.chunked_prefill_size = 128;
  cfg.scheduler.enable_prefix_cache = prefix_cache;
  cfg.n_blocks = 256;
  cfg.max_model_len = 512;
  cfg.spec.num_steps = spec_steps;
  cfg.spec.adaptive = adaptive;
  cfg.spec.simulate_acceptance = simulate;
  cfg.spec.topk = topk;
  cfg.spec.num_draft_tokens = draft_tokens;
  Engine engine(cfg, std::make_unique<RecordingExecutor>(make_model_executor(*m.lm, *m.be, cfg.n_blocks, 4), record));
  Result_ out;
  std::map<RequestId, size_t> index;
  auto submit = [&](size_t i) {
    auto id = engine.submit(specs[i], [&out, &index](const TokenEvent& ev) {
      const size_t k = index.at(ev.id);
      if (ev.token >= 0) {
        out.tokens[k].push_back(ev.token);
        out.logprobs[k].push_back(ev.logprob);
        out.top[k].push_back(ev.top_logprobs);
      }
      if (ev.finish != FinishReason::kNone) out.usage[k] = ev.usage;
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    index[*id] = i;
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    submit(i);
    if (!batched)
      while (!engine.idle()) engine.step();
  }
  while (!engine.idle()) {
    engine.step();
    EXPECT_TRUE(engine.check_invariants().is_ok());
  }
  out.stats = engine.stats();
  return out;
}

std::vector<RequestSpec> prompts_of(const Loaded& m, int32_t max_tokens) {
  std::vector<RequestSpec> specs = testing::greedy_fixture_requests(m.cases, max_tokens);
  specs.push_back(specs.back());  // a repeat: served from the prefix cache when it is on
  return specs;
}

class SpecFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(SpecFixture, GreedyOutputsIdenticalWithAndWithoutSpeculation) {
  Loaded& m = fixture(GetParam());
  const auto specs = prompts_of(m, 12);
  const Result_ plain = run(m, specs, 0, false, false);
  for (int32_t steps : {1, 3}) {
    for (bool prefix : {false, true}) {
      for (bool batched : {false, true}) {
        const Result_ sp = run(m, specs, steps, prefix, batched);
        for (size_t i = 0; i < specs.size(); ++i)
          EXPECT_EQ(sp.tokens.at(i), plain.tokens.at(i))
              << GetParam() << " request " << i << " steps " << steps << " prefix " << prefix << " batched " << batched;
        EXPECT_GT(sp.stats.spec.num_draft_tokens, 0);
        int64_t drafted = 0, accepted = 0;
        for (const auto& [i, u] : sp.usage) {
          drafted += u.spec_draft_tokens;
          accepted += u.spec_accepted_tokens;
        }
        EXPECT_EQ(drafted, sp.stats.spec.num_draft_tokens);
        EXPECT_EQ(accepted, sp.stats.spec.num_accepted_tokens);
      }
    }
  }
  // The greedy continuation is also the fixture's reference greedy.
  for (size_t i = 0; i < m.cases.size(); ++i) {
    std::vector<int32_t> head(plain.tokens.at(i).begin(), plain.tokens.at(i).begin() + m.cases[i].greedy.size());
    EXPECT_EQ(head, m.cases[i].greedy) << "case " << i;
  }
}

// Tree mode (depth S, topk k, M - 1 nodes): greedy outputs equal plain decoding's, alone and batched
// (requests in prefill next to verifying ones), with and without prefix reuse; a sampled request rides
// along in the batched runs (recursive rejection over the tree); counters add up.
TEST_P(SpecFixture, TreeGreedyOutputsIdenticalWithAndWithoutSpeculation) {
  Loaded& m = fixture(GetParam());
  const auto specs = prompts_of(m, 12);
  const Result_ plain = run(m, specs, 0, false, false);
  struct Shape {
    int32_t steps, topk, draft_tokens;
  };
  for (const Shape sh : {Shape{3, 2, 6}, Shape{2, 4, 8}}) {
    for (bool prefix : {false, true}) {
      for (bool batched : {false, true}) {
        auto all = specs;
        if (batched) {  // a sampled request in the batch: its tree is verified by recursive rejection
          RequestSpec sampled = specs[0];
          sampled.sampling.temperature = 0.8f;
          sampled.sampling.top_k = 20;
          sampled.sampling.seed = 7;
          all.push_back(sampled);
        }
        const Result_ sp = run(m, all, sh.steps, prefix, batched, nullptr, std::nullopt, false, sh.topk, sh.draft_tokens);
        const std::string what = GetParam() + " S=" + std::to_string(sh.steps) + " k=" + std::to_string(sh.topk) +
                                 " M=" + std::to_string(sh.draft_tokens) + " prefix " + std::to_string(prefix) +
                                 " batched " + std::to_string(batched);
        for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(sp.tokens.at(i), plain.tokens.at(i)) << what << " request " << i;
        if (batched) {
          EXPECT_EQ(sp.tokens.at(specs.size()).size(), 12u) << what;
        }
        EXPECT_GT(sp.stats.spec.num_drafts, 0) << what;
        std::printf("%s: %lld trees, %lld nodes, %lld accepted\n", what.c_str(),
                    static_cast<long long>(sp.stats.spec.num_drafts), static_cast<long long>(sp.stats.spec.num_draft_tokens),
                    static_cast<long long>(sp.stats.spec.num_accepted_tokens));
        // Every verify step carried a full tree of M - 1 nodes (the fixtures' vocabularies are larger than k).
        EXPECT_EQ(sp.stats.spec.num_draft_tokens, sp.stats.spec.num_drafts * (sh.draft_tokens - 1)) << what;
        EXPECT_LE(sp.stats.spec.accepted_per_pos.size(), static_cast<size_t>(sh.steps)) << what;
        int64_t by_depth = 0;
        for (int64_t a : sp.stats.spec.accepted_per_pos) by_depth += a;
        EXPECT_EQ(by_depth, sp.stats.spec.num_accepted_tokens) << what;
        int64_t drafted = 0, accepted = 0;
        for (const auto& [i, u] : sp.usage) {
          drafted += u.spec_draft_tokens;
          accepted += u.spec_accepted_tokens;
        }
        EXPECT_EQ(drafted, sp.stats.spec.num_draft_tokens) << what;
        EXPECT_EQ(accepted, sp.stats.spec.num_accepted_tokens) << what;
      }
    }
  }
}

// Greedy requests with presence/frequency penalties: the penalized argmax (with the accepted drafts before
// each position counted) decides, with and without speculation, chain and tree, alone and batched; the
// reported logprobs and top_logprobs (raw log-softmax) equal the plain run's within fp tolerance.
TEST_P(SpecFixture, PenaltiesAndLogprobsMatchPlainDecoding) {
  Loaded& m = fixture(GetParam());
  auto specs = prompts_of(m, 12);
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].sampling.presence_penalty = i % 2 ? 1.5f : 0.5f;
    specs[i].sampling.frequency_penalty = i % 2 ? 0.5f : 2.0f;
    specs[i].sampling.logprobs = 3;
  }
  const Result_ plain = run(m, specs, 0, false, false);
  struct Shape {
    int32_t steps, topk, draft_tokens;
    bool batched;
  };
  for (const Shape sh : {Shape{1, 1, 0, false}, Shape{3, 1, 0, true}, Shape{3, 2, 6, true}}) {
    const Result_ sp = run(m, specs, sh.steps, true, sh.batched, nullptr, std::nullopt, false, sh.topk, sh.draft_tokens);
    const std::string what = GetParam() + " S=" + std::to_string(sh.steps) + " k=" + std::to_string(sh.topk) +
                             " batched " + std::to_string(sh.batched);
    EXPECT_GT(sp.stats.spec.num_draft_tokens, 0) << what;
    for (size_t i = 0; i < specs.size(); ++i) {
      ASSERT_EQ(sp.tokens.at(i), plain.tokens.at(i)) << what << " request " << i;
      for (size_t t = 0; t < plain.tokens.at(i).size(); ++t) {
        const std::string at = what + " request " + std::to_string(i) + " token " + std::to_string(t);
        EXPECT_NEAR(sp.logprobs.at(i)[t], plain.logprobs.at(i)[t], 1e-3) << at;
        const auto& a = sp.top.at(i)[t];
        const auto& b = plain.top.at(i)[t];
        ASSERT_EQ(a.size(), b.size()) << at;
        for (size_t k = 0; k < a.size(); ++k) {
          EXPECT_EQ(a[k].token, b[k].token) << at;
          EXPECT_NEAR(a[k].logprob, b[k].logprob, 1e-3) << at;
        }
      }
    }
  }
}

// Tree mode at a simulated acceptance of depth + 1: every step accepts a full-depth path (M - 1 = the
// tree's capacity, so every tree reaches depth 3).
TEST_P(SpecFixture, TreeSimulatedAcceptanceAcceptsFullPaths) {
  Loaded& m = fixture(GetParam());
  auto specs = prompts_of(m, 24);
  const Result_ r = run(m, specs, 3, false, true, nullptr, 4.0, false, 2, 11);
  EXPECT_GT(r.stats.spec.num_drafts, 0);
  EXPECT_EQ(r.stats.spec.num_accepted_tokens, 3 * r.stats.spec.num_drafts);
  ASSERT_EQ(r.stats.spec.accepted_per_pos.size(), 3u);
  EXPECT_EQ(r.stats.spec.accepted_per_pos[2], r.stats.spec.num_drafts);
}

// The target's greedy token after every prefix of `tokens`, by one plain forward over all of them.
std::vector<int32_t> teacher_argmax(Loaded& m, const std::vector<int32_t>& tokens) {
  const int32_t T = static_cast<int32_t>(tokens.size());
  const int64_t bs = 4, n_blocks = (T + bs - 1) / bs + 1;
  auto ex = make_model_executor(*m.lm, *m.be, n_blocks, bs);
  model::ForwardBatch b;
  b.token_ids = tokens;
  model::SequenceSpan span;
  span.n_tokens = T;
  span.kv_len = T;
  for (int64_t i = 0; i < n_blocks; ++i) span.block_table.push_back(static_cast<int32_t>(i));
  b.seqs.push_back(span);
  for (int32_t i = 0; i < T; ++i) {
    b.positions.push_back(i);
    b.logit_rows.push_back(i);
  }
  b.want_host_logits = false;
  auto out = ex->execute(b);
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out->argmax;
}

// Tree verification with real acceptance: the fixtures' random MTP layers never agree with the target, so
// simulated acceptance of depth + 1 accepts a full-depth path of (arbitrary) draft nodes every step -- the
// path's K/V sit at scattered tree slots and are compacted -- and each step's bonus token is the target's
// argmax at the last accepted node. Every bonus token must equal the argmax of one plain forward over the
// final sequence: any error in the tree mask, the depth positions or the compaction shows up there (the
// later steps attend to the compacted K/V). Generated layout: t_0, then (S drafts + 1 bonus) per step.
TEST_P(SpecFixture, TreeAcceptedPathsKeepTheCacheExact) {
  Loaded& m = fixture(GetParam());
  struct Shape {
    int32_t steps, topk, draft_tokens;
  };
  for (const Shape sh : {Shape{3, 2, 11}, Shape{2, 4, 21}}) {
    const int32_t per_step = sh.steps + 1;
    auto specs = prompts_of(m, 1 + 5 * per_step);
    for (bool batched : {false, true}) {
      const Result_ r = run(m, specs, sh.steps, true, batched, nullptr, sh.steps + 1.0, false, sh.topk, sh.draft_tokens);
      EXPECT_EQ(r.stats.spec.num_accepted_tokens, sh.steps * r.stats.spec.num_drafts);
      for (size_t i = 0; i < specs.size(); ++i) {
        const auto& gen = r.tokens.at(i);
        ASSERT_EQ(gen.size(), static_cast<size_t>(1 + 5 * per_step));
        std::vector<int32_t> all = specs[i].prompt;
        all.insert(all.end(), gen.begin(), gen.end() - 1);
        const std::vector<int32_t> am = teacher_argmax(m, all);
        const size_t P = specs[i].prompt.size();
        int checked = 0;
        for (size_t g = 0; g < gen.size(); ++g) {
          const bool bonus = g == 0 || (g - 1) % per_step == static_cast<size_t>(sh.steps);
          if (!bonus) continue;
          EXPECT_EQ(gen[g], am[P + g - 1]) << GetParam() << " S=" << sh.steps << " k=" << sh.topk << " batched "
                                           << batched << " request " << i << " generated token " << g;
          ++checked;
        }
        EXPECT_EQ(checked, 6);
      }
    }
  }
}

TEST_P(SpecFixture, DraftLogitsEqualFixtureMtpLogits) {
  Loaded& m = fixture(GetParam());
  const auto& c = m.cases[3];  // 64 tokens
  RequestSpec s;
  s.prompt = c.input_ids;
  s.sampling.temperature = 0;
  s.sampling.max_tokens = 2;
  s.sampling.ignore_eos = true;
  MtpRecord rec_data;
  MtpRecord* rec = &rec_data;
  run(m, {s}, 2, false, false, rec);
  // The first MTP call is the extend over positions 0..T-1; rows 0..T-2 are exactly the fixture's rows.
  const int64_t T = static_cast<int64_t>(c.input_ids.size()), V = m.lm->config().vocab_size;
  ASSERT_EQ(rec->first_batch_.n_tokens(), T);
  auto e = cli::compare(rec->first_logits_.data<float>(), c.mtp_logits.data<float>(), (T - 1) * V);
  EXPECT_LT(e.rel_l2, 1e-4);
}

TEST_P(SpecFixture, SimulatedAcceptanceAcceptsAtTheRequestedRate) {
  Loaded& m = fixture(GetParam());
  auto specs = prompts_of(m, 24);
  const Result_ r = run(m, specs, 3, false, true, nullptr, 4.0);  // accept all 3 drafts every step
  EXPECT_EQ(r.stats.spec.num_accepted_tokens, r.stats.spec.num_draft_tokens);
  ASSERT_EQ(r.stats.spec.accepted_per_pos.size(), 3u);
  EXPECT_EQ(r.stats.spec.accepted_per_pos[0], r.stats.spec.num_drafts);
}


// The adaptive policy on real (random-weight) drafts: it explores N = 3..0, the drafts are ~never accepted,
// so it settles on N = 0 (the extend then skips the MTP head); greedy outputs stay identical throughout.
TEST_P(SpecFixture, AdaptivePolicyStaysLosslessAndPausesUselessDrafts) {
  Loaded& m = fixture(GetParam());
  const auto specs = prompts_of(m, 40);
  const Result_ plain = run(m, specs, 0, true, true);
  const Result_ sp = run(m, specs, 3, true, true, nullptr, std::nullopt, /*adaptive=*/true);
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(sp.tokens.at(i), plain.tokens.at(i)) << GetParam() << " request " << i;
  EXPECT_GT(sp.stats.spec.num_draft_tokens, 0) << "explored N > 0";
  EXPECT_EQ(sp.stats.spec.current_steps, 0) << "acceptance ~0: speculation paused";
}

// The fixtures' weights are random, so their MTP layer (correct, and equal to HF's) agrees with the
// target ~never: on them the self-test runs end to end and a zeroed draft is flagged; healthy-vs-broken
// is checked on a fake model whose draft is an oracle (OracleMtpModel, oracle_mtp_model.h).
TEST_P(SpecFixture, SelfTestRunsOnTheFixtureAndFlagsAZeroedDraft) {
  Loaded& m = fixture(GetParam());
  SpecConfig spec;
  spec.num_steps = 2;
  auto real = run_spec_self_test(make_model_executor(*m.lm, *m.be, 64, 4), spec, 64, 4);
  ASSERT_TRUE(real.is_ok()) << real.status().to_string();
  EXPECT_EQ(real->prompts, 4);
  EXPECT_GT(real->verify_steps, 40);
  EXPECT_EQ(real->drafted, 2 * real->verify_steps);
  std::printf("%s: self-test acceptance %.3f (random weights)\n", GetParam().c_str(), real->acceptance_rate());
  auto bad = run_spec_self_test(std::make_unique<ZeroedMtpExecutor>(make_model_executor(*m.lm, *m.be, 64, 4)), spec, 64, 4);
  ASSERT_TRUE(bad.is_ok()) << bad.status().to_string();
  EXPECT_GT(bad->drafted, 0);
  EXPECT_FALSE(bad->healthy()) << "zeroed draft acceptance " << bad->acceptance_rate();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpecFixture, ::testing::Values("glm4_moe_tiny_a", "glm4_moe_tiny_b"));

using testing::OracleMtpModel;

// Tree mode end to end with a draft that agrees with the target (the oracle: both hash the context each
// row sees, tree masks applied): the greedy path is ranked first and fully accepted every step (so the
// draft's MTP rows saw exactly their ancestors), the outputs equal the target's greedy continuation, and
// accepted paths off the first-created branch are compacted.
TEST(SpecTree, OracleDraftAcceptsFullDepthLosslessly) {
  const int64_t V = 512;
  struct Shape {
    int32_t steps, topk, draft_tokens;
  };
  for (const Shape sh : {Shape{3, 2, 6}, Shape{2, 4, 8}, Shape{4, 3, 12}}) {
    EngineConfig cfg;
    cfg.scheduler.block_size = 4;
    cfg.n_blocks = 256;
    cfg.max_model_len = 256;
    cfg.spec.num_steps = sh.steps;
    cfg.spec.adaptive = false;
    cfg.spec.topk = sh.topk;
    cfg.spec.num_draft_tokens = sh.draft_tokens;
    auto model = std::make_unique<OracleMtpModel>(cfg.n_blocks, 4, V, 1000.f);
    OracleMtpModel* oracle = model.get();
    Engine engine(cfg, std::move(model));
    std::vector<std::vector<int32_t>> prompts = {{5, 9, 2}, {100, 7, 7, 7, 300, 1, 2}, {42}};
    std::map<RequestId, std::vector<int32_t>> got;
    std::map<RequestId, size_t> which;
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestSpec rs;
      rs.prompt = prompts[i];
      rs.sampling.temperature = 0;
      rs.sampling.max_tokens = 40;
      rs.sampling.ignore_eos = true;
      auto id = engine.submit(rs, [&got](const TokenEvent& ev) {
        if (ev.token >= 0) got[ev.id].push_back(ev.token);
      });
      ASSERT_TRUE(id.is_ok());
      which[*id] = i;
    }
    while (!engine.idle()) {
      engine.step();
      ASSERT_TRUE(engine.check_invariants().is_ok());
    }
    const std::string what = "S=" + std::to_string(sh.steps) + " k=" + std::to_string(sh.topk) +
                             " M=" + std::to_string(sh.draft_tokens);
    for (const auto& [id, toks] : got)
      EXPECT_EQ(toks, testing::fake_greedy(prompts[which[id]], 40, V, {})) << what << " request " << which[id];
    const EngineStats st = engine.stats();
    EXPECT_GT(st.spec.num_drafts, 0) << what;
    // Full depth nearly always: a near-tie in the draft's ranking can prune the greedy path now and then.
    // (A draft row seeing non-ancestors would get depth >= 3 rejected: <= 2 per tree.)
    EXPECT_GE(st.spec.num_accepted_tokens, 0.9 * sh.steps * st.spec.num_drafts) << what;
    EXPECT_EQ(st.spec.num_draft_tokens, (sh.draft_tokens - 1) * st.spec.num_drafts) << what;
    std::printf("%s: %lld trees, %lld accepted, %lld compactions\n", what.c_str(),
                static_cast<long long>(st.spec.num_drafts), static_cast<long long>(st.spec.num_accepted_tokens),
                static_cast<long long>(oracle->copies()));
  }
}

// Runs requests on an OracleMtpModel engine (spec_steps 0: plain decoding) and returns each one's tokens.
std::vector<std::vector<int32_t>> run_oracle(const std::vector<RequestSpec>& specs, int32_t steps, int32_t topk,
                                             int32_t draft_tokens, int64_t vocab, float scale, EngineStats* stats,
                                             int64_t n_blocks = 256) {
  EngineConfig cfg;
  cfg.scheduler.block_size = 4;
  cfg.n_blocks = n_blocks;
  cfg.max_model_len = 256;
  cfg.spec.num_steps = steps;
  cfg.spec.adaptive = false;
  cfg.spec.topk = topk;
  cfg.spec.num_draft_tokens = draft_tokens;
  Engine engine(cfg, std::make_unique<OracleMtpModel>(cfg.n_blocks, 4, vocab, scale));
  std::vector<std::vector<int32_t>> got(specs.size());
  std::map<RequestId, size_t> which;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto id = engine.submit(specs[i], [&got, &which](const TokenEvent& ev) {
      if (ev.token >= 0) got[which.at(ev.id)].push_back(ev.token);
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    which[*id] = i;
  }
  while (!engine.idle()) {
    engine.step();
    EXPECT_TRUE(engine.check_invariants().is_ok());
  }
  if (stats) *stats = engine.stats();
  return got;
}

// Penalties with a draft that agrees with the target: drafts are accepted, so the penalty at draft position j
// must count the accepted drafts before j. Greedy with presence/frequency penalties equals plain decoding.
TEST(SpecPenalties, GreedyWithPenaltiesEqualsPlainDecodingWhenDraftsAreAccepted) {
  const int64_t V = 64;
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 4; ++i) {
    RequestSpec rs;
    rs.prompt = {static_cast<int32_t>(3 + i), 9, 2, static_cast<int32_t>(7 * i)};
    rs.sampling.temperature = 0;
    rs.sampling.max_tokens = 40;
    rs.sampling.ignore_eos = true;
    rs.sampling.presence_penalty = 0.2f * static_cast<float>(i + 1);
    rs.sampling.frequency_penalty = 0.1f * static_cast<float>(4 - i);
    specs.push_back(rs);
  }
  const auto plain = run_oracle(specs, 0, 1, 0, V, 1.f, nullptr);
  struct Shape {
    int32_t steps, topk, draft_tokens;
  };
  for (const Shape sh : {Shape{1, 1, 0}, Shape{3, 1, 0}, Shape{3, 2, 6}, Shape{2, 4, 8}}) {
    EngineStats st;
    const auto sp = run_oracle(specs, sh.steps, sh.topk, sh.draft_tokens, V, 1.f, &st);
    const std::string what = "S=" + std::to_string(sh.steps) + " k=" + std::to_string(sh.topk);
    for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(sp[i], plain[i]) << what << " request " << i;
    EXPECT_GT(st.spec.num_accepted_tokens, st.spec.num_drafts / 2) << what << ": the oracle's drafts are accepted";
  }
}

TEST(SpecSelfTest, HealthyDraftPassesAndAZeroedDraftIsFlagged) {
  SpecConfig spec;
  spec.num_steps = 3;
  auto good = run_spec_self_test(std::make_unique<OracleMtpModel>(64, 4, 512), spec, 64, 4);
  ASSERT_TRUE(good.is_ok()) << good.status().to_string();
  EXPECT_EQ(good->prompts, 4);
  EXPECT_GT(good->drafted, 0);
  EXPECT_GT(good->acceptance_rate(), 0.9);
  EXPECT_TRUE(good->healthy());
  log_spec_self_test(*good);
  auto bad = run_spec_self_test(std::make_unique<ZeroedMtpExecutor>(std::make_unique<OracleMtpModel>(64, 4, 512)),
                                spec, 64, 4);
  ASSERT_TRUE(bad.is_ok()) << bad.status().to_string();
  EXPECT_LT(bad->acceptance_rate(), 0.05);
  EXPECT_FALSE(bad->healthy());
  log_spec_self_test(*bad);  // the loud warning, visible in the test log
  // The message: a loud warning naming the MTP layer for a real checkpoint; one info line with synthetic weights
  // (random drafts never agree), and never the warning for a healthy draft.
  const SpecSelfTestMessage real = spec_self_test_message(*bad, /*synthetic_weights=*/false);
  EXPECT_TRUE(real.warn);
  EXPECT_NE(real.text.find("SELF-TEST FAILED"), std::string::npos);
  EXPECT_NE(real.text.find("exclude-list"), std::string::npos);
  const SpecSelfTestMessage synth = spec_self_test_message(*bad, /*synthetic_weights=*/true);
  EXPECT_FALSE(synth.warn);
  EXPECT_EQ(synth.text.find("FAILED"), std::string::npos) << synth.text;
  EXPECT_NE(synth.text.find("expected with --synthetic-weights"), std::string::npos) << synth.text;
  for (bool synthetic : {false, true}) {
    const SpecSelfTestMessage ok = spec_self_test_message(*good, synthetic);
    EXPECT_FALSE(ok.warn);
    EXPECT_EQ(ok.text.find("FAILED"), std::string::npos);
  }
}

}  // namespace
}  // namespace mxserve::runtime
