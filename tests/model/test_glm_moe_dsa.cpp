// glm_moe_dsa (GLM-5.x) on the CPU reference: config parsing and its bad-input errors, the MLA / indexer
// kernels against independent brute-force oracles, and a tiny random checkpoint written by the test
// (chunked prefill / block size 1 equal one pass, the sparse selection changes the result, a missing
// indexer tensor is a load error naming it) plus GLM-5.2's attention geometry on a shrunk config.
// Exactness against transformers is verify-fixture on tests/fixtures/glm_moe_dsa_* (CMake registers it).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "io/safetensors_writer.h"
#include "kernels/cpu/cpu_kernels.h"
#include "model/archs/glm_moe_dsa.h"
#include "model/archs/glm_moe_dsa_config.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "runtime/engine.h"
#include "runtime/executor.h"
#include "runtime/sequence_runner.h"

namespace mxserve::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kConfigs = std::string(MXSERVE_SOURCE_DIR) + "/tests/data/configs/";

json glm52() {
  std::ifstream in(kConfigs + "GLM-5.2.json");
  return json::parse(in);
}

std::string parse_error(const json& j) {
  auto r = parse_model_config(j, "cfg.json");
  return r.is_ok() ? std::string("(parsed)") : r.status().to_string();
}

TEST(GlmMoeDsaConfig, RealConfigsParse) {
  for (const char* name : {"GLM-5", "GLM-5.1", "GLM-5.2"}) {
    auto cfg = load_model_config(kConfigs + name + ".json");
    ASSERT_TRUE(cfg.is_ok()) << name << ": " << cfg.status().to_string();
    const GlmMoeDsaConfig& d = glm_moe_dsa_config(*cfg);
    EXPECT_EQ(d.cache_width(), 576) << name;  // 512 latent + 64 rope per token
    EXPECT_EQ(d.index_topk, 2048);
    EXPECT_EQ(cfg->first_k_dense, 3);
    ASSERT_EQ(static_cast<int64_t>(d.full_indexer.size()), cfg->n_layers);
  }
  auto c52 = load_model_config(kConfigs + "GLM-5.2.json");
  const auto& f = glm_moe_dsa_config(*c52).full_indexer;
  // freq 4 / offset 3: layers 0, 1, 2, 6, 10, ..., 74 are full.
  for (int64_t l = 0; l < 78; ++l) EXPECT_EQ(f[l], l < 3 || (l - 2) % 4 == 0) << "layer " << l;
  auto c5 = load_model_config(kConfigs + "GLM-5.json");  // no indexer pattern keys: every layer full
  for (bool full : glm_moe_dsa_config(*c5).full_indexer) EXPECT_TRUE(full);
}

TEST(GlmMoeDsaConfig, BadInputIsNamed) {
  const struct {
    const char* what;
    std::function<void(json&)> edit;
    const char* expect;
  } cases[] = {
      {"missing index_topk", [](json& j) { j.erase("index_topk"); }, "field 'index_topk' is missing"},
      {"index_topk 0", [](json& j) { j["index_topk"] = 0; }, "field 'index_topk': expected a positive integer"},
      {"index_topk -5", [](json& j) { j["index_topk"] = -5; }, "field 'index_topk': expected a positive integer"},
      {"missing index_n_heads", [](json& j) { j.erase("index_n_heads"); }, "field 'index_n_heads' is missing"},
      {"missing index_head_dim", [](json& j) { j.erase("index_head_dim"); }, "field 'index_head_dim' is missing"},
      {"unknown indexer type", [](json& j) { j["indexer_types"][5] = "sparse"; },
       "field 'indexer_types'[5]: 'sparse' is not 'full' or 'shared'"},
      {"indexer_types length", [](json& j) { j["indexer_types"].erase(3); },
       "field 'indexer_types' has 77 entries for 78 layers"},
      {"indexer_types vs freq", [](json& j) { j["index_topk_freq"] = 2; },
       "contradictory fields: indexer_types"},
      {"layer 0 shared", [](json& j) { j["indexer_types"][0] = "shared"; j.erase("index_topk_freq"); j.erase("index_skip_topk_offset"); },
       "'indexer_types'[0] is 'shared'"},
      {"bad pattern", [](json& j) { j.erase("indexer_types"); j["index_topk_pattern"] = "FFX"; },
       "field 'index_topk_pattern': character 'X'"},
      {"qk_head_dim", [](json& j) { j["qk_head_dim"] = 192; }, "contradictory fields: qk_head_dim 192"},
      {"rope not interleaved", [](json& j) { j["rope_interleave"] = false; }, "field 'rope_interleave': false"},
      {"indexer rope not interleaved", [](json& j) { j["indexer_rope_interleave"] = false; },
       "field 'indexer_rope_interleave': false"},
      {"no q lora", [](json& j) { j["q_lora_rank"] = nullptr; }, "field 'q_lora_rank' is null"},
      {"mlp types vs first_k", [](json& j) { j["first_k_dense_replace"] = 1; },
       "contradictory fields: mlp_layer_types (3 dense layers) vs first_k_dense_replace (1)"},
      {"unknown mlp type", [](json& j) { j["mlp_layer_types"][4] = "moe"; },
       "field 'mlp_layer_types'[4]: 'moe' is not 'dense' or 'sparse'"},
      {"index head < rope", [](json& j) { j["index_head_dim"] = 32; }, "index_head_dim 32 is smaller than"},
      {"kv heads", [](json& j) { j["num_key_value_heads"] = 8; }, "num_key_value_heads 8 differs from"},
      {"index_n_heads 0", [](json& j) { j["index_n_heads"] = 0; }, "field 'index_n_heads': expected a positive integer"},
      {"index_topk a string", [](json& j) { j["index_topk"] = "2048"; }, "field 'index_topk'"},
      {"pattern vs indexer_types",
       [](json& j) {
         j.erase("index_topk_freq");
         j.erase("index_skip_topk_offset");
         j["index_topk_pattern"] = "F" + std::string(77, 'S');
       },
       "contradictory fields: indexer_types"},
      {"pattern length", [](json& j) { j.erase("indexer_types"); j["index_topk_pattern"] = "FSS"; },
       "field 'index_topk_pattern' has 3 entries for 78 layers"},
      {"indexer_types not a list", [](json& j) { j["indexer_types"] = "full"; }, "field 'indexer_types'"},
  };
  for (const auto& c : cases) {
    json j = glm52();
    c.edit(j);
    const std::string err = parse_error(j);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.what << ": got " << err;
    EXPECT_NE(err.find("cfg.json"), std::string::npos) << c.what << ": the error names the file: " << err;
  }
  EXPECT_EQ(parse_error(glm52()), "(parsed)");
}

// ---- kernels against brute-force oracles ----

std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.f) {
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// One sequence, block size 2, a shuffled block table; token t has KV index base + t.
struct Paging {
  int64_t n_ctx, block_size = 2;
  std::vector<int32_t> table, token_seq, kv_index;
  kernels::AttentionParams ap;
  Paging(int64_t n_ctx_, int64_t n_tokens) : n_ctx(n_ctx_) {
    const int64_t n_blocks = (n_ctx + block_size - 1) / block_size;
    for (int64_t b = 0; b < n_blocks; ++b) table.push_back(static_cast<int32_t>((b * 7 + 3) % n_blocks));
    for (int64_t t = 0; t < n_tokens; ++t) {
      token_seq.push_back(0);
      kv_index.push_back(static_cast<int32_t>(n_ctx - n_tokens + t));
    }
    ap.n_tokens = static_cast<int32_t>(n_tokens);
    ap.n_seqs = 1;
    ap.block_size = static_cast<int32_t>(block_size);
    ap.max_blocks_per_seq = static_cast<int32_t>(n_blocks);
  }
  int64_t slot(int64_t j) const { return table[j / block_size] * block_size + j % block_size; }
  int64_t n_slots() const { return static_cast<int64_t>(table.size()) * block_size; }
};

TEST(GlmMoeDsaKernels, IndexerTopkMatchesBruteForce) {
  std::mt19937 rng(3);
  const int64_t NH = 3, D = 8, CTX = 11, T = 5, K = 4;
  Paging pg(CTX, T);
  auto q = randn(T * NH * D, rng), w = randn(T * NH, rng), keys = randn(CTX * D, rng);
  std::vector<float> cache(pg.n_slots() * D);
  for (int64_t j = 0; j < CTX; ++j) std::copy_n(&keys[j * D], D, &cache[pg.slot(j) * D]);
  kernels::IndexerParams p{static_cast<int32_t>(NH), static_cast<int32_t>(D), static_cast<int32_t>(K), 0.3f, 0.7f};
  std::vector<int32_t> topk(T * K);
  kernels::cpu::indexer_topk_f32(q.data(), w.data(), cache.data(), pg.token_seq.data(), pg.kv_index.data(),
                                 pg.table.data(), topk.data(), p, pg.ap);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = pg.kv_index[t] + 1;
    std::vector<std::pair<double, int>> s;
    for (int64_t j = 0; j < n; ++j) {
      double score = 0;
      for (int64_t h = 0; h < NH; ++h) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += double(q[(t * NH + h) * D + d]) * keys[j * D + d];
        score += double(w[t * NH + h]) * 0.7 * std::max(dot * 0.3, 0.0);
      }
      s.emplace_back(-score, static_cast<int>(j));
    }
    std::sort(s.begin(), s.end());
    std::vector<int32_t> want;
    for (int64_t i = 0; i < std::min<int64_t>(K, n); ++i) want.push_back(s[i].second);
    std::sort(want.begin(), want.end());
    std::vector<int32_t> got(topk.begin() + t * K, topk.begin() + t * K + static_cast<int64_t>(want.size()));
    EXPECT_EQ(got, want) << "token " << t;
  }
  // Fewer visible keys than K: every causal key, -1 padded.
  Paging short_pg(3, 2);
  std::vector<int32_t> t2(2 * K);
  kernels::cpu::indexer_topk_f32(q.data(), w.data(), cache.data(), short_pg.token_seq.data(),
                                 short_pg.kv_index.data(), short_pg.table.data(), t2.data(), p, short_pg.ap);
  EXPECT_EQ(t2, (std::vector<int32_t>{0, 1, -1, -1, 0, 1, 2, -1}));
}

TEST(GlmMoeDsaKernels, AbsorbedMlaMatchesExpandedAttention) {
  std::mt19937 rng(5);
  const int64_t NH = 2, NOPE = 6, ROPE = 4, V = 5, L = 7, CTX = 9, T = 3;
  Paging pg(CTX, T);
  auto q = randn(T * NH * (NOPE + ROPE), rng), kvb = randn(NH * (NOPE + V) * L, rng, 0.5f);
  auto rows = randn(CTX * (L + ROPE), rng);
  std::vector<float> cache(pg.n_slots() * (L + ROPE));
  for (int64_t j = 0; j < CTX; ++j) std::copy_n(&rows[j * (L + ROPE)], L + ROPE, &cache[pg.slot(j) * (L + ROPE)]);
  const int64_t K = 4;
  std::vector<int32_t> topk = {0, 2, 5, 6, /**/ 1, 7, -1, -1, /**/ 0, 3, 4, 8};
  kernels::MlaParams p{static_cast<int32_t>(NH), static_cast<int32_t>(NOPE), static_cast<int32_t>(ROPE),
                       static_cast<int32_t>(V),  static_cast<int32_t>(L),    0.37f};
  for (bool sparse : {false, true}) {
    std::vector<float> out(T * NH * V);
    kernels::cpu::mla_attention_f32(q.data(), cache.data(), kvb.data(), sparse ? topk.data() : nullptr, K,
                                    pg.token_seq.data(), pg.kv_index.data(), pg.table.data(), out.data(), p, pg.ap);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < NH; ++h) {
        // Expanded (transformers') form: k = [W_uk c_j | rope_j], v = W_uv c_j, softmax over the key set.
        std::vector<int64_t> keys;
        for (int64_t j = 0; j <= pg.kv_index[t]; ++j) {
          if (!sparse) keys.push_back(j);
          else if (std::count(topk.begin() + t * K, topk.begin() + (t + 1) * K, j)) keys.push_back(j);
        }
        std::vector<double> sc, vsum(V, 0.0);
        double mx = -1e300, den = 0;
        for (int64_t j : keys) {
          const float* c = &rows[j * (L + ROPE)];
          double dot = 0;
          for (int64_t d = 0; d < NOPE; ++d) {
            double k = 0;
            for (int64_t i = 0; i < L; ++i) k += double(kvb[(h * (NOPE + V) + d) * L + i]) * c[i];
            dot += double(q[(t * NH + h) * (NOPE + ROPE) + d]) * k;
          }
          for (int64_t r = 0; r < ROPE; ++r) dot += double(q[(t * NH + h) * (NOPE + ROPE) + NOPE + r]) * c[L + r];
          sc.push_back(dot * 0.37);
          mx = std::max(mx, sc.back());
        }
        for (size_t i = 0; i < keys.size(); ++i) {
          const double e = std::exp(sc[i] - mx);
          den += e;
          const float* c = &rows[keys[i] * (L + ROPE)];
          for (int64_t v = 0; v < V; ++v) {
            double val = 0;
            for (int64_t k = 0; k < L; ++k) val += double(kvb[(h * (NOPE + V) + NOPE + v) * L + k]) * c[k];
            vsum[v] += e * val;
          }
        }
        for (int64_t v = 0; v < V; ++v)
          EXPECT_NEAR(out[(t * NH + h) * V + v], vsum[v] / den, 1e-4) << "sparse " << sparse << " t " << t << " h " << h;
      }
  }
}

TEST(GlmMoeDsaKernels, InterleavedRopeRotatesAdjacentPairs) {
  // One head, stride 6, rope on dims [2, 6): pairs (2,3) and (4,5) with inv_freq 1 and theta^-0.5.
  std::vector<float> x = {1, 2, 1, 0, 0, 1};
  const int32_t pos = 3;
  kernels::InterleavedRopeParams p{1, 6, 2, 4, 100.f};
  kernels::cpu::rope_interleaved_f32(x.data(), &pos, 1, p);
  EXPECT_FLOAT_EQ(x[0], 1);
  EXPECT_FLOAT_EQ(x[1], 2);
  EXPECT_NEAR(x[2], std::cos(3.f), 1e-6);
  EXPECT_NEAR(x[3], std::sin(3.f), 1e-6);
  EXPECT_NEAR(x[4], -std::sin(0.3f), 1e-6);
  EXPECT_NEAR(x[5], std::cos(0.3f), 1e-6);
}

// ---- a tiny random checkpoint written by the test ----

json tiny_config(int64_t index_topk) {
  return json{{"architectures", {"GlmMoeDsaForCausalLM"}}, {"model_type", "glm_moe_dsa"},
              {"vocab_size", 96}, {"hidden_size", 32}, {"intermediate_size", 48}, {"moe_intermediate_size", 16},
              {"num_hidden_layers", 3}, {"num_attention_heads", 2}, {"num_key_value_heads", 2}, {"head_dim", 8},
              {"q_lora_rank", 24}, {"kv_lora_rank", 16}, {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 8},
              {"v_head_dim", 12}, {"index_topk", index_topk}, {"index_head_dim", 12}, {"index_n_heads", 2},
              {"indexer_types", {"full", "shared", "full"}}, {"mlp_layer_types", {"dense", "sparse", "sparse"}},
              {"first_k_dense_replace", 1}, {"n_routed_experts", 4}, {"num_experts_per_tok", 2}, {"n_group", 1},
              {"topk_group", 1}, {"n_shared_experts", 1}, {"norm_topk_prob", true}, {"routed_scaling_factor", 2.5},
              {"rms_norm_eps", 1e-5}, {"rope_parameters", {{"rope_theta", 10000.0}, {"rope_type", "default"}}},
              {"num_nextn_predict_layers", 1}, {"tie_word_embeddings", false}, {"dtype", "float32"}};
}

// Every directory the tests write, removed when the test program ends.
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

// Writes config.json + model.safetensors (every declared weight, random, f32) into a fresh directory;
// `drop` names a tensor to leave out, `extra` tensors are added.
fs::path write_checkpoint(const std::string& tag, const json& cfg_json, const std::string& drop = "",
                          io::NamedTensors extra = {}) {
  const fs::path dir = fs::temp_directory_path() / ("mxserve_glm_moe_dsa_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  temp_dirs().push_back(dir);
  std::ofstream(dir / "config.json") << cfg_json.dump(2);
  auto cfg = load_model_config(dir.string());
  EXPECT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  std::mt19937 rng(11);
  io::NamedTensors tensors;
  for (const WeightSpec& w : glm_moe_dsa_weight_table(*cfg, /*include_mtp=*/true)) {
    if (w.name == drop) continue;
    Tensor t = Tensor::empty(DType::kF32, w.shape);
    float* v = t.data<float>();
    const bool is_norm = w.name.find("norm.weight") != std::string::npos ||
                         w.name.find("layernorm") != std::string::npos || w.name.find("enorm") != std::string::npos;
    float sd = 0.15f;
    if (w.name.find("embed") != std::string::npos || w.name.find("lm_head") != std::string::npos) sd = 0.5f;
    if (w.name.find("indexer") != std::string::npos) sd = 0.3f;
    if (w.name.find("mlp.gate.weight") != std::string::npos) sd = 0.4f;
    auto vals = randn(static_cast<size_t>(t.numel()), rng, sd);
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = is_norm ? 1.f + vals[i] : vals[i];
    tensors.emplace_back(w.name, std::move(t));
  }
  for (auto& t : extra) tensors.push_back(std::move(t));
  EXPECT_TRUE(io::write_safetensors((dir / "model.safetensors").string(), tensors).is_ok());
  return dir;
}

struct Tiny {
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  std::unique_ptr<CausalLM> lm;
  explicit Tiny(const fs::path& dir) {
    auto m = load_causal_lm(dir.string(), *be, LoadOptions{});
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    if (m.is_ok()) lm = std::move(*m);
  }
};

// Teacher-forced logits of every row, prefilled in chunks of `chunk` through a cache of `block_size`.
std::vector<float> logits(Tiny& m, const std::vector<int32_t>& ids, int64_t chunk, int64_t block_size) {
  runtime::SequenceRunner runner(*m.lm, *m.be, 64 / block_size * 4, block_size);
  runtime::SequenceState seq;
  std::vector<float> out;
  for (size_t b = 0; b < ids.size(); b += chunk) {
    const size_t e = std::min(ids.size(), b + chunk);
    auto step = runner.extend({&seq}, {std::vector<int32_t>(ids.begin() + b, ids.begin() + e)}, true, false);
    EXPECT_TRUE(step.is_ok()) << step.status().to_string();
    const float* p = step->logits.data<float>();
    out.insert(out.end(), p, p + step->logits.numel());
  }
  runner.release(seq);
  return out;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

const std::vector<int32_t> kPrompt = {3, 17, 42, 8, 8, 91, 5, 60, 33, 2, 77, 14, 29, 50, 11, 64, 7, 38, 21, 90};

TEST(GlmMoeDsaModel, ChunkedPrefillAndBlockSizeOneEqualOnePass) {
  Tiny m(write_checkpoint("chunk", tiny_config(4)));
  ASSERT_TRUE(m.lm);
  const auto one = logits(m, kPrompt, 1000, 4);
  ASSERT_EQ(one.size(), kPrompt.size() * 96);
  EXPECT_LE(rel_l2(logits(m, kPrompt, 3, 4), one), 1e-6);
  EXPECT_LE(rel_l2(logits(m, kPrompt, 1, 1), one), 1e-6);  // pure decode through a block-size-1 cache
  EXPECT_LE(rel_l2(logits(m, kPrompt, 7, 2), one), 1e-6);
}

TEST(GlmMoeDsaModel, SparseSelectionMatters) {
  Tiny sparse(write_checkpoint("sparse", tiny_config(4)));
  Tiny dense(write_checkpoint("dense", tiny_config(64)));  // same weights, top-k covers every key
  ASSERT_TRUE(sparse.lm && dense.lm);
  const auto a = logits(sparse, kPrompt, 1000, 4), b = logits(dense, kPrompt, 1000, 4);
  // Rows 0..3 have at most 4 causal keys: identical; later rows drop keys and must differ.
  const std::vector<float> a4(a.begin(), a.begin() + 4 * 96), b4(b.begin(), b.begin() + 4 * 96);
  EXPECT_LE(rel_l2(a4, b4), 1e-6);
  EXPECT_GT(rel_l2(a, b), 1e-3);
}

// The engine on the tiny model: chunked prefill shorter than the prompts, prefix reuse and preemption must
// give the greedy tokens of one uncached pass per request (SequenceRunner::greedy).
std::vector<std::vector<int32_t>> engine_greedy(Tiny& m, const std::vector<runtime::RequestSpec>& specs,
                                                int64_t n_blocks, bool prefix_cache, int64_t* hits,
                                                int64_t* preemptions) {
  runtime::EngineConfig cfg;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_num_batched_tokens = 32;
  cfg.scheduler.chunked_prefill_size = 5;
  cfg.scheduler.enable_prefix_cache = prefix_cache;
  cfg.n_blocks = n_blocks;
  cfg.max_model_len = 256;
  runtime::Engine engine(cfg, runtime::make_model_executor(*m.lm, *m.be, n_blocks, 4));
  std::map<runtime::RequestId, std::vector<int32_t>> tokens;
  std::vector<runtime::RequestId> order;
  *hits = 0;
  for (const auto& s : specs) {
    auto id = engine.submit(s, [&](const runtime::TokenEvent& ev) {
      if (ev.token >= 0) tokens[ev.id].push_back(ev.token);
      if (ev.finish != runtime::FinishReason::kNone) *hits += ev.usage.cached_tokens;
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    order.push_back(*id);
  }
  while (!engine.idle()) {
    engine.step();
    EXPECT_TRUE(engine.check_invariants().is_ok());
  }
  *preemptions = engine.stats().scheduler.preemptions;
  std::vector<std::vector<int32_t>> out;
  for (auto id : order) out.push_back(tokens[id]);
  return out;
}

TEST(GlmMoeDsaModel, EngineChunkedPrefixReuseAndPreemptionMatchOnePass) {
  Tiny m(write_checkpoint("engine", tiny_config(4)));
  ASSERT_TRUE(m.lm);
  std::vector<runtime::RequestSpec> specs;
  for (int i = 0; i < 4; ++i) {
    runtime::RequestSpec s;
    s.prompt.assign(kPrompt.begin(), kPrompt.begin() + 10 + 2 * i);  // a shared prefix, longer than top-k
    s.prompt.push_back(static_cast<int32_t>(40 + i));
    s.sampling.temperature = 0;
    s.sampling.max_tokens = 6;
    s.sampling.ignore_eos = true;
    specs.push_back(s);
  }
  runtime::SequenceRunner runner(*m.lm, *m.be, 64, 4);
  int64_t hits = 0, preemptions = 0;
  const auto cached = engine_greedy(m, specs, 256, /*prefix_cache=*/true, &hits, &preemptions);
  EXPECT_GT(hits, 0) << "the shared prefix must be served from the cache";
  const auto tight = engine_greedy(m, specs, 7, true, &hits, &preemptions);  // 28 slots for 4 requests
  EXPECT_GT(preemptions, 0);
  for (size_t i = 0; i < specs.size(); ++i) {
    auto ref = runner.greedy(specs[i].prompt, 6, 1000, {});
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    EXPECT_EQ(cached[i], *ref) << "request " << i;
    EXPECT_EQ(tight[i], *ref) << "request " << i << " (preempted run)";
  }
}

TEST(GlmMoeDsaModel, MtpRunsOnItsOwnIndexer) {
  Tiny m(write_checkpoint("mtp", tiny_config(4)));
  ASSERT_TRUE(m.lm && m.lm->has_mtp());
  runtime::SequenceRunner runner(*m.lm, *m.be, 64, 4);
  runtime::SequenceState seq;
  auto step = runner.extend({&seq}, {kPrompt}, false, true);
  ASSERT_TRUE(step.is_ok()) << step.status().to_string();
  Tensor h = step->hidden.slice_rows(0, static_cast<int64_t>(kPrompt.size()) - 1);
  runtime::SequenceState mtp_seq;
  auto mtp = runner.mtp(mtp_seq, std::vector<int32_t>(kPrompt.begin() + 1, kPrompt.end()), h);
  ASSERT_TRUE(mtp.is_ok()) << mtp.status().to_string();
  EXPECT_EQ(mtp->dim(0), static_cast<int64_t>(kPrompt.size()) - 1);
  for (int64_t i = 0; i < mtp->numel(); ++i) ASSERT_TRUE(std::isfinite(mtp->data<float>()[i]));
}

TEST(GlmMoeDsaModel, MissingIndexerTensorOnAFullLayerIsNamed) {
  for (const char* name : {"model.layers.2.self_attn.indexer.wk.weight", "model.layers.0.self_attn.indexer.k_norm.bias",
                           "model.layers.3.self_attn.indexer.weights_proj.weight"}) {
    const fs::path dir = write_checkpoint("missing", tiny_config(4), name);
    auto be = backend::make_cpu_backend();
    auto m = load_causal_lm(dir.string(), *be, LoadOptions{});
    ASSERT_FALSE(m.is_ok()) << name;
    EXPECT_NE(m.status().to_string().find(name), std::string::npos) << m.status().to_string();
  }
}

TEST(GlmMoeDsaModel, IndexerTensorOnASharedLayerIsNamed) {
  // Layer 1 is "shared" in the config but the checkpoint carries an indexer there: config and weights disagree.
  const std::string name = "model.layers.1.self_attn.indexer.wk.weight";
  io::NamedTensors extra;
  extra.emplace_back(name, Tensor::zeros(DType::kF32, {12, 32}));
  const fs::path dir = write_checkpoint("shared_extra", tiny_config(4), "", std::move(extra));
  auto be = backend::make_cpu_backend();
  auto m = load_causal_lm(dir.string(), *be, LoadOptions{});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().to_string().find(name), std::string::npos) << m.status().to_string();
  EXPECT_NE(m.status().to_string().find("unexpected"), std::string::npos) << m.status().to_string();
}

TEST(GlmMoeDsaModel, SharedLayersDeclareNoIndexer) {
  auto cfg = parse_model_config(tiny_config(4), "tiny.json");
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  int64_t indexer_wk = 0;
  for (const WeightSpec& w : glm_moe_dsa_weight_table(*cfg, true)) {
    EXPECT_EQ(w.name.find("model.layers.1.self_attn.indexer"), std::string::npos) << w.name;
    indexer_wk += w.name.find("indexer.wk.weight") != std::string::npos;
  }
  EXPECT_EQ(indexer_wk, 3);  // layers 0, 2 and the MTP layer 3
}

// GLM-5.2's MLA + indexer geometry (q_lora 2048, kv_lora 512, nope 192, rope 64, v 256, 32 x 128 indexer,
// top-k 2048) with the width-heavy parts shrunk so two layers fit a test: 4 heads, hidden 256, vocab 512,
// 8 experts. The real 2-layer GLM-5.2 on CPU needs ~9 GB of f32 (embedding + lm_head alone 7.6 GB).
TEST(GlmMoeDsaModel, Glm52GeometryShrunkLoadsAndRuns) {
  json j = glm52();
  j["hidden_size"] = 256;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 4;
  j["vocab_size"] = 512;
  j["eos_token_id"] = 1;
  j["pad_token_id"] = 0;
  j["intermediate_size"] = 128;
  j["n_routed_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 64;
  for (int64_t l = 1; l < 78; ++l) j["mlp_layer_types"][l] = "sparse";  // layer 1 is MoE in a 2-layer model
  j["first_k_dense_replace"] = 1;
  const fs::path dir = fs::temp_directory_path() / ("mxserve_glm52_shrunk_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  temp_dirs().push_back(dir);
  std::ofstream(dir / "config.json") << j.dump();
  auto be = backend::make_cpu_backend();
  LoadOptions o;
  o.synthetic = true;
  o.seed = 1;
  o.num_layers_override = 2;
  auto m = load_causal_lm(dir.string(), *be, o);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  runtime::SequenceRunner runner(**m, *be, 16, 16);
  auto out = runner.greedy({1, 2, 3, 4, 5, 6, 7, 8}, 3, 4, {});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out->size(), 3u);
}

}  // namespace
}  // namespace mxserve::model
