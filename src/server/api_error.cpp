#include "server/api_error.h"

#include <optional>

#include "server/json_util.h"

namespace mxserve::server {

nlohmann::json ApiError::to_json() const {
  nlohmann::json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  e["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
  return nlohmann::json{{"error", std::move(e)}};
}

std::string ApiError::body() const { return dump_json(to_json()); }

ApiError bad_request(std::string message, std::string param, std::string code) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError unsupported_field(const std::string& field, const std::string& why) {
  return bad_request("'" + field + "' is not supported by this server: " + why, field, "unsupported_parameter");
}

ApiError context_length_exceeded(int64_t max_model_len, int64_t prompt_tokens, int64_t max_tokens,
                                 const std::string& param) {
  return bad_request("This model's maximum context length is " + std::to_string(max_model_len) +
                         " tokens. However, you requested " + std::to_string(max_tokens) +
                         " output tokens and your prompt contains " + std::to_string(prompt_tokens) +
                         " input tokens, for a total of " + std::to_string(prompt_tokens + max_tokens) +
                         " tokens. Please reduce the length of the input or of max_tokens.",
                     param, "context_length_exceeded");
}

ApiError model_not_found(const std::string& model) {
  ApiError e;
  e.http_status = 404;
  e.message = "The model `" + model + "` does not exist.";
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

ApiError route_not_found(const std::string& method, const std::string& path) {
  ApiError e;
  e.http_status = 404;
  e.message = "Unknown route: " + method + " " + path;
  e.code = "not_found";
  return e;
}

ApiError unauthorized() {
  ApiError e;
  e.http_status = 401;
  e.message = "Incorrect or missing API key: send it as 'Authorization: Bearer <key>'.";
  e.type = "authentication_error";
  e.code = "invalid_api_key";
  return e;
}

ApiError payload_too_large(size_t limit_bytes) {
  ApiError e;
  e.http_status = 413;
  e.message = "Request body too large: the limit is " + std::to_string(limit_bytes) + " bytes.";
  e.code = "request_too_large";
  return e;
}

ApiError overloaded(std::string message) {
  ApiError e;
  e.http_status = 503;
  e.message = std::move(message);
  e.type = "server_overloaded";
  e.code = "server_overloaded";
  e.retry_after_s = 1;
  return e;
}

ApiError internal(std::string message) {
  ApiError e;
  e.http_status = 500;
  e.message = "Internal server error (a bug in mxserve): " + message;
  e.type = "server_error";
  e.code = "internal_error";
  return e;
}

ApiError from_status(const Status& status, const std::string& param) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument: return bad_request(status.message(), param);
    case StatusCode::kUnsupported: return bad_request(status.message(), param, "unsupported_parameter");
    case StatusCode::kUnavailable: return overloaded(status.message());
    default: return internal(status.to_string());
  }
}

ApiError from_engine_error(const std::string& text) {
  auto rest_after = [&](const char* code) -> std::optional<std::string> {
    const std::string prefix = std::string(code) + ": ";
    if (text.rfind(prefix, 0) != 0) return std::nullopt;
    return text.substr(prefix.size());
  };
  if (auto m = rest_after(status_code_name(StatusCode::kOutOfMemory))) {
    ApiError e;
    e.http_status = 503;
    e.message = "The server ran out of device memory for this request (it keeps serving; retry): " + *m;
    e.type = "server_error";
    e.code = "out_of_memory";
    e.retry_after_s = 1;
    return e;
  }
  if (auto m = rest_after(status_code_name(StatusCode::kUnavailable))) return overloaded(*m);
  if (auto m = rest_after(status_code_name(StatusCode::kInvalidArgument))) return bad_request(*m);
  return internal(text);
}

}  // namespace mxserve::server
