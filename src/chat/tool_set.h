// ToolSet: the functions a chat request offers (its OpenAI `tools` array), validated once, with what the
// tool-call parser needs from each JSON schema: for every parameter, whether it is a plain string (the
// model's raw text is kept) or another type (the text is parsed as JSON; unparsable text stays a string).
// Validation errors name the offending field path (tools[2].function.parameters.properties.x.type).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace mxserve::chat {

struct FieldError {
  std::string field;    // e.g. "tools[0].function.name"
  std::string message;  // names the field and what is wrong
};

class ToolSet {
 public:
  // Validates an OpenAI `tools` array (null/absent = no tools). Every entry must be
  // {"type":"function","function":{"name":..., "description"?, "parameters"?: JSON schema object}}.
  static std::optional<FieldError> from_openai(const nlohmann::ordered_json& tools, ToolSet* out);

  bool empty() const { return functions_.empty(); }
  bool has(std::string_view name) const { return functions_.count(std::string(name)) > 0; }
  std::vector<std::string> names() const;

  // The JSON value of argument `key` of function `name` from the model's raw text `raw`.
  nlohmann::ordered_json convert(std::string_view name, std::string_view key, std::string_view raw) const;
  // True when convert() keeps the raw text of this parameter (a plain string parameter).
  bool raw_string(std::string_view name, std::string_view key) const;

  // A function as the request gave it: its position in `tools` and its parameters schema (null: none).
  struct Definition {
    size_t index = 0;
    nlohmann::ordered_json parameters;
  };
  const Definition* definition(std::string_view name) const;

 private:
  enum class ParamKind { kString, kOther };
  std::map<std::string, std::map<std::string, ParamKind>> functions_;  // name -> parameter -> kind
  std::map<std::string, Definition> definitions_;
};

// True when `name` can be written between <tool_call> and <arg_key> unambiguously: non-empty, at most
// 256 bytes, no whitespace, control characters, '<' or '>'.
bool valid_function_name(std::string_view name);

}  // namespace mxserve::chat
