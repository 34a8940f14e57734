// Device-side sampling through the engine (ModelExecutor::sample -> Backend::sample_rows) on the CPU
// backend with the real tiny glm4_moe model: sampled, seeded requests give exactly the tokens and logprobs
// of the host sampler path (EngineConfig::device_sampling = false), the executor is never asked for host
// logits for them, a seeded request draws the same tokens alone and batched, and a NaN row ends only its
// request with an error naming the token. Also: the op's CPU reference equals runtime::sample_token.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "backend/backend.h"
#include "fake_model.h"
#include "forwarding_executor.h"
#include "kernels/cpu/sampling.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace mxserve::runtime {
namespace {

const std::string kModel = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_a";

struct Loaded {
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  std::unique_ptr<model::CausalLM> lm;
  Loaded() {
    model::LoadOptions options;
    options.load_mtp = false;
    auto m = model::load_causal_lm(kModel, *be, options);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    lm = std::move(*m);
  }
};

Loaded& shared_model() {
  static Loaded loaded;
  return loaded;
}

// Forwards to an executor and records what the engine asked of it.
class RecordingExecutor final : public ForwardingExecutor {
 public:
  explicit RecordingExecutor(std::unique_ptr<ModelExecutor> inner, bool poison_nan = false)
      : ForwardingExecutor(std::move(inner)), poison_nan_(poison_nan) {}
  Result<ExecOutput> execute(const model::ForwardBatch& batch) override {
    ++executes;
    host_logit_steps += batch.want_host_logits;
    MX_ASSIGN_OR_RETURN(ExecOutput out, inner_->execute(batch));
    if (poison_nan_ && out.logits.ndim() == 2)  // token 7 of every row
      for (int64_t r = 0; r < out.logits.dim(0); ++r) out.logits.data<float>()[r * out.logits.dim(1) + 7] = NAN;
    return out;
  }
  Result<std::vector<kernels::SampledRow>> sample(const ExecOutput& out, const kernels::SampleRowsInput& in) override {
    ++sample_calls;
    sampled_rows += static_cast<int64_t>(in.rows.size());
    penalty_entries += static_cast<int64_t>(in.penalties.size());
    return inner_->sample(out, in);
  }
  int64_t executes = 0, host_logit_steps = 0, sample_calls = 0, sampled_rows = 0, penalty_entries = 0;

 private:
  bool poison_nan_;
};

struct EngineRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
  std::vector<std::vector<std::vector<TopLogprob>>> tops;
  std::vector<std::string> errors;
  int64_t executes = 0, host_logit_steps = 0, sample_calls = 0, sampled_rows = 0, penalty_entries = 0;
};

EngineRun run_engine(const std::vector<RequestSpec>& specs, bool device_sampling, std::unique_ptr<ModelExecutor> inner = nullptr,
        bool poison_nan = false) {
  Loaded& m = shared_model();
  EngineConfig cfg;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_num_batched_tokens = 64;
  cfg.scheduler.chunked_prefill_size = 24;
  cfg.n_blocks = 256;
  cfg.max_model_len = 512;
  cfg.device_sampling = device_sampling;
  if (!inner) inner = make_model_executor(*m.lm, *m.be, cfg.n_blocks, cfg.scheduler.block_size);
  auto rec = std::make_unique<RecordingExecutor>(std::move(inner), poison_nan);
  RecordingExecutor* recp = rec.get();
  Engine engine(cfg, std::move(rec));
  EngineRun r;
  r.tokens.resize(specs.size());
  r.logprobs.resize(specs.size());
  r.tops.resize(specs.size());
  r.errors.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    auto id = engine.submit(specs[i], [&r, i](const TokenEvent& ev) {
      if (ev.token >= 0) {
        r.tokens[i].push_back(ev.token);
        r.logprobs[i].push_back(ev.logprob);
        r.tops[i].push_back(ev.top_logprobs);
      }
      if (ev.finish == FinishReason::kError) r.errors[i] = ev.error;
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
  }
  while (!engine.idle()) engine.step();
  r.executes = recp->executes;
  r.host_logit_steps = recp->host_logit_steps;
  r.sample_calls = recp->sample_calls;
  r.sampled_rows = recp->sampled_rows;
  r.penalty_entries = recp->penalty_entries;
  return r;
}

std::vector<int32_t> prompt(int32_t n, int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t j = 0; j < n; ++j) p.push_back((j * 37 + salt * 11 + 5) % 200 + 3);
  return p;
}

// The parameter sets the issue names: temperatures, top-k, top-p, min-p, penalties, bias, logprobs.
std::vector<RequestSpec> varied_specs() {
  std::vector<RequestSpec> specs(7);
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].prompt = prompt(9 + 3 * static_cast<int32_t>(i), static_cast<int32_t>(i));
    specs[i].sampling.max_tokens = 12;
    specs[i].sampling.seed = 500 + i;
    specs[i].sampling.ignore_eos = true;
  }
  specs[0].sampling.temperature = 0.7f;
  specs[1].sampling.temperature = 1.0f;
  specs[1].sampling.top_k = 50;
  specs[2].sampling.temperature = 1.5f;
  specs[2].sampling.top_p = 0.9f;
  specs[3].sampling.temperature = 1.0f;
  specs[3].sampling.min_p = 0.05f;
  specs[4].sampling.temperature = 1.2f;
  specs[4].sampling.repetition_penalty = 1.3f;
  specs[4].sampling.presence_penalty = 0.5f;
  specs[4].sampling.frequency_penalty = 0.3f;
  specs[4].sampling.logit_bias = {{17, 3.f}, {17, -1.f}, {90, 5.f}};
  specs[5].sampling.temperature = 0.8f;
  specs[5].sampling.top_k = 20;
  specs[5].sampling.top_p = 0.8f;
  specs[5].sampling.logprobs = 3;
  specs[6].sampling.temperature = 0.f;  // greedy with processing: sampled by the op too
  specs[6].sampling.repetition_penalty = 1.5f;
  specs[6].sampling.logprobs = 0;
  return specs;
}

TEST(EngineDeviceSampling, SameTokensAndLogprobsAsTheHostSampler) {
  const auto specs = varied_specs();
  const EngineRun host = run_engine(specs, false);
  const EngineRun dev = run_engine(specs, true);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(dev.tokens[i], host.tokens[i]) << "request " << i;
    EXPECT_EQ(dev.logprobs[i], host.logprobs[i]) << "request " << i;
    ASSERT_EQ(dev.tops[i].size(), host.tops[i].size());
    for (size_t t = 0; t < dev.tops[i].size(); ++t) {
      ASSERT_EQ(dev.tops[i][t].size(), host.tops[i][t].size());
      for (size_t j = 0; j < dev.tops[i][t].size(); ++j) {
        EXPECT_EQ(dev.tops[i][t][j].token, host.tops[i][t][j].token);
        EXPECT_EQ(dev.tops[i][t][j].logprob, host.tops[i][t][j].logprob);
      }
    }
    EXPECT_EQ(dev.tokens[i].size(), 12u);
    EXPECT_TRUE(dev.errors[i].empty()) << dev.errors[i];
  }
  EXPECT_EQ(dev.tops[5][0].size(), 3u);
  // Every token came from the device sampler; no step asked for host logits.
  EXPECT_EQ(dev.host_logit_steps, 0);
  EXPECT_EQ(dev.sampled_rows, static_cast<int64_t>(specs.size()) * 12);
  EXPECT_GT(dev.penalty_entries, 0);
  EXPECT_GT(host.host_logit_steps, 0);
  EXPECT_EQ(host.sample_calls, 0);
}

TEST(EngineDeviceSampling, SeededTokensDoNotDependOnTheBatch) {
  const auto specs = varied_specs();
  const EngineRun batched = run_engine(specs, true);
  for (size_t i : {0u, 4u, 5u}) {
    const EngineRun alone = run_engine({specs[i]}, true);
    EXPECT_EQ(alone.tokens[0], batched.tokens[i]) << "request " << i;
    // The model's logits themselves round differently in another batch (CPU GEMM blocking): near, not equal.
    ASSERT_EQ(alone.logprobs[0].size(), batched.logprobs[i].size());
    for (size_t t = 0; t < alone.logprobs[0].size(); ++t)
      EXPECT_NEAR(alone.logprobs[0][t], batched.logprobs[i][t], 1e-4) << "request " << i << " token " << t;
  }
}

TEST(EngineDeviceSampling, UnpenalizedRowsUploadNoPenaltyTokens) {
  auto specs = varied_specs();
  specs.erase(specs.begin() + 4);  // the only rows with penalties
  specs.pop_back();
  const EngineRun dev = run_engine(specs, true);
  EXPECT_EQ(dev.penalty_entries, 0);
  EXPECT_GT(dev.sampled_rows, 0);
}

TEST(EngineDeviceSampling, NanRowEndsOnlyItsRequestNamingTheToken) {
  auto specs = varied_specs();
  specs.resize(2);
  const EngineRun dev = run_engine(specs, true, std::make_unique<testing::FakeModel>(256, 4, 300), /*poison_nan=*/true);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE(dev.tokens[i].empty());
    EXPECT_NE(dev.errors[i].find("NaN logit (token id 7 of 300)"), std::string::npos) << dev.errors[i];
  }
}

// The op's CPU reference (the CPU backend's sample_rows) against runtime::sample_token, row by row.
TEST(SampleRowsReference, EqualsTheHostSampler) {
  const int64_t V = 3000, R = 6;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> logits(R * V);
  for (float& x : logits) x = nd(rng);
  for (int64_t v = 0; v < V; v += 7) logits[2 * V + v] = 1.25f;  // ties
  const std::vector<int32_t> prompt_tokens = {5, 9, 9, 100, 2999};
  const std::vector<int32_t> generated = {9, 42, 42, 42, 7};
  const TokenContext ctx{prompt_tokens, generated};
  std::vector<SamplingParams> ps(R);
  ps[0].temperature = 0.7f;
  ps[1].top_k = 50;
  ps[2].temperature = 1.5f;
  ps[2].top_p = 0.9f;
  ps[3].min_p = 0.05f;
  ps[3].logprobs = 5;
  ps[4].repetition_penalty = 1.3f;
  ps[4].presence_penalty = 0.4f;
  ps[4].frequency_penalty = 0.2f;
  ps[4].logit_bias = {{42, 2.f}, {5, -100.f}};
  ps[4].logprobs = 2;
  ps[5].temperature = 0.f;
  ps[5].frequency_penalty = 1.f;
  auto be = backend::make_cpu_backend();
  Tensor t = Tensor::view_of(logits.data(), DType::kF32, {R, V});
  for (uint64_t step = 0; step < 40; ++step) {
    kernels::SampleRowsInput in;
    for (int64_t r = 0; r < R; ++r) {
      kernels::SampleRowParams row = sample_row_params(ps[r], 77 + r, step, static_cast<int32_t>(R - 1 - r));
      append_row_processing(ps[r], ctx, &row, &in);
      in.rows.push_back(row);
    }
    const auto got = be->sample_rows(t, in);
    ASSERT_EQ(got.size(), static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) {
      std::vector<float> row(logits.begin() + (R - 1 - r) * V, logits.begin() + (R - r) * V);
      auto want = sample_token(row, ps[r], 77 + r, step, ctx);
      ASSERT_TRUE(want.is_ok());
      ASSERT_EQ(got[r].error, kernels::kSampleOk);
      EXPECT_EQ(got[r].token, want->token) << "row " << r << " step " << step;
      EXPECT_EQ(got[r].logprob, want->logprob);
      ASSERT_EQ(got[r].top.size(), want->top_logprobs.size());
      for (size_t j = 0; j < got[r].top.size(); ++j) EXPECT_EQ(got[r].top[j].first, want->top_logprobs[j].token);
    }
  }
}

TEST(SampleRowsReference, ErrorsAreCodesNotCrashes) {
  const int64_t V = 10;
  std::vector<float> logits(2 * V, 0.f);
  logits[3] = NAN;
  for (int64_t v = 0; v < V; ++v) logits[V + v] = -INFINITY;
  auto be = backend::make_cpu_backend();
  kernels::SampleRowsInput in;
  in.rows.resize(3);
  in.rows[0].logit_row = 0;
  in.rows[1].logit_row = 1;
  in.rows[2].logit_row = 5;  // outside the logits
  const auto got = be->sample_rows(Tensor::view_of(logits.data(), DType::kF32, {2, V}), in);
  EXPECT_EQ(got[0].error, kernels::kSampleNanLogit);
  EXPECT_EQ(got[0].error_token, 3);
  EXPECT_EQ(got[1].error, kernels::kSampleNoAllowedToken);
  EXPECT_EQ(got[2].error, kernels::kSampleBadRow);
  EXPECT_NE(kernels::cpu::sample_error_status(got[0].error, got[0].error_token, V).to_string().find("token id 3"),
            std::string::npos);
}

}  // namespace
}  // namespace mxserve::runtime
