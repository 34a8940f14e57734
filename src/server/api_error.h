// ApiError: an OpenAI-style error response -- HTTP status + {"error":{message,type,param,code}}.
// Owns the mapping from failure kinds to status codes and OpenAI error types. Every handler failure
// becomes one of these; nothing user-supplied ever turns into a 500 (500 means a bug in mxserve).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mxserve::server {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty -> null
  std::string code;   // empty -> null
  int retry_after_s = 0;  // > 0: a Retry-After header (503)

  nlohmann::json to_json() const;
  std::string body() const;  // serialized to_json()
};

ApiError bad_request(std::string message, std::string param = "", std::string code = "");
ApiError unsupported_field(const std::string& field, const std::string& why);
ApiError context_length_exceeded(int64_t max_model_len, int64_t prompt_tokens, int64_t max_tokens,
                                 const std::string& param);
ApiError model_not_found(const std::string& model);
ApiError route_not_found(const std::string& method, const std::string& path);
ApiError unauthorized();
ApiError payload_too_large(size_t limit_bytes);
ApiError overloaded(std::string message);  // 503 + Retry-After
ApiError internal(std::string message);     // 500: a bug
// From a runtime/tokenizer Status: kInvalidArgument -> 400, kUnavailable -> 503, else 500.
ApiError from_status(const Status& status, const std::string& param = "");
// A request the engine failed mid-generation, from its error text (Status::to_string(): "code: message", the
// failing rank's own text under tensor / data parallelism): out_of_memory -> 503 "server_error" code
// "out_of_memory" (the device was full for this step; retry), unavailable -> 503, invalid_argument -> 400,
// anything else -> 500 (a bug). The message is the engine's text, never replaced.
ApiError from_engine_error(const std::string& text);

}  // namespace mxserve::server
