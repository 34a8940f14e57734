// Anthropic Messages response shapes: the message object, its content blocks (thinking, text, tool_use),
// stop_reason / stop_sequence, usage, the streaming events (message_start, content_block_start / delta /
// stop, message_delta, message_stop, ping) as SSE text, and the error object. Pure functions and one small
// accumulator, no I/O.
// Invariant: the streamed events and the non-streamed content come from the same AnthropicContent, fed the
// same ChoiceOutput deltas, so a client that accumulates the events gets the non-streamed message.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/chat_output.h"
#include "server/generation_session.h"

namespace mxserve::server {

// {"type":"error","error":{"type":...,"message":...}}; the type from the HTTP status (400
// invalid_request_error, 401 authentication_error, 403 permission_error, 404 not_found_error, 413
// request_too_large, 429 rate_limit_error, 529 overloaded_error, other 5xx api_error).
nlohmann::ordered_json anthropic_error_json(const ApiError& e);
// The status Anthropic uses for e: 503 (overloaded, loading, draining) becomes 529; the rest are kept.
int anthropic_status(const ApiError& e);

// input_tokens counts the prompt tokens not read from the prefix cache (Anthropic's meaning: the total
// prompt is input_tokens + cache_read_input_tokens + cache_creation_input_tokens, the last always 0 here).
nlohmann::ordered_json anthropic_usage(const UsageTotals& u);

struct AnthropicStop {
  std::string reason;    // end_turn, max_tokens, stop_sequence, tool_use
  std::string sequence;  // the matched stop sequence (reason stop_sequence), else empty (null)
};
// From the finish reason after ChoiceOutput::finish_reason (stop, length, tool_calls, abort) and the
// stop string the generation session matched.
AnthropicStop anthropic_stop(const std::string& finish_reason, const std::string& stop_str);

std::string make_message_id();  // "msg_" + 24 random alphanumerics
// "toolu_" + the random part of a ChoiceOutput call id ("call_...").
std::string tool_use_id(const std::string& call_id);

// The content blocks of one assistant message, built from parsed deltas; returns the stream events each
// step makes. Consecutive text (or thinking) extends the open block; a new kind closes it and opens another.
class AnthropicContent {
 public:
  // Reasoning first, then text, then tool calls (the order the GLM formats write them in).
  std::vector<nlohmann::ordered_json> add(const ChoiceOutput::Delta& d);
  // Closes the open block (its content_block_stop), if any.
  std::vector<nlohmann::ordered_json> close();
  const nlohmann::ordered_json& blocks() const { return blocks_; }
  bool has_tool_use() const { return n_tool_use_ > 0; }

 private:
  void open(nlohmann::ordered_json block, std::vector<nlohmann::ordered_json>* events);
  void extend(const std::string& type, const std::string& text, std::vector<nlohmann::ordered_json>* events);

  nlohmann::ordered_json blocks_ = nlohmann::ordered_json::array();
  bool open_ = false;
  int n_tool_use_ = 0;
};

// The non-streaming message object.
nlohmann::ordered_json anthropic_message(const std::string& id, const std::string& model,
                                         const nlohmann::ordered_json& content, const AnthropicStop& stop,
                                         const UsageTotals& u);
// message_start: the message with empty content and no stop reason yet.
nlohmann::ordered_json message_start_event(const std::string& id, const std::string& model, const UsageTotals& u);
// message_delta: stop_reason, stop_sequence and the final usage.
nlohmann::ordered_json message_delta_event(const AnthropicStop& stop, const UsageTotals& u);
// "event: <type>\ndata: <json>\n\n" (the SDKs dispatch on the event line).
std::string sse_event(const nlohmann::ordered_json& event);

}  // namespace mxserve::server
