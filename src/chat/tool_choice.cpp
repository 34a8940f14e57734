#include "chat/tool_choice.h"

namespace mxserve::chat {

std::optional<FieldError> parse_tool_choice(const nlohmann::ordered_json* v, const ToolSet& tools, ToolChoice* out) {
  *out = ToolChoice{};
  if (!v || v->is_null()) return std::nullopt;
  const std::string kShape =
      "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}";
  if (v->is_string()) {
    const std::string s = v->get<std::string>();
    if (s == "auto") out->mode = ToolChoiceMode::kAuto;
    else if (s == "none") out->mode = ToolChoiceMode::kNone;
    else if (s == "required") out->mode = ToolChoiceMode::kRequired;
    else return FieldError{"tool_choice", kShape + ", got " + v->dump()};
  } else if (v->is_object()) {
    if (!v->contains("type") || (*v)["type"] != "function")
      return FieldError{"tool_choice.type", kShape + " ('type' must be \"function\")"};
    auto fn = v->find("function");
    if (fn == v->end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
      return FieldError{"tool_choice.function.name", "'tool_choice.function.name' must be a string"};
    out->mode = ToolChoiceMode::kFunction;
    out->function = (*fn)["name"].get<std::string>();
    if (!tools.has(out->function)) {
      std::string known;
      for (const auto& n : tools.names()) known += (known.empty() ? "" : ", ") + n;
      return FieldError{"tool_choice.function.name",
                        "'tool_choice.function.name' = " + (*fn)["name"].dump() + " is not one of the request's tools" +
                            (known.empty() ? std::string(" (it has none)") : " (" + known + ")")};
    }
  } else {
    return FieldError{"tool_choice", kShape};
  }
  if (out->mode == ToolChoiceMode::kRequired && tools.empty())
    return FieldError{"tool_choice", "'tool_choice' is \"required\" but the request has no 'tools'"};
  return std::nullopt;
}

}  // namespace mxserve::chat
