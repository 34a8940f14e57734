// OpenAI response shapes: chat.completion / text_completion objects, their streaming chunks, usage
// and logprobs. Pure functions from typed values to JSON; no I/O.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/generation_session.h"
#include "tokenizer/tokenizer.h"

namespace mxserve::server {

enum class ApiKind { kChat, kCompletion };

struct ResponseMeta {
  ApiKind kind = ApiKind::kChat;
  std::string id;       // chatcmpl-... / cmpl-...
  int64_t created = 0;  // unix seconds
  std::string model;
};

std::string make_response_id(ApiKind kind);

nlohmann::ordered_json usage_json(const UsageTotals& u);

// Logprobs of the tokens in `lps`: chat {"content":[{token,logprob,bytes,top_logprobs}]}; completions
// {tokens, token_logprobs, top_logprobs, text_offset} (text_offset counted from `offset`).
nlohmann::ordered_json logprobs_json(ApiKind kind, const std::vector<TokenLogprob>& lps,
                                     const tokenizer::Tokenizer& tok, size_t offset);

// vLLM's prompt_logprobs of one choice: [null, {"<token id>": {logprob, rank, decoded_token}, ...}, ...] -- the
// prompt token first, then its top alternatives (each id once).
nlohmann::ordered_json prompt_logprobs_json(const std::vector<runtime::PromptLogprob>& lps,
                                            const tokenizer::Tokenizer& tok);

// One streaming chunk for one choice. first: chat adds "role":"assistant" to the delta.
nlohmann::ordered_json stream_chunk(const ResponseMeta& m, const ChoiceDelta& d, bool first,
                                    const nlohmann::ordered_json& logprobs);
// The final usage chunk ("choices": []).
nlohmann::ordered_json usage_chunk(const ResponseMeta& m, const UsageTotals& u);

struct FinishedChoice {
  std::string text;
  std::string finish_reason;
  nlohmann::ordered_json logprobs;  // null when not requested
  // Chat output parsing (server/chat_output.h): text is then the content (null when empty).
  bool parsed = false;
  std::string reasoning_content;
  nlohmann::ordered_json tool_calls = nlohmann::ordered_json::array();
  nlohmann::ordered_json prompt_logprobs;  // completions with prompt_logprobs (vLLM); absent from the JSON when null
};
nlohmann::ordered_json full_response(const ResponseMeta& m, const std::vector<FinishedChoice>& choices,
                                     const UsageTotals& u);

}  // namespace mxserve::server
