#include "chat/tool_set.h"

#include <set>

#include "chat/text_scan.h"

namespace mxserve::chat {
namespace {

using OJ = nlohmann::ordered_json;

const std::set<std::string>& schema_types() {
  static const std::set<std::string> t = {"string", "number", "integer", "boolean", "object", "array", "null"};
  return t;
}

// Collects the JSON-schema types a property allows ("type" as a string or list, and the branches of
// anyOf/oneOf). An unknown type name is an error.
std::optional<FieldError> collect_types(const OJ& schema, const std::string& where, std::set<std::string>* types) {
  if (!schema.is_object()) return FieldError{where, "'" + where + "' must be a JSON schema object"};
  if (auto it = schema.find("type"); it != schema.end()) {
    std::vector<OJ> names;
    if (it->is_string()) names.push_back(*it);
    else if (it->is_array()) names.assign(it->begin(), it->end());
    else return FieldError{where + ".type", "'" + where + ".type' must be a string or a list of strings"};
    for (const OJ& n : names) {
      if (!n.is_string() || !schema_types().count(n.get<std::string>()))
        return FieldError{where + ".type", "'" + where + ".type' has " + n.dump() +
                                               ", not one of string, number, integer, boolean, object, array, null"};
      types->insert(n.get<std::string>());
    }
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    auto it = schema.find(key);
    if (it == schema.end()) continue;
    if (!it->is_array()) return FieldError{where + "." + key, "'" + where + "." + key + "' must be a list of schemas"};
    for (size_t i = 0; i < it->size(); ++i)
      if (auto e = collect_types((*it)[i], where + "." + key + "[" + std::to_string(i) + "]", types)) return e;
  }
  return std::nullopt;
}

}  // namespace

bool valid_function_name(std::string_view name) {
  if (name.empty() || name.size() > 256) return false;
  for (char c : name)
    if (is_space(c) || c == '<' || c == '>' || static_cast<unsigned char>(c) < 0x20) return false;
  return true;
}

std::optional<FieldError> ToolSet::from_openai(const OJ& tools, ToolSet* out) {
  out->functions_.clear();
  out->definitions_.clear();
  if (tools.is_null()) return std::nullopt;
  if (!tools.is_array()) return FieldError{"tools", "'tools' must be a list"};
  for (size_t i = 0; i < tools.size(); ++i) {
    const OJ& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("type") || t["type"] != "function" || !t.contains("function") ||
        !t["function"].is_object())
      return FieldError{where, "'" + where + "' must be {\"type\": \"function\", \"function\": {...}}"};
    const OJ& fn = t["function"];
    const std::string name_field = where + ".function.name";
    if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty())
      return FieldError{name_field, "'" + name_field + "' must be a non-empty string"};
    const std::string name = fn["name"].get<std::string>();
    if (!valid_function_name(name))
      return FieldError{name_field, "'" + name_field + "' = " + OJ(name).dump() +
                                        " must be at most 256 bytes without whitespace, '<' or '>'"};
    if (out->functions_.count(name))
      return FieldError{name_field, "'" + name_field + "': function " + OJ(name).dump() + " is defined twice"};
    auto& params = out->functions_[name];
    auto pit = fn.find("parameters");
    out->definitions_[name] = Definition{i, pit == fn.end() ? OJ(nullptr) : *pit};
    if (pit == fn.end() || pit->is_null()) continue;
    const std::string pw = where + ".function.parameters";
    if (!pit->is_object()) return FieldError{pw, "'" + pw + "' must be a JSON schema object"};
    if (auto ty = pit->find("type"); ty != pit->end() && *ty != "object")
      return FieldError{pw + ".type", "'" + pw + ".type' must be \"object\" (arguments are named), got " + ty->dump()};
    if (auto req = pit->find("required"); req != pit->end()) {
      if (!req->is_array()) return FieldError{pw + ".required", "'" + pw + ".required' must be a list of strings"};
      for (const OJ& r : *req)
        if (!r.is_string()) return FieldError{pw + ".required", "'" + pw + ".required' must be a list of strings"};
    }
    auto props = pit->find("properties");
    if (props == pit->end() || props->is_null()) continue;
    if (!props->is_object()) return FieldError{pw + ".properties", "'" + pw + ".properties' must be an object"};
    for (const auto& [key, schema] : props->items()) {
      std::set<std::string> types;
      if (auto e = collect_types(schema, pw + ".properties." + key, &types)) return e;
      types.erase("null");
      params[key] = types.size() == 1 && types.count("string") ? ParamKind::kString : ParamKind::kOther;
    }
  }
  return std::nullopt;
}

std::vector<std::string> ToolSet::names() const {
  std::vector<std::string> n;
  for (const auto& [name, params] : functions_) n.push_back(name);
  return n;
}

bool ToolSet::raw_string(std::string_view name, std::string_view key) const {
  auto fn = functions_.find(std::string(name));
  if (fn == functions_.end()) return false;
  auto p = fn->second.find(std::string(key));
  return p != fn->second.end() && p->second == ParamKind::kString;
}

const ToolSet::Definition* ToolSet::definition(std::string_view name) const {
  auto it = definitions_.find(std::string(name));
  return it == definitions_.end() ? nullptr : &it->second;
}

OJ ToolSet::convert(std::string_view name, std::string_view key, std::string_view raw) const {
  auto fn = functions_.find(std::string(name));
  if (fn != functions_.end()) {
    auto p = fn->second.find(std::string(key));
    if (p != fn->second.end() && p->second == ParamKind::kString) return OJ(std::string(raw));
  }
  OJ parsed = OJ::parse(raw.begin(), raw.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return OJ(std::string(raw));
  return parsed;
}

}  // namespace mxserve::chat
