// Structured output through the engine with scripted logits that prefer invalid tokens (EOS first, then
// stray bytes): unconstrained, the output is not JSON; constrained (greedy, sampled, batched with
// different schemas, and with MTP speculation whose drafts are often invalid) every output is a complete
// document of its schema, and speculation with the grammar yields exactly the plain greedy tokens.
#include <gtest/gtest.h>

#include <map>

#include "../runtime/fake_model.h"
#include "runtime/constrained_decoding.h"
#include "runtime/engine.h"
#include "structured/grammar_constraint.h"
#include "test_support.h"

namespace mxserve::structured {
namespace {

using runtime::testing::context_hash;
using runtime::testing::fake_logits;

// A fake model whose KV cache holds token ids (as runtime's FakeModel): row logits are a hash of the
// visible context plus fixed boosts (EOS highest, then '"', stray 'Z', closers). Its MTP layer proposes
// the argmax of a hash of (token, position) with the same boosts except EOS: drafts are often invalid.
class ScriptedModel final : public runtime::ModelExecutor {
 public:
  ScriptedModel(int64_t n_blocks, int64_t block_size, int64_t vocab, int32_t eos)
      : slots_(n_blocks * block_size, -1), block_size_(block_size), vocab_(vocab), eos_(eos) {}
  int64_t vocab_size() const override { return vocab_; }
  bool has_mtp() const override { return true; }
  Result<runtime::ExecOutput> execute(const model::ForwardBatch& batch) override {
    for (const auto& s : batch.seqs) {
      const int32_t first = s.kv_len - s.n_tokens;
      for (int32_t i = 0; i < s.n_tokens; ++i) slots_[slot(s, first + i)] = batch.token_ids[s.token_begin + i];
    }
    Tensor logits = Tensor::empty(DType::kF32, {static_cast<int64_t>(batch.logit_rows.size()), vocab_});
    std::vector<int32_t> ctx;
    for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
      const int32_t row = batch.logit_rows[r];
      for (const auto& s : batch.seqs) {
        if (row < s.token_begin || row >= s.token_begin + s.n_tokens) continue;
        const int32_t j = s.kv_len - s.n_tokens + (row - s.token_begin);
        ctx.clear();
        for (int32_t k = 0; k <= j; ++k) ctx.push_back(slots_[slot(s, k)]);
      }
      float* out = logits.data<float>() + r * vocab_;
      fake_logits(context_hash(ctx), vocab_, out);
      boost(out, true);
    }
    return runtime::ExecOutput{logits, {}, Tensor()};
  }
  Result<runtime::ExecOutput> execute_mtp(const model::ForwardBatch& batch, const Tensor&) override {
    Tensor logits = Tensor::empty(DType::kF32, {static_cast<int64_t>(batch.logit_rows.size()), vocab_});
    for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
      const int32_t row = batch.logit_rows[r];
      float* out = logits.data<float>() + r * vocab_;
      fake_logits(mix64(static_cast<uint64_t>(batch.token_ids[row]) * 977 + batch.positions[row]), vocab_, out);
      boost(out, false);
    }
    ++mtp_calls_;
    return runtime::ExecOutput{logits, {}, Tensor()};
  }
  Tensor select_rows(const Tensor& hidden, const std::vector<int32_t>&) override { return hidden; }
  int64_t mtp_calls() const { return mtp_calls_; }

 private:
  void boost(float* out, bool with_eos) const {
    if (with_eos) out[eos_] += 100.f;
    out['"'] += 60.f;
    out['Z'] += 50.f;
    out['}'] += 40.f;
    out[']'] += 40.f;
  }
  int64_t slot(const model::SequenceSpan& s, int32_t j) const {
    return static_cast<int64_t>(s.blocks()[j / block_size_]) * block_size_ + j % block_size_;
  }
  std::vector<int32_t> slots_;
  int64_t block_size_, vocab_;
  int32_t eos_;
  int64_t mtp_calls_ = 0;
};

struct Run {
  std::string text;
  std::vector<int32_t> tokens;
  runtime::FinishReason finish = runtime::FinishReason::kNone;
};

struct Harness {
  std::vector<std::optional<std::string>> vocab = testing::fragment_vocab();
  int32_t eos = static_cast<int32_t>(vocab.size()) - 1;
  std::shared_ptr<const TokenIndex> index = TokenIndex::build(vocab, static_cast<int64_t>(vocab.size()));
  ScriptedModel* model = nullptr;
  std::unique_ptr<runtime::Engine> engine;
  std::map<runtime::RequestId, Run> runs;

  explicit Harness(int32_t spec_steps) {
    runtime::EngineConfig cfg;
    cfg.scheduler.block_size = 4;
    cfg.n_blocks = 2048;
    cfg.max_model_len = 600;
    cfg.eos_token_ids = {eos};
    cfg.spec.num_steps = spec_steps;
    cfg.spec.adaptive = false;
    auto m = std::make_unique<ScriptedModel>(cfg.n_blocks, cfg.scheduler.block_size, static_cast<int64_t>(vocab.size()), eos);
    model = m.get();
    engine = std::make_unique<runtime::Engine>(cfg, std::move(m));
  }
  runtime::RequestId submit(std::shared_ptr<const Grammar> g, float temperature, uint64_t seed, int prompt_salt) {
    runtime::RequestSpec spec;
    spec.prompt = {1, 2, 3, 4 + prompt_salt};
    spec.sampling.temperature = temperature;
    spec.sampling.seed = seed;
    spec.sampling.max_tokens = 400;
    if (g) spec.constraint = std::make_shared<GrammarConstraint>(g, index);
    auto id = engine->submit(spec, [this](const runtime::TokenEvent& ev) {
      Run& r = runs[ev.id];
      if (ev.token >= 0) {
        r.tokens.push_back(ev.token);
        if (ev.token != eos) r.text += *index->bytes(ev.token);
      }
      if (ev.finish != runtime::FinishReason::kNone) r.finish = ev.finish;
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    return *id;
  }
  void run_all() {
    for (int i = 0; i < 5000 && engine->step(); ++i) {
    }
  }
};

const char* kSchemas[] = {
    R"({"type":"object","additionalProperties":false,"required":["name","age"],
        "properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"enum":["red","green"]}}}})",
    R"({"type":"array","items":{"type":"number"},"minItems":2,"maxItems":3})",
    R"({"anyOf":[{"type":"null"},{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],"additionalProperties":false}]})",
};

std::shared_ptr<const Grammar> grammar_of(const char* s) {
  auto g = compile_json_schema(nlohmann::ordered_json::parse(s));
  EXPECT_TRUE(g.is_ok()) << g.status().to_string();
  return *g;
}

void expect_complete(const std::shared_ptr<const Grammar>& g, const Run& r, int32_t eos) {
  Matcher m(g);
  EXPECT_TRUE(m.accept(r.text) && m.can_end()) << "not a complete document: " << r.text;
  EXPECT_EQ(r.finish, runtime::FinishReason::kStop) << r.text;
  ASSERT_FALSE(r.tokens.empty());
  EXPECT_EQ(r.tokens.back(), eos) << "a constrained output ends with EOS once complete";
  EXPECT_TRUE(nlohmann::json::accept(r.text)) << r.text;
}

TEST(StructuredEngine, ApplyTokenMaskKeepsTerminatorsOnlyWhenComplete) {
  std::vector<float> logits(70, 1.f);
  std::vector<uint32_t> allowed(3, 0u);
  allowed[0] = 1u << 5;
  allowed[2] = 1u << 1;  // token 65
  const std::vector<int64_t> eos = {7};
  const std::vector<int32_t> stop = {40};
  auto row = logits;
  EXPECT_EQ(runtime::apply_token_mask(row, allowed, false, eos, stop), 2);
  for (int t = 0; t < 70; ++t) EXPECT_EQ(row[t] == 1.f, t == 5 || t == 65) << t;
  row = logits;
  EXPECT_EQ(runtime::apply_token_mask(row, allowed, true, eos, stop), 4);
  for (int t = 0; t < 70; ++t) EXPECT_EQ(row[t] == 1.f, t == 5 || t == 65 || t == 7 || t == 40) << t;
}

TEST(StructuredEngine, GrammarOverridesLogitsThatPreferInvalidTokens) {
  Harness h(0);
  const auto free_id = h.submit(nullptr, 0.f, 1, 0);
  std::vector<std::pair<runtime::RequestId, std::shared_ptr<const Grammar>>> ids;
  for (int i = 0; i < 3; ++i) {
    auto g = grammar_of(kSchemas[i]);
    ids.emplace_back(h.submit(g, 0.f, 1, i), g);           // greedy
    ids.emplace_back(h.submit(g, 1.0f, 7 + i, 10 + i), g);  // sampled, batched with the others
  }
  ids.emplace_back(h.submit(any_json_object_grammar(), 0.f, 1, 20), any_json_object_grammar());
  h.run_all();
  EXPECT_EQ(h.runs[free_id].tokens, std::vector<int32_t>{h.eos}) << "unconstrained, the model ends at once";
  for (const auto& [id, g] : ids) expect_complete(g, h.runs[id], h.eos);
  const auto st = h.engine->stats();
  EXPECT_GT(st.grammar_masks, 20);
  EXPECT_GT(st.grammar_mask_seconds, 0.0);
}

TEST(StructuredEngine, SpeculationChecksDraftsAgainstTheGrammar) {
  std::vector<std::shared_ptr<const Grammar>> gs;
  for (const char* s : kSchemas) gs.push_back(grammar_of(s));
  Harness plain(0), spec(3);
  std::vector<runtime::RequestId> a, b, sa, sb;
  for (int i = 0; i < 3; ++i) {
    a.push_back(plain.submit(gs[i], 0.f, 1, i));
    b.push_back(spec.submit(gs[i], 0.f, 1, i));
    sa.push_back(plain.submit(gs[i], 1.f, 5, 30 + i));
    sb.push_back(spec.submit(gs[i], 1.f, 5, 30 + i));
  }
  plain.run_all();
  spec.run_all();
  for (int i = 0; i < 3; ++i) {
    expect_complete(gs[i], plain.runs[a[i]], plain.eos);
    expect_complete(gs[i], spec.runs[b[i]], spec.eos);
    EXPECT_EQ(spec.runs[b[i]].tokens, plain.runs[a[i]].tokens) << "greedy + grammar is lossless under speculation";
    expect_complete(gs[i], spec.runs[sb[i]], spec.eos);  // sampled: valid (a different draw than plain)
  }
  const auto st = spec.engine->stats();
  EXPECT_GT(spec.model->mtp_calls(), 0);
  EXPECT_GT(st.spec.num_draft_tokens, 0);
  EXPECT_GT(st.spec.num_accepted_tokens, 0) << "some drafts are valid and accepted";
  EXPECT_LT(st.spec.num_accepted_tokens, st.spec.num_draft_tokens) << "invalid drafts are rejected";
}

}  // namespace
}  // namespace mxserve::structured
