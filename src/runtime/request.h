// Requests as the engine sees them: what the caller asks for (RequestSpec + SamplingParams), what it
// gets back (TokenEvent), and the typed reasons a request is refused or ends.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace mxserve::runtime {

using Clock = std::chrono::steady_clock;
using RequestId = uint64_t;

// A per-request constraint on the next token (e.g. structured output), applied before any other logit
// processing wherever the engine decides a token: plain sampling, speculative verification and drafting.
class LogitMask {
 public:
  virtual ~LogitMask() = default;
  // Sets the logits of the tokens not allowed after `generated` (the request's output before the position,
  // speculative tokens included) to -inf. Called on the engine thread; must depend on `generated` only:
  // verification and drafting ask about hypothetical continuations, several per step, in any order.
  virtual void apply(std::span<const int32_t> generated, std::span<float> logits) const = 0;
};

struct SamplingParams {
  float temperature = 1.0f;        // < 1e-5 (kGreedyTemperature) = greedy (deterministic)
  float top_p = 1.0f;              // nucleus mass in (0, 1]
  int32_t top_k = 0;               // 0 = off
  float min_p = 0.0f;              // drop tokens with p < min_p * p_max
  std::optional<uint64_t> seed;    // reproducible sampling when set
  int32_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // in addition to the model's EOS ids (unless ignore_eos)
  bool ignore_eos = false;
  int32_t logprobs = -1;           // -1: none; 0: the sampled token's; n: plus the n most likely
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f; // > 0; tokens of the prompt or output: logit / r when > 0, logit * r else
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, bias added to its logit)
  std::shared_ptr<const LogitMask> logit_mask;        // optional
  // -1: none; k >= 0: the raw log-softmax of every prompt token from position 1 on (teacher-forced), plus the
  // k most likely tokens at each position. Such a request skips the prefix cache until they are computed.
  int32_t prompt_logprobs = -1;
};

class LogitConstraint;  // runtime/logit_constraint.h

struct RequestSpec {
  std::vector<int32_t> prompt;     // token ids
  SamplingParams sampling;
  std::shared_ptr<LogitConstraint> constraint;  // structured output; null: unconstrained
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

struct TopLogprob {
  int32_t token;
  float logprob;
};

// A prompt token's logprob: its raw log-softmax given the tokens before it, its rank under the raw
// logits (1 = the most likely), and the requested most likely alternatives.
struct PromptLogprob {
  int32_t token = -1;
  float logprob = 0.f;
  int32_t rank = 0;
  std::vector<TopLogprob> top;
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;       // prompt tokens served from the prefix cache (first admission)
  int32_t cached_host_tokens = 0;  // of which loaded back from the host KV tier (--kv-cache-host-memory)
  int32_t completion_tokens = 0;
  int64_t spec_draft_tokens = 0;     // speculative decoding: tokens drafted for this request
  int64_t spec_accepted_tokens = 0;  // of which accepted by the target
  int64_t spec_drafts = 0;           // verify steps that carried drafts for this request
};

// One generated token (or the final notice of an abort/error, with token = -1).
struct TokenEvent {
  RequestId id = 0;
  int32_t token = -1;
  float logprob = 0.f;
  std::vector<TopLogprob> top_logprobs;
  FinishReason finish = FinishReason::kNone;  // set on the last event of the request
  std::string error;                          // when finish == kError
  Usage usage;                                // so far (cached_tokens is final from the first token on)
  // SamplingParams::prompt_logprobs >= 0: on the first token's event only, prompt positions 1..prompt_len-1.
  std::vector<PromptLogprob> prompt_logprobs;
  Clock::time_point first_scheduled{};        // when the request first ran in a step (queue / prefill times)
};

using EventCallback = std::function<void(const TokenEvent&)>;

// Per-request timestamps for metrics (TTFT, ITL, E2E, queueing).
struct RequestTimes {
  Clock::time_point arrival;
  std::optional<Clock::time_point> first_scheduled;
  std::optional<Clock::time_point> first_token;
  std::optional<Clock::time_point> last_token;
  std::optional<Clock::time_point> finished;
};

}  // namespace mxserve::runtime
