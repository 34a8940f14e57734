// The OpenAI request schema: parses an untrusted JSON body of /v1/chat/completions or /v1/completions
// into a typed request. Every field is type- and range-checked here, once; a field that would change
// semantics but is not implemented (best_of, suffix, ...) is a 400
// naming it (structured output: structured_request.h); harmless unknown fields are accepted and reported back for a once-per-name log line.
// After this file nothing looks at request JSON again (except the chat template, which renders it).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "runtime/request.h"
#include "server/api_error.h"
#include "server/json_util.h"
#include "structured/grammar.h"
#include "tokenizer/chat_template.h"

namespace mxserve::server {

struct GenerationOptions {
  std::string model;                    // empty: not given
  std::optional<int64_t> max_tokens;    // unset: chat generates to the end of the context
  runtime::SamplingParams sampling;     // max_tokens / seed / logprobs filled per choice later
  std::vector<std::string> stop;
  int n = 1;
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  bool continuous_usage = false;        // stream_options.continuous_usage_stats
  int logprobs = -1;                    // -1 off; else number of top alternatives (0 = sampled token only)
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;
  bool echo = false;                    // completions: the prompt in front of each choice's text (and logprobs)
  int prompt_logprobs = -1;             // completions (vLLM): -1 off; else each prompt token's logprob + this many top
  std::vector<std::string> ignored_fields;  // unknown fields (accepted; logged once per name)
  std::shared_ptr<const structured::Grammar> grammar;  // structured output (structured_request.h); null: none
};

struct ChatRequest {
  GenerationOptions gen;
  tokenizer::ChatInputs inputs;         // messages (content normalized to strings), tools, kwargs
};

using PromptInput = std::variant<std::string, std::vector<int32_t>>;

struct CompletionRequest {
  GenerationOptions gen;
  std::vector<PromptInput> prompts;     // one entry per prompt; each gets n choices
};

// nullopt on success.
std::optional<ApiError> parse_chat_request(const OrderedJson& body, ChatRequest* out);
std::optional<ApiError> parse_completion_request(const OrderedJson& body, CompletionRequest* out);

}  // namespace mxserve::server
