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
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  std::vector<runtime::TopLogprob> top;
};

struct ChoiceDelta {
  int index = 0;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  std::string finish_reason;  // empty while the choice runs
  std::string error;          // set with finish_reason "error"
  std::string stop_str;       // the stop string that ended the choice (finish_reason "stop"); empty otherwise
  int n_tokens = 0;           // generated tokens this delta covers (text may still be empty)
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
  };

  void handle(const Event& e, ChoiceDelta* delta);
  void finish_choice(Choice& c, const std::string& reason, ChoiceDelta* delta);

  ServerContext& ctx_;
  GenerationOptions gen_;
  std::shared_ptr<Inbox> inbox_;
  std::vector<Choice> choices_;
  int n_open_ = 0;
  runtime::Clock::time_point arrival_;
};

}  // namespace mxserve::server
