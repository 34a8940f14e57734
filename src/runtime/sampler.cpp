#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace mxserve::runtime {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "?";
}

bool has_logit_processing(const SamplingParams& p) {
  return p.logit_mask != nullptr || !p.logit_bias.empty() || p.repetition_penalty != 1.f ||
         p.presence_penalty != 0.f || p.frequency_penalty != 0.f;
}

void append_row_processing(const SamplingParams& p, const TokenContext& ctx, kernels::SampleRowParams* row,
                           kernels::SampleRowsInput* in) {
  row->bias_begin = static_cast<int32_t>(in->biases.size());
  for (const auto& [token, bias] : p.logit_bias) in->biases.push_back({token, bias});
  row->bias_count = static_cast<int32_t>(in->biases.size()) - row->bias_begin;
  row->penalty_begin = static_cast<int32_t>(in->penalties.size());
  const bool repetition = p.repetition_penalty != 1.f;
  const bool output_penalties = p.presence_penalty != 0.f || p.frequency_penalty != 0.f;
  if (repetition || output_penalties) {
    // Distinct tokens with their output counts; prompt tokens only matter to the repetition penalty.
    std::vector<std::pair<int32_t, int32_t>> seen;  // (token, 1 = output / 0 = prompt)
    seen.reserve((repetition ? ctx.prompt.size() : 0) + ctx.generated.size());
    if (repetition)
      for (int32_t t : ctx.prompt) seen.emplace_back(t, 0);
    for (int32_t t : ctx.generated) seen.emplace_back(t, 1);
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size();) {
      kernels::SamplePenaltyToken e;
      e.token = seen[i].first;
      for (; i < seen.size() && seen[i].first == e.token; ++i) {
        e.in_prompt |= seen[i].second == 0;
        e.output_count += seen[i].second;
      }
      in->penalties.push_back(e);
    }
  }
  row->penalty_count = static_cast<int32_t>(in->penalties.size()) - row->penalty_begin;
}

void append_row_processing(const SamplingParams& p, const PenaltyTokens& seen, kernels::SampleRowParams* row,
                           kernels::SampleRowsInput* in) {
  row->bias_begin = static_cast<int32_t>(in->biases.size());
  for (const auto& [token, bias] : p.logit_bias) in->biases.push_back({token, bias});
  row->bias_count = static_cast<int32_t>(in->biases.size()) - row->bias_begin;
  row->penalty_begin = static_cast<int32_t>(in->penalties.size());
  if (has_penalties(p)) in->penalties.insert(in->penalties.end(), seen.entries().begin(), seen.entries().end());
  row->penalty_count = static_cast<int32_t>(in->penalties.size()) - row->penalty_begin;
}

kernels::SampleRowParams sample_row_params(const SamplingParams& p, uint64_t request_seed, uint64_t step,
                                           int32_t logit_row) {
  kernels::SampleRowParams r;
  r.logit_row = logit_row;
  r.temperature = p.temperature;
  r.top_k = p.top_k;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.repetition_penalty = p.repetition_penalty;
  r.presence_penalty = p.presence_penalty;
  r.frequency_penalty = p.frequency_penalty;
  r.n_top = p.logprobs;
  r.seed = sampling_seed(p, request_seed);
  r.step = step;
  return r;
}

void process_logits(std::span<float> logits, const SamplingParams& p, const TokenContext& ctx) {
  if (p.logit_mask) p.logit_mask->apply(ctx.generated, logits);
  kernels::SampleRowsInput in;
  kernels::SampleRowParams row = sample_row_params(p, 0, 0, 0);
  append_row_processing(p, ctx, &row, &in);
  kernels::cpu::apply_bias_and_penalties(logits, row, in.biases, in.penalties);
}

Status check_logits(std::span<const float> logits) {
  int32_t culprit = -1;
  const int32_t code = kernels::cpu::check_row(logits, &culprit);
  return kernels::cpu::sample_error_status(code, culprit, static_cast<int64_t>(logits.size()));
}

int32_t argmax_of(std::span<const float> logits) { return kernels::cpu::argmax_of(logits); }

TokenDistribution sampling_distribution(std::span<const float> logits, const SamplingParams& p) {
  return kernels::cpu::sampling_distribution(logits, p.temperature, p.top_k, p.top_p, p.min_p);
}

Result<int32_t> pick_token(std::span<const float> processed, const SamplingParams& p, uint64_t seed, uint64_t step) {
  MX_RETURN_IF_ERROR(check_logits(processed));
  if (is_greedy(p)) return argmax_of(processed);
  return sampling_distribution(processed, p).draw(counter_uniform(seed, step));
}

void raw_logprobs(std::span<const float> raw, int32_t token, int32_t n_top, float* logprob,
                  std::vector<TopLogprob>* top) {
  std::vector<std::pair<int32_t, float>> pairs;
  kernels::cpu::raw_logprobs(raw, token, n_top, logprob, top ? &pairs : nullptr);
  if (!top || n_top <= 0) return;
  top->clear();
  for (const auto& [id, lp] : pairs) top->push_back({id, lp});
}

Result<SampleResult> sample_token(std::span<float> logits, const SamplingParams& p, uint64_t request_seed,
                                  uint64_t step, const TokenContext& ctx) {
  SampleResult out;
  std::vector<float> raw;
  if (p.logprobs >= 0) raw.assign(logits.begin(), logits.end());
  process_logits(logits, p, ctx);
  MX_ASSIGN_OR_RETURN(out.token, pick_token(logits, p, sampling_seed(p, request_seed), step));
  if (p.logprobs >= 0) raw_logprobs(raw, out.token, p.logprobs, &out.logprob, &out.top_logprobs);
  return out;
}

}  // namespace mxserve::runtime
