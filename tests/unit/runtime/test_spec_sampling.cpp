// Speculative decoding under every sampling option, at the engine level, on the oracle model with a noisy
// draft (often, not always, right: drafts are accepted and rejected): for each option (temperature, top-k,
// top-p, min-p, presence / frequency / repetition penalties, logit bias, all together) and each mode (chain,
// tree), the joint distribution of the first three generated tokens equals the plain sampler's (chi-square
// against the exact distribution), seeded requests give the very tokens of plain decoding, greedy ones with
// penalties too, and every reported logprob / top_logprobs is the raw log-softmax of the target row.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "oracle_mtp_model.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace mxserve::runtime {
namespace {

constexpr int64_t kVocab = 5;
constexpr float kScale = 3.f;       // logits in [0, 3): probabilities within a factor e^3
constexpr float kNoise = 1.5f;      // draft logits = target logits + up to 1.5 of noise
constexpr int32_t kTokens = 3;

struct Shape {
  int32_t steps, topk, draft_tokens;
  std::string name() const { return "S=" + std::to_string(steps) + " k=" + std::to_string(topk); }
};
const Shape kPlain{0, 1, 0}, kChain{2, 1, 0}, kTree{2, 2, 5};

struct Event {
  int32_t token;
  float logprob;
  std::vector<TopLogprob> top;
};

struct EngineRun {
  std::vector<std::vector<Event>> events;
  EngineStats stats;
};

EngineRun run_engine(const std::vector<RequestSpec>& specs, const Shape& sh) {
  EngineConfig cfg;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_running = 128;
  cfg.max_waiting = 100000;
  cfg.n_blocks = 1024;
  cfg.max_model_len = 64;
  cfg.spec.num_steps = sh.steps;
  cfg.spec.adaptive = false;
  cfg.spec.topk = sh.topk;
  cfg.spec.num_draft_tokens = sh.draft_tokens;
  Engine engine(cfg, std::make_unique<testing::OracleMtpModel>(cfg.n_blocks, 4, kVocab, kScale, kNoise));
  EngineRun run;
  run.events.resize(specs.size());
  std::map<RequestId, size_t> which;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto id = engine.submit(specs[i], [&run, &which](const TokenEvent& ev) {
      EXPECT_NE(ev.finish, FinishReason::kError) << ev.error;
      if (ev.token >= 0) run.events[which.at(ev.id)].push_back({ev.token, ev.logprob, ev.top_logprobs});
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    if (!id.is_ok()) return run;
    which[*id] = i;
  }
  while (!engine.idle()) engine.step();
  run.stats = engine.stats();
  return run;
}

struct Option {
  std::string name;
  std::function<void(SamplingParams&)> set;
};

const std::vector<Option>& options() {
  static const std::vector<Option> all = {
      {"temperature", [](SamplingParams& p) { p.temperature = 1.0f; }},
      {"temperature+top_k", [](SamplingParams& p) { p.temperature = 0.5f, p.top_k = 3; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.6f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 0.4f; }},
      {"presence+frequency", [](SamplingParams& p) { p.presence_penalty = 0.7f, p.frequency_penalty = 0.5f; }},
      {"repetition", [](SamplingParams& p) { p.repetition_penalty = 1.8f; }},
      {"logit_bias", [](SamplingParams& p) { p.logit_bias = {{1, 1.5f}, {3, -1.0f}}; }},
      {"all", [](SamplingParams& p) {
         p.temperature = 0.8f, p.top_k = 4, p.top_p = 0.9f, p.min_p = 0.1f, p.presence_penalty = 0.3f;
         p.frequency_penalty = 0.4f, p.repetition_penalty = 1.2f, p.logit_bias = {{2, 0.7f}};
       }},
  };
  return all;
}

RequestSpec request(const Option& o, std::optional<uint64_t> seed, int32_t logprobs = -1) {
  RequestSpec rs;
  rs.prompt = {4, 1, 4};  // two of the five tokens: the repetition penalty depends on the output too
  rs.sampling.max_tokens = kTokens;
  rs.sampling.ignore_eos = true;
  rs.sampling.seed = seed;
  rs.sampling.logprobs = logprobs;
  o.set(rs.sampling);
  return rs;
}

// The plain sampler's distribution of the next token after `generated`.
TokenDistribution target(const RequestSpec& rs, const std::vector<int32_t>& generated) {
  std::vector<int32_t> ctx = rs.prompt;
  ctx.insert(ctx.end(), generated.begin(), generated.end());
  std::vector<float> l = testing::oracle_logits(ctx, kVocab, kScale);
  process_logits(l, rs.sampling, TokenContext{rs.prompt, generated});
  return sampling_distribution(l, rs.sampling);
}

// Chi-square of the joint distribution of the first kTokens tokens against the exact one; cells expecting
// fewer than 5 draws are pooled. Returns (statistic, critical value at p = 1e-5 by Wilson-Hilferty).
std::pair<double, double> joint_chi_square(const RequestSpec& rs, const EngineRun& run) {
  std::map<std::vector<int32_t>, int> counts;
  for (const auto& ev : run.events) {
    std::vector<int32_t> key;
    for (const Event& e : ev) key.push_back(e.token);
    ++counts[key];
  }
  const double n = static_cast<double>(run.events.size());
  std::map<std::vector<int32_t>, double> exact;
  std::function<void(std::vector<int32_t>, double)> expand = [&](std::vector<int32_t> prefix, double p) {
    if (static_cast<int32_t>(prefix.size()) == kTokens) {
      exact[prefix] = p;
      return;
    }
    const TokenDistribution d = target(rs, prefix);
    for (size_t i = 0; i < d.ids.size(); ++i) {
      auto next = prefix;
      next.push_back(d.ids[i]);
      expand(next, p * d.probs[i]);
    }
  };
  expand({}, 1.0);
  double chi = 0, pooled_e = 0, pooled_o = 0;
  int cells = 0;
  for (const auto& [key, p] : exact) {
    const double e = n * p, o = counts.count(key) ? counts.at(key) : 0;
    if (e < 5) {
      pooled_e += e;
      pooled_o += o;
      continue;
    }
    chi += (o - e) * (o - e) / e;
    ++cells;
  }
  for (const auto& [key, c] : counts)
    EXPECT_TRUE(exact.count(key)) << "a token sequence the target can never produce was sampled";
  if (pooled_e > 0) {
    chi += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1.0);
    ++cells;
  }
  const double df = cells - 1, z = 4.26;
  const double crit = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
  return {chi, crit};
}

TEST(SpecSampling, EveryOptionKeepsTheTargetDistributionChainAndTree) {
  const int n = 4000;
  for (const Option& o : options()) {
    for (const Shape& sh : {kChain, kTree}) {
      for (bool seeded : {false, true}) {
        std::vector<RequestSpec> specs;
        for (int i = 0; i < n; ++i)
          specs.push_back(request(o, seeded ? std::optional<uint64_t>(1000 + i) : std::nullopt));
        const EngineRun run = run_engine(specs, sh);
        const std::string what = o.name + " " + sh.name() + (seeded ? " seeded" : " unseeded");
        EXPECT_GT(run.stats.spec.num_accepted_tokens, 0) << what;
        EXPECT_LT(run.stats.spec.num_accepted_tokens, run.stats.spec.num_draft_tokens) << what;
        const auto [chi, crit] = joint_chi_square(specs[0], run);
        EXPECT_LT(chi, crit) << what << ": the joint distribution of the first " << kTokens
                             << " tokens differs from the target's";
        std::printf("%-20s %-9s %-8s chi2 %7.1f (critical %6.1f), accepted %lld of %lld drafts\n", o.name.c_str(),
                    sh.name().c_str(), seeded ? "seeded" : "unseeded", chi, crit,
                    static_cast<long long>(run.stats.spec.num_accepted_tokens),
                    static_cast<long long>(run.stats.spec.num_draft_tokens));
      }
    }
  }
}

TEST(SpecSampling, SeededAndGreedyRequestsGiveThePlainTokens) {
  for (const Option& o : options()) {
    std::vector<RequestSpec> specs;
    for (int i = 0; i < 200; ++i) {
      RequestSpec rs = request(o, 7 * i + 1);
      rs.sampling.max_tokens = 12;
      if (i % 4 == 0) rs.sampling.temperature = 0;  // greedy, with the option's penalties / bias
      specs.push_back(rs);
    }
    const EngineRun plain = run_engine(specs, kPlain);
    for (const Shape& sh : {kChain, kTree}) {
      const EngineRun sp = run_engine(specs, sh);
      EXPECT_GT(sp.stats.spec.num_accepted_tokens, 0) << o.name << " " << sh.name();
      for (size_t i = 0; i < specs.size(); ++i) {
        ASSERT_EQ(sp.events[i].size(), plain.events[i].size()) << o.name << " " << sh.name() << " request " << i;
        for (size_t t = 0; t < plain.events[i].size(); ++t)
          ASSERT_EQ(sp.events[i][t].token, plain.events[i][t].token)
              << o.name << " " << sh.name() << " request " << i << " token " << t;
      }
    }
  }
}

TEST(SpecSampling, LogprobsAreTheTargetRowsRawLogSoftmax) {
  for (const Shape& sh : {kPlain, kChain, kTree}) {
    std::vector<RequestSpec> specs;
    for (int i = 0; i < 64; ++i) {
      RequestSpec rs = request(options()[i % options().size()], std::nullopt, i % 3);
      rs.sampling.max_tokens = 10;
      if (i % 5 == 0) rs.sampling.temperature = 0;
      specs.push_back(rs);
    }
    const EngineRun run = run_engine(specs, sh);
    for (size_t i = 0; i < specs.size(); ++i) {
      std::vector<int32_t> ctx = specs[i].prompt;
      for (size_t t = 0; t < run.events[i].size(); ++t) {
        const Event& e = run.events[i][t];
        const std::vector<float> raw = testing::oracle_logits(ctx, kVocab, kScale);
        float want = 0;
        std::vector<TopLogprob> top;
        raw_logprobs(raw, e.token, specs[i].sampling.logprobs, &want, &top);
        const std::string what = sh.name() + " request " + std::to_string(i) + " token " + std::to_string(t);
        EXPECT_NEAR(e.logprob, want, 1e-5) << what;
        ASSERT_EQ(e.top.size(), top.size()) << what;
        for (size_t k = 0; k < top.size(); ++k) {
          EXPECT_EQ(e.top[k].token, top[k].token) << what;
          EXPECT_NEAR(e.top[k].logprob, top[k].logprob, 1e-5) << what;
        }
        ctx.push_back(e.token);
      }
    }
  }
}

}  // namespace
}  // namespace mxserve::runtime
