// Sampling inside the decode graphs (runtime/graph_sampler.h), its host side on the CPU:
//   - slot staging: the sampled rows in the first slots, rows with bias / penalties first (the scratch rows),
//     every other slot (padding included) skipped; a step the tail cannot take (top logprobs past the cap,
//     entries or processed rows past the buffers, a row outside the step) stages nothing and says why;
//   - the tail output layout and its unpacking (tokens, logprobs, error codes, top logprobs);
//   - the tail's claim that a slot only relocates a row: the CPU reference sampler over the staged slots
//     gives, at each row's slot, exactly what it gives over the step's rows, and skipped slots no token;
//   - the engine path (ModelExecutor::execute_and_sample): an executor that samples "inside the forward" by
//     emulating the tail (staged slots -> the reference sampler -> the packed output -> unpack) gives the same
//     tokens, logprobs and top logprobs as sample() after the forward, on the tiny CPU model, and the engine
//     then never calls sample(); steps it declines take the usual path.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "backend/backend.h"
#include "forwarding_executor.h"
#include "kernels/cpu/sampling.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"
#include "runtime/graph_sampler.h"
#include "runtime/sampler.h"

namespace mxserve::runtime {
namespace {

kernels::SampleRowParams row_at(int32_t logit_row, float temperature = 0.8f, int32_t n_top = -1) {
  kernels::SampleRowParams r;
  r.logit_row = logit_row;
  r.temperature = temperature;
  r.n_top = n_top;
  r.seed = 1234 + logit_row;
  r.step = 7;
  return r;
}

TEST(GraphSampler, StagesRowsInTheFirstSlotsProcessedFirstAndSkipsTheRest) {
  kernels::SampleRowsInput in;
  in.rows = {row_at(3), row_at(0, 0.f, 2), row_at(4, 1.2f)};
  in.biases = {{4, 2.f}};
  in.rows[1].bias_count = 1;
  in.penalties = {{5, 1, 0}, {9, 0, 1}};
  in.rows[2].penalty_count = 2;
  const GraphSamplerCaps caps = GraphSamplerCaps::for_rows(8);
  std::vector<kernels::SampleRowParams> slots;
  std::vector<int32_t> slot_of;
  ASSERT_EQ(stage_graph_sample_slots(&in, /*T=*/5, /*C=*/8, caps, &slots, &slot_of), "");
  ASSERT_EQ(slots.size(), 8u);
  EXPECT_EQ(slot_of, (std::vector<int32_t>{2, 0, 1}));  // the biased and the penalized rows take slots 0, 1
  EXPECT_EQ(slots[0].logit_row, 0);
  EXPECT_EQ(slots[0].n_top, 2);
  EXPECT_EQ(slots[0].bias_count, 1);
  EXPECT_EQ(slots[1].logit_row, 4);
  EXPECT_EQ(slots[1].penalty_count, 2);
  EXPECT_EQ(slots[2].logit_row, 3);
  EXPECT_EQ(slots[2].seed, in.rows[0].seed);
  for (int s = 3; s < 8; ++s) {  // no row, padding included
    EXPECT_EQ(slots[s].logit_row, -1) << "slot " << s;
    EXPECT_EQ(slots[s].bias_count + slots[s].penalty_count, 0) << "slot " << s;
  }
  // No rows: every slot skipped, nothing to refuse.
  ASSERT_EQ(stage_graph_sample_slots(nullptr, 5, 8, caps, &slots, &slot_of), "");
  EXPECT_TRUE(slot_of.empty());
  for (const auto& s : slots) EXPECT_EQ(s.logit_row, -1);
  EXPECT_EQ(GraphSamplerCaps::for_rows(8).processed_rows, 8);
  EXPECT_EQ(GraphSamplerCaps::for_rows(256).processed_rows, kGraphSampleProcessedRows);
}

TEST(GraphSampler, RefusesWhatTheTailCannotTakeAndStagesNothing) {
  GraphSamplerCaps caps;
  caps.max_top = 20;
  caps.penalties = 4;
  caps.biases = 2;
  caps.processed_rows = 1;
  std::vector<kernels::SampleRowParams> slots;
  std::vector<int32_t> slot_of;
  auto refused = [&](const kernels::SampleRowsInput& in, int64_t T, const std::string& word) {
    const std::string why = stage_graph_sample_slots(&in, T, 8, caps, &slots, &slot_of);
    EXPECT_TRUE(slot_of.empty());
    EXPECT_NE(why.find(word), std::string::npos) << "'" << why << "' lacks '" << word << "'";
    EXPECT_EQ(slots.size(), 8u);
    for (const auto& s : slots) EXPECT_EQ(s.logit_row, -1);
  };
  kernels::SampleRowsInput in;
  in.rows = {row_at(1, 0.7f, 21)};
  refused(in, 4, "top logprobs 21");
  in.rows = {row_at(1)};
  in.penalties.assign(5, {1, 1, 0});
  in.rows[0].penalty_count = 5;
  refused(in, 4, "5 penalty tokens");
  in.penalties.clear();
  in.rows[0].penalty_count = 0;
  in.biases.assign(3, {1, 1.f});
  in.rows[0].bias_count = 3;
  refused(in, 4, "3 logit_bias entries");
  in.biases.clear();
  in.rows[0].bias_count = 0;
  in.rows = {row_at(4)};
  refused(in, 4, "outside the step");
  in.rows = {row_at(2), row_at(1)};
  in.biases = {{1, 1.f}, {2, 1.f}};
  in.rows[0].bias_count = 1;
  in.rows[1].bias_begin = 1;
  in.rows[1].bias_count = 1;
  refused(in, 4, "2 rows with logit_bias");
  in.biases.clear();
  in.rows = {row_at(1)};
  in.rows[0].penalty_count = 1;  // a range past the (empty) entries
  refused(in, 4, "range");
  in.rows = {row_at(1)};
  refused(in, 9, "bucket of 8");
  in.rows = {row_at(1, 0.7f, 20)};  // at the cap: taken
  EXPECT_EQ(stage_graph_sample_slots(&in, 4, 8, caps, &slots, &slot_of), "");
  EXPECT_EQ(slots[0].logit_row, 1);
}

TEST(GraphSampler, TailLayoutAndUnpack) {
  const GraphTailLayout l = GraphTailLayout::of(4, 3);
  EXPECT_EQ(l.argmax, 0);
  EXPECT_EQ(l.results, 4);
  EXPECT_EQ(l.top_ids, 20);
  EXPECT_EQ(l.top_logprobs, 32);
  EXPECT_EQ(l.end, 44);
  EXPECT_EQ(GraphTailLayout::of(256, kGraphSampleMaxTop).end, 256 * (5 + 2 * kGraphSampleMaxTop));
  std::vector<int32_t> host(l.end, -7);
  auto put = [&](int64_t slot, int32_t token, float lp, int32_t err, int32_t err_tok) {
    backend::DeviceSampleSlot s{token, lp, err, err_tok};
    std::memcpy(host.data() + l.results + 4 * slot, &s, sizeof(s));
  };
  put(2, 41, -0.5f, kernels::kSampleOk, -1);
  put(0, -1, 0.f, kernels::kSampleNanLogit, 17);
  for (int j = 0; j < 3; ++j) {
    host[l.top_ids + 2 * 3 + j] = 100 + j;
    const float lp = -1.f - j;
    std::memcpy(host.data() + l.top_logprobs + 2 * 3 + j, &lp, sizeof(lp));
  }
  kernels::SampleRowsInput in;
  in.rows = {row_at(2, 0.9f, 2), row_at(0, 0.9f, 3)};
  const auto rows = unpack_graph_samples(host.data(), 4, 3, in, /*slot_of=*/{2, 0}, /*vocab=*/1000);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].token, 41);
  EXPECT_EQ(rows[0].logprob, -0.5f);
  EXPECT_EQ(rows[0].error, kernels::kSampleOk);
  ASSERT_EQ(rows[0].top.size(), 2u);  // n_top 2 of the 3 columns
  EXPECT_EQ(rows[0].top[1].first, 101);
  EXPECT_EQ(rows[0].top[1].second, -2.f);
  EXPECT_EQ(rows[1].error, kernels::kSampleNanLogit);
  EXPECT_EQ(rows[1].error_token, 17);
  EXPECT_TRUE(rows[1].top.empty());  // an error row has no logprobs
}

// Packs reference results of the C staged slots as the tail's kernels write them (GraphTailLayout).
std::vector<int32_t> pack_tail(const std::vector<kernels::SampledRow>& slot_rows, int64_t C, int32_t max_top) {
  const GraphTailLayout l = GraphTailLayout::of(C, max_top);
  std::vector<int32_t> host(l.end, 0);
  for (int64_t s = 0; s < C; ++s) {
    const kernels::SampledRow& r = slot_rows[s];
    backend::DeviceSampleSlot d{r.token, r.logprob, r.error, r.error_token};
    std::memcpy(host.data() + l.results + 4 * s, &d, sizeof(d));
    for (size_t j = 0; j < r.top.size() && static_cast<int32_t>(j) < max_top; ++j) {
      host[l.top_ids + s * max_top + j] = r.top[j].first;
      std::memcpy(host.data() + l.top_logprobs + s * max_top + j, &r.top[j].second, sizeof(float));
    }
  }
  return host;
}

TEST(GraphSampler, SlotsOnlyRelocateRowsUnderTheReferenceSampler) {
  const int64_t T = 5, C = 8, V = 300;
  std::vector<float> logits(C * V);
  for (int64_t i = 0; i < C * V; ++i) logits[i] = static_cast<float>((i * 7919) % 1009) / 97.f - 5.f;
  kernels::SampleRowsInput in;
  in.rows = {row_at(4, 1.1f, 3), row_at(1, 0.f, 0), row_at(2, 0.7f, -1)};
  in.rows[2].top_k = 20;
  in.rows[2].top_p = 0.9f;
  in.rows[0].repetition_penalty = 1.3f;
  in.rows[0].presence_penalty = 0.4f;
  in.penalties = {{10, 2, 1}, {11, 0, 1}, {12, 1, 0}};
  in.rows[0].penalty_count = 3;
  in.biases = {{7, 4.f}, {7, -1.f}};
  in.rows[2].bias_count = 2;
  const auto direct = kernels::cpu::sample_rows_f32(logits.data(), C, V, in);
  std::vector<kernels::SampleRowParams> slots;
  std::vector<int32_t> slot_of;
  ASSERT_EQ(stage_graph_sample_slots(&in, T, C, GraphSamplerCaps::for_rows(C), &slots, &slot_of), "");
  EXPECT_EQ(slot_of, (std::vector<int32_t>{0, 2, 1}));
  kernels::SampleRowsInput staged = in;
  staged.rows = slots;
  const auto by_slot = kernels::cpu::sample_rows_f32(logits.data(), C, V, staged);
  for (int64_t s = 0; s < C; ++s) {
    if (slots[s].logit_row < 0) {
      EXPECT_EQ(by_slot[s].error, kernels::kSampleBadRow) << "slot " << s;
    }
  }
  const auto rows = unpack_graph_samples(pack_tail(by_slot, C, kGraphSampleMaxTop).data(), C, kGraphSampleMaxTop,
                                         in, slot_of, V);
  ASSERT_EQ(rows.size(), direct.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].token, direct[i].token) << "row " << i;
    EXPECT_EQ(rows[i].error, kernels::kSampleOk);
    EXPECT_EQ(rows[i].logprob, direct[i].logprob) << "row " << i;
    EXPECT_EQ(rows[i].top, direct[i].top) << "row " << i;
  }
  EXPECT_EQ(rows[0].top.size(), 3u);
}

// ---- the engine path ----

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

// Samples pure-decode steps "inside the forward" the way the tail does (slots of a padded bucket -> the
// reference sampler -> the packed output -> unpack_graph_samples); other steps (prefill chunks in the batch)
// are declined, as a graph would not cover them.
class TailEmulatingExecutor final : public ForwardingExecutor {
 public:
  TailEmulatingExecutor(std::unique_ptr<ModelExecutor> inner, bool emulate)
      : ForwardingExecutor(std::move(inner)), emulate_(emulate) {}
  Result<ExecOutput> execute_and_sample(const model::ForwardBatch& batch, const kernels::SampleRowsInput& in) override {
    MX_ASSIGN_OR_RETURN(ExecOutput out, inner_->execute(batch));
    const int64_t T = batch.n_tokens();
    if (!emulate_ || static_cast<int64_t>(batch.logit_rows.size()) != T) return out;
    int64_t C = 1;
    while (C < T) C *= 2;  // a bucket with padding slots
    std::vector<kernels::SampleRowParams> slots;
    std::vector<int32_t> slot_of;
    if (!stage_graph_sample_slots(&in, T, C, GraphSamplerCaps::for_rows(C), &slots, &slot_of).empty()) return out;
    ++tail_steps;
    if (in.rows.empty()) return out;
    kernels::SampleRowsInput staged = in;
    staged.rows = slots;
    MX_ASSIGN_OR_RETURN(std::vector<kernels::SampledRow> by_slot, inner_->sample(out, staged));
    for (int64_t s = 0; s < C; ++s)
      if (slots[s].logit_row < 0 && by_slot[s].error != kernels::kSampleBadRow)
        return internal_error("a skipped slot produced a token");
    out.sampled = unpack_graph_samples(pack_tail(by_slot, C, kGraphSampleMaxTop).data(), C, kGraphSampleMaxTop,
                                       in, slot_of, vocab_size());
    out.sampled_in_forward = true;
    ++sampled_steps;
    return out;
  }
  Result<std::vector<kernels::SampledRow>> sample(const ExecOutput& o, const kernels::SampleRowsInput& in) override {
    ++sample_calls;
    return inner_->sample(o, in);
  }
  int64_t tail_steps = 0, sampled_steps = 0, sample_calls = 0;

 private:
  bool emulate_;
};

struct EngineRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
  std::vector<std::vector<std::vector<TopLogprob>>> tops;
  int64_t sampled_steps = 0, sample_calls = 0;
};

EngineRun run_engine(const std::vector<RequestSpec>& specs, bool emulate) {
  Loaded& m = shared_model();
  EngineConfig cfg;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_num_batched_tokens = 64;
  cfg.n_blocks = 256;
  cfg.max_model_len = 512;
  cfg.max_logprobs = 32;  // a request past the tail's 20 top logprobs
  auto ex = std::make_unique<TailEmulatingExecutor>(
      make_model_executor(*m.lm, *m.be, cfg.n_blocks, cfg.scheduler.block_size), emulate);
  TailEmulatingExecutor* exp = ex.get();
  Engine engine(cfg, std::move(ex));
  EngineRun r;
  r.tokens.resize(specs.size());
  r.logprobs.resize(specs.size());
  r.tops.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    auto id = engine.submit(specs[i], [&r, i](const TokenEvent& ev) {
      EXPECT_NE(ev.finish, FinishReason::kError) << ev.error;
      if (ev.token < 0) return;
      r.tokens[i].push_back(ev.token);
      r.logprobs[i].push_back(ev.logprob);
      r.tops[i].push_back(ev.top_logprobs);
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
  }
  while (!engine.idle()) engine.step();
  r.sampled_steps = exp->sampled_steps;
  r.sample_calls = exp->sample_calls;
  return r;
}

TEST(GraphSampler, EngineTokensEqualWithSamplingInsideAndAfterTheForward) {
  std::vector<RequestSpec> specs(5);
  for (size_t i = 0; i < specs.size(); ++i) {
    for (int32_t j = 0; j < 7 + 2 * static_cast<int32_t>(i); ++j)
      specs[i].prompt.push_back((j * 37 + static_cast<int32_t>(i) * 11 + 5) % 200 + 3);
    specs[i].sampling.max_tokens = 10;
    specs[i].sampling.seed = 900 + i;
    specs[i].sampling.ignore_eos = true;
  }
  specs[0].sampling.temperature = 0.f;  // greedy: the device argmax, not a sampled row
  specs[1].sampling.temperature = 0.9f;
  specs[1].sampling.top_k = 30;
  specs[1].sampling.top_p = 0.9f;
  specs[2].sampling.temperature = 1.2f;
  specs[2].sampling.repetition_penalty = 1.3f;
  specs[2].sampling.frequency_penalty = 0.2f;
  specs[2].sampling.logit_bias = {{17, 3.f}, {90, 5.f}};
  specs[3].sampling.temperature = 0.7f;
  specs[3].sampling.logprobs = 4;
  specs[4].sampling.temperature = 0.8f;
  specs[4].sampling.logprobs = 25;  // past the tail's cap: steps with it sample after the forward
  specs[4].sampling.max_tokens = 4;  // later decode steps are the tail's
  const EngineRun after = run_engine(specs, false);
  const EngineRun inside = run_engine(specs, true);
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_EQ(after.tokens[i].size(), static_cast<size_t>(specs[i].sampling.max_tokens)) << "request " << i;
    EXPECT_EQ(inside.tokens[i], after.tokens[i]) << "request " << i;
    EXPECT_EQ(inside.logprobs[i], after.logprobs[i]) << "request " << i;
    ASSERT_EQ(inside.tops[i].size(), after.tops[i].size());
    for (size_t t = 0; t < inside.tops[i].size(); ++t) {
      ASSERT_EQ(inside.tops[i][t].size(), after.tops[i][t].size()) << "request " << i << " token " << t;
      for (size_t j = 0; j < inside.tops[i][t].size(); ++j) {
        EXPECT_EQ(inside.tops[i][t][j].token, after.tops[i][t][j].token);
        EXPECT_EQ(inside.tops[i][t][j].logprob, after.tops[i][t][j].logprob);
      }
    }
  }
  EXPECT_EQ(inside.tops[3][0].size(), 4u);
  EXPECT_EQ(inside.tops[4][0].size(), 25u);
  EXPECT_EQ(after.sampled_steps, 0);
  EXPECT_GT(inside.sampled_steps, 0);
  EXPECT_GT(inside.sample_calls, 0);  // steps with prefill rows or request 4's 25 top logprobs
  // Every step with device-sampled rows was sampled exactly once: inside the forward or after it.
  EXPECT_EQ(inside.sampled_steps + inside.sample_calls, after.sample_calls);
}

}  // namespace
}  // namespace mxserve::runtime
