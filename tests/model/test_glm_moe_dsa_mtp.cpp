// glm_moe_dsa MTP speculation on the CPU reference, index_share_for_mtp_iteration in particular: draft-chain
// steps >= 2 (ForwardBatch::mtp_first_step_rows) must attend over exactly the top-k the chain's first step (the
// MTP extend) chose when the config key is true -- the oracle is the same model with the key false and its MTP
// indexer forced (a DecisionHook) to the first step's keys -- and must run their own indexer when it is false.
// Either way the engine's speculative greedy output must equal plain greedy decoding.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "io/safetensors_writer.h"
#include "model/archs/glm_moe_dsa.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/decisions.h"
#include "runtime/engine.h"
#include "runtime/executor.h"
#include "runtime/sequence_runner.h"

namespace mxserve::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kLayers = 3;  // the MTP layer is layer 3
constexpr int64_t kVocab = 96;

json tiny_config(bool share) {
  return json{{"architectures", {"GlmMoeDsaForCausalLM"}}, {"model_type", "glm_moe_dsa"},
              {"vocab_size", kVocab}, {"hidden_size", 32}, {"intermediate_size", 48}, {"moe_intermediate_size", 16},
              {"num_hidden_layers", kLayers}, {"num_attention_heads", 2}, {"num_key_value_heads", 2}, {"head_dim", 8},
              {"q_lora_rank", 24}, {"kv_lora_rank", 16}, {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 8},
              {"v_head_dim", 12}, {"index_topk", 4}, {"index_head_dim", 12}, {"index_n_heads", 2},
              {"indexer_types", {"full", "shared", "full"}}, {"mlp_layer_types", {"dense", "sparse", "sparse"}},
              {"first_k_dense_replace", 1}, {"n_routed_experts", 4}, {"num_experts_per_tok", 2}, {"n_group", 1},
              {"topk_group", 1}, {"n_shared_experts", 1}, {"norm_topk_prob", true}, {"routed_scaling_factor", 2.5},
              {"rms_norm_eps", 1e-5}, {"rope_parameters", {{"rope_theta", 10000.0}, {"rope_type", "default"}}},
              {"num_nextn_predict_layers", 1}, {"tie_word_embeddings", false}, {"dtype", "float32"},
              {"index_share_for_mtp_iteration", share}};
}

std::vector<fs::path>& temp_dirs() {
  static std::vector<fs::path> dirs;
  return dirs;
}
struct RemoveTempDirs : ::testing::Environment {
  void TearDown() override {
    for (const auto& d : temp_dirs()) fs::remove_all(d);
  }
};
const auto* const kRemoveTempDirs = ::testing::AddGlobalTestEnvironment(new RemoveTempDirs);

// The same random weights (seed 11) whatever `share` says: the key changes no tensor.
fs::path write_checkpoint(bool share) {
  const fs::path dir = fs::temp_directory_path() /
                       ("mxserve_dsa_mtp_" + std::to_string(share) + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  temp_dirs().push_back(dir);
  std::ofstream(dir / "config.json") << tiny_config(share).dump(2);
  auto cfg = load_model_config(dir.string());
  EXPECT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  io::NamedTensors tensors;
  for (const WeightSpec& w : glm_moe_dsa_weight_table(*cfg, /*include_mtp=*/true)) {
    Tensor t = Tensor::empty(DType::kF32, w.shape);
    const bool is_norm = w.name.find("norm.weight") != std::string::npos ||
                         w.name.find("layernorm") != std::string::npos || w.name.find("enorm") != std::string::npos;
    float sd = 0.15f;
    if (w.name.find("embed") != std::string::npos || w.name.find("lm_head") != std::string::npos) sd = 0.5f;
    if (w.name.find("indexer") != std::string::npos) sd = 0.3f;
    if (w.name.find("mlp.gate.weight") != std::string::npos) sd = 0.4f;
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = (is_norm ? 1.f : 0.f) + sd * nd(rng);
    tensors.emplace_back(w.name, std::move(t));
  }
  EXPECT_TRUE(io::write_safetensors((dir / "model.safetensors").string(), tensors).is_ok());
  return dir;
}

struct Tiny {
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  std::unique_ptr<CausalLM> lm;
  explicit Tiny(bool share) {
    auto m = load_causal_lm(write_checkpoint(share).string(), *be, LoadOptions{});
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    if (m.is_ok()) lm = std::move(*m);
  }
};

const std::vector<int32_t> kPrompt = {3, 17, 42, 8, 8, 91, 5, 60, 33, 2, 77, 14, 29, 50, 11, 64, 7, 38, 21, 90};

// Records the MTP layer's index top-k decisions; with `force` set, replaces every one after the first by that row.
class MtpIndexHook : public DecisionHook {
 public:
  void on_decision(DecisionRows& d) override {
    if (d.site != DecisionSite::kIndexTopk || d.layer != kLayers) return;
    if (!force.empty() && !seen.empty()) {  // the first MTP decision is the chain's first step: left alone
      for (int64_t r = 0; r < d.rows; ++r) std::copy(force.begin(), force.end(), d.ids.begin() + r * d.width);
      d.forced = true;
    }
    seen.push_back(d);
  }
  std::vector<int32_t> force;  // [index_topk]
  std::vector<DecisionRows> seen;
};

// One draft chain on `m`: the target over the prompt, the MTP extend over its rows (first step: last row is
// row kPrompt.size() - 2), then steps 2 and 3, each fed the target's hidden row of its position (any hidden
// input serves: the test is about the keys attended). Returns the logits of steps 2 and 3.
struct Chain {
  std::vector<float> step2, step3;
  std::vector<int32_t> first_step_keys;  // the extend's top-k row of its last position (when the hook saw it)
  int64_t mtp_index_decisions = 0;       // MTP-layer indexer runs the hook saw in steps 2 and 3
};
Chain run_chain(Tiny& m, bool continuation_rows, MtpIndexHook& hook) {
  Chain c;
  runtime::SequenceRunner runner(*m.lm, *m.be, 64, 4);
  runtime::SequenceState seq, mtp_seq;
  auto target = runner.extend({&seq}, {kPrompt}, false, true);
  EXPECT_TRUE(target.is_ok()) << target.status().to_string();
  if (!target.is_ok()) return c;
  const int64_t P = static_cast<int64_t>(kPrompt.size());
  ScopedDecisionHook scoped(&hook);
  auto first = runner.mtp(mtp_seq, std::vector<int32_t>(kPrompt.begin() + 1, kPrompt.end()),
                          target->hidden.slice_rows(0, P - 1));
  EXPECT_TRUE(first.is_ok()) << first.status().to_string();
  if (!hook.seen.empty()) {
    const DecisionRows& d = hook.seen.back();
    c.first_step_keys.assign(d.row(d.rows - 1), d.row(d.rows - 1) + d.width);
  }
  const size_t before = hook.seen.size();
  const std::vector<int32_t> rows = continuation_rows ? std::vector<int32_t>{static_cast<int32_t>(P - 2)}
                                                      : std::vector<int32_t>{};
  auto s2 = runner.mtp(mtp_seq, {40}, target->hidden.slice_rows(P - 1, P), rows);
  EXPECT_TRUE(s2.is_ok()) << s2.status().to_string();
  auto s3 = runner.mtp(mtp_seq, {41}, target->hidden.slice_rows(P - 2, P - 1), rows);
  EXPECT_TRUE(s3.is_ok()) << s3.status().to_string();
  if (!s2.is_ok() || !s3.is_ok()) return c;
  c.step2.assign(s2->data<float>(), s2->data<float>() + s2->numel());
  c.step3.assign(s3->data<float>(), s3->data<float>() + s3->numel());
  c.mtp_index_decisions = static_cast<int64_t>(hook.seen.size() - before);
  return c;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

TEST(GlmMoeDsaMtp, ShareReusesTheFirstDraftStepsTopk) {
  Tiny shared(true), own(false);
  ASSERT_TRUE(shared.lm && own.lm && shared.lm->has_mtp());
  MtpIndexHook rec_shared, rec_own;
  const Chain s = run_chain(shared, /*continuation_rows=*/true, rec_shared);
  const Chain o = run_chain(own, true, rec_own);  // the key is false: the rows are ignored, the indexer runs
  ASSERT_EQ(s.first_step_keys.size(), 4u);
  EXPECT_EQ(s.first_step_keys, o.first_step_keys);
  EXPECT_EQ(s.mtp_index_decisions, 0) << "index_share_for_mtp_iteration: draft steps 2 and 3 ran the MTP indexer";
  ASSERT_EQ(o.mtp_index_decisions, 2) << "without the key every draft step runs the MTP indexer";
  // The recomputed selections differ from the first step's (20+ keys, top 4), so reuse is observable.
  const std::vector<int32_t> own2(rec_own.seen[rec_own.seen.size() - 2].row(0),
                                  rec_own.seen[rec_own.seen.size() - 2].row(0) + 4);
  EXPECT_NE(own2, o.first_step_keys);
  EXPECT_GT(rel_l2(s.step2, o.step2), 1e-4) << "reused and recomputed top-k must give different draft logits here";
  // Oracle: the key-false model with its MTP indexer forced to the first step's keys in steps 2 and 3.
  MtpIndexHook forced;
  forced.force = s.first_step_keys;
  Tiny own2_model(false);
  ASSERT_TRUE(own2_model.lm);
  const Chain f = run_chain(own2_model, false, forced);
  EXPECT_LE(rel_l2(s.step2, f.step2), 1e-6);
  EXPECT_LE(rel_l2(s.step3, f.step3), 1e-6);
}

TEST(GlmMoeDsaMtp, ContinuationRowsOutsideTheFirstStepAreNamed) {
  Tiny shared(true);
  ASSERT_TRUE(shared.lm);
  runtime::SequenceRunner runner(*shared.lm, *shared.be, 64, 4);
  runtime::SequenceState seq, mtp_seq;
  auto target = runner.extend({&seq}, {kPrompt}, false, true);
  ASSERT_TRUE(target.is_ok());
  ASSERT_TRUE(runner.mtp(mtp_seq, {1, 2}, target->hidden.slice_rows(0, 2)).is_ok());
  auto bad = runner.mtp(mtp_seq, {3}, target->hidden.slice_rows(2, 3), {5});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("mtp_first_step_rows names row 5"), std::string::npos)
      << bad.status().to_string();
}

// The engine with MTP chain speculation (N = 3, fixed) against plain greedy decoding, key true and false;
// prompts longer than index_topk so every selection prunes.
TEST(GlmMoeDsaMtp, EngineSpeculativeGreedyEqualsPlainGreedy) {
  std::map<bool, size_t> indexer_runs;
  for (bool share : {true, false}) {
    Tiny m(share);
    ASSERT_TRUE(m.lm);
    runtime::EngineConfig cfg;
    cfg.scheduler.block_size = 4;
    cfg.scheduler.max_num_batched_tokens = 64;
    cfg.scheduler.chunked_prefill_size = 7;
    cfg.n_blocks = 256;
    cfg.max_model_len = 256;
    cfg.spec.num_steps = 3;
    cfg.spec.adaptive = false;
    cfg.spec.self_test = false;
    runtime::Engine engine(cfg, runtime::make_model_executor(*m.lm, *m.be, cfg.n_blocks, 4));
    std::vector<runtime::RequestSpec> specs;
    for (int i = 0; i < 3; ++i) {
      runtime::RequestSpec s;
      s.prompt.assign(kPrompt.begin(), kPrompt.begin() + 12 + 3 * i);
      s.sampling.temperature = 0;
      s.sampling.max_tokens = 12;
      s.sampling.ignore_eos = true;
      specs.push_back(s);
    }
    std::map<runtime::RequestId, std::vector<int32_t>> tokens;
    std::vector<runtime::RequestId> order;
    for (const auto& s : specs) {
      auto id = engine.submit(s, [&](const runtime::TokenEvent& ev) {
        if (ev.token >= 0) tokens[ev.id].push_back(ev.token);
      });
      ASSERT_TRUE(id.is_ok()) << id.status().to_string();
      order.push_back(*id);
    }
    MtpIndexHook rec;
    {
      ScopedDecisionHook scoped(&rec);
      while (!engine.idle()) engine.step();
    }
    EXPECT_GT(engine.stats().spec.num_draft_tokens, 0);
    EXPECT_GT(rec.seen.size(), 0u);
    runtime::SequenceRunner runner(*m.lm, *m.be, 64, 4);
    for (size_t i = 0; i < specs.size(); ++i) {
      auto ref = runner.greedy(specs[i].prompt, 12, 1000, {});
      ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
      EXPECT_EQ(tokens[order[i]], *ref) << "request " << i << " share " << share;
    }
    std::printf("[ spec ] share=%d drafted %lld accepted %lld, MTP indexer runs %zu\n", share,
                static_cast<long long>(engine.stats().spec.num_draft_tokens),
                static_cast<long long>(engine.stats().spec.num_accepted_tokens), rec.seen.size());
    indexer_runs[share] = rec.seen.size();
  }
  // The same drafts either way (the draft chains stop only at the fixed N): sharing skips steps 2 and 3's indexer.
  EXPECT_LT(indexer_runs[true], indexer_runs[false]);
}

}  // namespace
}  // namespace mxserve::model
