#include "server/json_util.h"

namespace mxserve::server {

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > max_depth) max_depth = depth;
      if (max_depth > limit) return max_depth;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return max_depth;
}

std::optional<OrderedJson> parse_body(std::string_view text, int max_depth, std::string* error) {
  if (text.empty()) {
    *error = "the request body is empty; expected a JSON object";
    return std::nullopt;
  }
  if (json_nesting_depth(text, max_depth) > max_depth) {
    *error = "the request body nests JSON deeper than " + std::to_string(max_depth) + " levels";
    return std::nullopt;
  }
  try {
    return OrderedJson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    *error = std::string("the request body is not valid JSON: ") + e.what();
    return std::nullopt;
  }
}

std::string dump_json(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }
std::string dump_json(const OrderedJson& j) { return j.dump(-1, ' ', false, OrderedJson::error_handler_t::replace); }

std::string json_type_name(const OrderedJson& j) {
  if (j.is_number_integer()) return "integer";
  if (j.is_number_float()) return "number";
  return j.type_name();
}

}  // namespace mxserve::server
