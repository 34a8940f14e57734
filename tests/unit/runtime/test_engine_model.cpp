// The engine with the real tiny glm4_moe model on the CPU backend: batching, prefix reuse and
// preemption must not change greedy outputs; seeded sampling is reproducible.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "backend/backend.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"
#include "runtime/sequence_runner.h"

namespace mxserve::runtime {
namespace {

const std::string kModel = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_a";

struct Loaded {
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  std::unique_ptr<model::CausalLM> lm;
  Loaded() {
    auto m = model::load_causal_lm(kModel, *be, model::LoadOptions{.load_mtp = false});
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    lm = std::move(*m);
  }
};

Loaded& shared_model() {
  static Loaded loaded;
  return loaded;
}

struct EngineRun {
  std::map<RequestId, std::vector<int32_t>> tokens;
  std::map<RequestId, Usage> usage;
};

EngineRun run_engine(const std::vector<RequestSpec>& specs, int64_t n_blocks, bool prefix_cache, bool all_at_once,
               int64_t block_size = 4, int64_t* preemptions = nullptr) {
  Loaded& m = shared_model();
  EngineConfig cfg;
  cfg.scheduler.block_size = block_size;
  cfg.scheduler.max_num_batched_tokens = 64;
  cfg.scheduler.chunked_prefill_size = 24;
  cfg.scheduler.enable_prefix_cache = prefix_cache;
  cfg.n_blocks = n_blocks;
  cfg.max_model_len = 512;
  Engine engine(cfg, make_model_executor(*m.lm, *m.be, n_blocks, block_size));
  EngineRun run;
  std::vector<RequestId> order;
  auto submit = [&](const RequestSpec& spec) {
    auto id = engine.submit(spec, [&run](const TokenEvent& ev) {
      if (ev.token >= 0) run.tokens[ev.id].push_back(ev.token);
      if (ev.finish != FinishReason::kNone) run.usage[ev.id] = ev.usage;
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    order.push_back(*id);
  };
  if (all_at_once) {
    for (const auto& s : specs) submit(s);
    while (!engine.idle()) {
      engine.step();
      EXPECT_TRUE(engine.check_invariants().is_ok());
    }
  } else {
    for (const auto& s : specs) {
      submit(s);
      while (!engine.idle()) engine.step();
    }
  }
  if (preemptions) *preemptions = engine.stats().scheduler.preemptions;
  // Re-key by submission index so runs can be compared.
  EngineRun by_index;
  for (size_t i = 0; i < order.size(); ++i) {
    by_index.tokens[i] = run.tokens[order[i]];
    by_index.usage[i] = run.usage[order[i]];
  }
  return by_index;
}

std::vector<RequestSpec> greedy_specs() {
  std::vector<RequestSpec> specs;
  const std::vector<int32_t> shared = {5, 17, 99, 3, 250, 41, 7, 7, 300, 12, 64, 1, 2, 3, 4, 5, 6, 8};
  for (int i = 0; i < 6; ++i) {
    RequestSpec s;
    s.prompt.assign(shared.begin(), shared.begin() + 6 + 2 * i);
    for (int k = 0; k <= i; ++k) s.prompt.push_back(static_cast<int32_t>(20 + 13 * i + k));
    s.sampling.temperature = 0;
    s.sampling.max_tokens = 6 + i;
    s.sampling.ignore_eos = true;
    specs.push_back(s);
  }
  return specs;
}

TEST(EngineModel, BatchedEqualsAloneEqualsSequenceRunner) {
  const auto specs = greedy_specs();
  EngineRun alone = run_engine(specs, 512, /*prefix_cache=*/false, /*all_at_once=*/false);
  EngineRun together = run_engine(specs, 512, false, true);
  Loaded& m = shared_model();
  SequenceRunner runner(*m.lm, *m.be, 64, 4);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(alone.tokens[i], together.tokens[i]) << "request " << i;
    auto ref = runner.greedy(specs[i].prompt, specs[i].sampling.max_tokens, 1000, {});
    ASSERT_TRUE(ref.is_ok());
    EXPECT_EQ(alone.tokens[i], *ref) << "request " << i;
  }
}

TEST(EngineModel, PrefixReuseDoesNotChangeOutputs) {
  const auto specs = greedy_specs();
  EngineRun without = run_engine(specs, 512, false, false);
  EngineRun with = run_engine(specs, 512, true, false);
  int64_t hits = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(with.tokens[i], without.tokens[i]) << "request " << i;
    hits += with.usage[i].cached_tokens;
    EXPECT_EQ(without.usage[i].cached_tokens, 0);
  }
  EXPECT_GT(hits, 0) << "the shared prompt prefix must be served from the cache";
}

TEST(EngineModel, PreemptionAndRecomputeGiveIdenticalOutputs) {
  const auto specs = greedy_specs();
  EngineRun ample = run_engine(specs, 512, true, true);
  int64_t preemptions = 0;
  EngineRun tight = run_engine(specs, 12, true, true, 4, &preemptions);  // 48 tokens for 6 requests
  EXPECT_GT(preemptions, 0);
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(tight.tokens[i], ample.tokens[i]) << "request " << i;
}

TEST(EngineModel, SeededSamplingIsReproducibleAcrossBatching) {
  auto specs = greedy_specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].sampling.temperature = 1.0f;
    specs[i].sampling.top_p = 0.9f;
    specs[i].sampling.seed = 1000 + i;
  }
  EngineRun a = run_engine(specs, 512, true, true);
  EngineRun b = run_engine(specs, 512, false, false);
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(a.tokens[i], b.tokens[i]) << "request " << i;
}

}  // namespace
}  // namespace mxserve::runtime

namespace mxserve::runtime {
namespace {

TEST(EngineModel, SyntheticQuantizedExpertsStayCloseToBf16) {
  auto be = backend::make_cpu_backend();
  const std::string cfg = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_a/config.json";
  std::vector<int32_t> prompt = {5, 17, 99, 3, 250, 41, 7, 300, 12, 64, 1, 2};
  auto logits_of = [&](const std::string& scheme) {
    model::LoadOptions o{.load_mtp = false, .synthetic = true, .seed = 11};
    o.synthetic_quantization = scheme;
    auto lm = model::load_causal_lm(cfg, *be, o);
    EXPECT_TRUE(lm.is_ok()) << lm.status().to_string();
    SequenceRunner runner(**lm, *be, 16, 4);
    SequenceState seq;
    auto step = runner.extend({&seq}, {prompt}, true, false);
    EXPECT_TRUE(step.is_ok());
    return step->logits;
  };
  Tensor ref = logits_of("");
  for (const char* scheme : {"mxfp4", "fp8-block", "mxfp4:fp8-block"}) {
    Tensor q = logits_of(scheme);
    double num = 0, den = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
      const double d = q.data<float>()[i] - ref.data<float>()[i];
      num += d * d;
      den += static_cast<double>(ref.data<float>()[i]) * ref.data<float>()[i];
    }
    const double rel = std::sqrt(num / den);
    EXPECT_GT(rel, 0.0) << scheme << ": quantization must change something";
    EXPECT_LT(rel, 0.12) << scheme;
  }
}

}  // namespace
}  // namespace mxserve::runtime
