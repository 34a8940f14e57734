// GenerationSession: one HTTP request's choices in flight in the engine. Submits every choice, receives
// their token events (pushed by the engine thread into a queue; nothing else happens there), and on the
// HTTP thread turns them into text deltas: streaming detokenization, stop strings (which abort the
// engine request at once), logprobs, finish reasons, usage, and the latency metrics. Destroying a
// session aborts whatever is still running, so a handler that returns early (client gone, error) frees
// the KV blocks of its requests immediately.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/request.h"
#include "server/api_error.h"
#include "server/request_schema.h"
#include "server/server_context.h"
#include "tokenizer/streaming_detokenizer.h"

namespace mxserve::server {

struct ChoiceInput {
  std::vector<int32_t> prompt;
  int prompt_index = 0;  // which prompt of the request (completions with a list of prompts)
  std::string echo_text; // completions "echo": the prompt as the client gave it (a string, or its ids decoded)
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  std::vector<runtime::TopLogprob> top;
  bool has_logprob = true;  // false: the first prompt token of an echo (no context: logprob null)
};

struct ChoiceDelta {
  int index = 0;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  std::string finish_reason;  // empty while the choice runs
  std::string error;          // set with finish_reason "error"
  std::string stop_str;       // the stop string that ended the choice (finish_reason "stop"); empty otherwise
  int n_tokens = 0;           // generated tokens this delta covers (text may still be empty)
  // vLLM's prompt_logprobs (GenerationOptions::prompt_logprobs >= 0), on the choice's first delta only:
  // positions 1.. of the prompt (position 0 has none).
  std::vector<runtime::PromptLogprob> prompt_logprobs;
  bool has_prompt_logprobs = false;
};

struct UsageTotals {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};

class GenerationSession {
 public:
  GenerationSession(ServerContext& ctx, const GenerationOptions& gen);
  ~GenerationSession();
  GenerationSession(const GenerationSession&) = delete;
  GenerationSession& operator=(const GenerationSession&) = delete;

  // Submits one engine request per choice (n per input). On failure, the ones already submitted are aborted.
  // max_tokens 0 (completions echo only): the engine generates one token, which the session drops.
  // `inputs` must outlive the session (echo reads them).
  std::optional<ApiError> submit(const std::vector<ChoiceInput>& inputs, int64_t max_tokens);

  // Waits up to `timeout` for events and appends the resulting deltas (at most one per choice per call).
  // Returns false once every choice has finished and all deltas were handed out.
  bool poll(std::vector<ChoiceDelta>* out, std::chrono::milliseconds timeout);
  bool done() const { return n_open_ == 0; }

  void abort_all();
  UsageTotals usage() const;
  size_t num_choices() const { return choices_.size(); }

 private:
  struct Event {
    int choice;
    runtime::TokenEvent ev;
    runtime::Clock::time_point at;
  };
  struct Inbox {  // shared with the engine callbacks, which may outlive the session
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<Event> events;
  };
  struct Choice {
    runtime::RequestId id = 0;
    int prompt_index = 0;
    int64_t prompt_tokens = 0;
    int64_t cached_tokens = 0;
    int64_t n_tokens = 0;
    bool submitted = false;
    bool finished = false;
    std::unique_ptr<tokenizer::StreamingDetokenizer> detok;
    std::optional<runtime::Clock::time_point> last_token;
    // Metrics of the finished request: engine phase times and its speculative decoding counters.
    runtime::Clock::time_point submitted_at{}, first_scheduled{}, first_token{};
    bool cache_counted = false;
    int64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted = 0;
    // Completions echo / prompt logprobs, delivered with the first delta.
    const ChoiceInput* input = nullptr;
    bool prompt_sent = false;
  };

  // The echo text and the prompt's logprobs in front of the choice's first delta.
  void add_prompt_part(Choice& c, const runtime::TokenEvent& ev, ChoiceDelta* delta);

  void handle(const Event& e, ChoiceDelta* delta);
  void finish_choice(Choice& c, const std::string& reason, ChoiceDelta* delta);

  ServerContext& ctx_;
  GenerationOptions gen_;
  std::shared_ptr<Inbox> inbox_;
  std::vector<Choice> choices_;
  int n_open_ = 0;
  bool drop_generated_ = false;  // max_tokens 0: the one generated token is not returned
  runtime::Clock::time_point arrival_;
};

}  // namespace mxserve::server
