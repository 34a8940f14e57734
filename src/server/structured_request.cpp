#include "server/structured_request.h"

#include <nlohmann/json.hpp>

namespace mxserve::server {
namespace {

const OrderedJson* field(const OrderedJson& obj, const std::string& name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// A schema given as an object, or as a string holding one (vLLM accepts both for guided_json).
std::optional<ApiError> schema_grammar(const OrderedJson& v, const std::string& where,
                                       std::shared_ptr<const structured::Grammar>* out) {
  OrderedJson schema;
  if (v.is_string()) {
    schema = OrderedJson::parse(v.get<std::string>(), nullptr, false);
    if (schema.is_discarded()) return bad_request("'" + where + "' is a string that is not valid JSON", where);
  } else if (v.is_object() || v.is_boolean()) {
    schema = v;
  } else {
    return bad_request("'" + where + "' must be a JSON schema (an object)", where);
  }
  auto g = structured::compile_json_schema(schema);
  if (!g.is_ok()) return bad_request("'" + where + "': " + g.status().message(), where);
  *out = *g;
  return std::nullopt;
}

std::optional<ApiError> choice_grammar(const OrderedJson& v, const std::string& where,
                                       std::shared_ptr<const structured::Grammar>* out) {
  if (!v.is_array()) return bad_request("'" + where + "' must be a list of strings", where);
  std::vector<std::string> choices;
  for (const auto& c : v) {
    if (!c.is_string()) return bad_request("'" + where + "' must be a list of strings", where);
    choices.push_back(c.get<std::string>());
  }
  auto g = structured::compile_choice(choices);
  if (!g.is_ok()) return bad_request("'" + where + "': " + g.status().message(), where);
  *out = *g;
  return std::nullopt;
}

std::optional<ApiError> response_format(const OrderedJson& v, std::shared_ptr<const structured::Grammar>* out) {
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string())
    return bad_request("'response_format' must be an object with a string 'type'", "response_format");
  const std::string type = v["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    *out = structured::any_json_object_grammar();
    return std::nullopt;
  }
  if (type == "json_schema") {
    const OrderedJson* js = field(v, "json_schema");
    if (!js || !js->is_object())
      return bad_request("'response_format.json_schema' must be an object with a 'schema'", "response_format.json_schema");
    if (const OrderedJson* name = field(*js, "name"); name && !name->is_string())
      return bad_request("'response_format.json_schema.name' must be a string", "response_format.json_schema.name");
    if (const OrderedJson* strict = field(*js, "strict"); strict && !strict->is_boolean())
      return bad_request("'response_format.json_schema.strict' must be a boolean", "response_format.json_schema.strict");
    const OrderedJson* schema = field(*js, "schema");
    if (!schema) return bad_request("'response_format.json_schema.schema' is required", "response_format.json_schema.schema");
    return schema_grammar(*schema, "response_format.json_schema.schema", out);
  }
  return unsupported_field("response_format", "type " + dump_json(v["type"]) +
                                                  " is not supported; use \"text\", \"json_object\" or \"json_schema\"");
}

std::optional<ApiError> structured_outputs(const OrderedJson& v, std::shared_ptr<const structured::Grammar>* out) {
  if (!v.is_object()) return bad_request("'structured_outputs' must be an object", "structured_outputs");
  int n = 0;
  for (const auto& [k, x] : v.items()) {
    if (x.is_null()) continue;
    const std::string where = "structured_outputs." + k;
    if (k == "json") {
      if (auto e = schema_grammar(x, where, out)) return e;
    } else if (k == "choice") {
      if (auto e = choice_grammar(x, where, out)) return e;
    } else if (k == "json_object") {
      if (!x.is_boolean()) return bad_request("'" + where + "' must be a boolean", where);
      if (!x.get<bool>()) continue;
      *out = structured::any_json_object_grammar();
    } else if (k == "regex" || k == "grammar" || k == "structural_tag") {
      return unsupported_field(where, "only 'json', 'json_object' and 'choice' are supported");
    } else if (k == "disable_any_whitespace" || k == "disable_additional_properties" || k == "whitespace_pattern" ||
               k == "disable_fallback") {
      continue;  // options of other engines' backends; this engine's behaviour is documented
    } else {
      return unsupported_field(where, "unknown structured_outputs key");
    }
    ++n;
  }
  if (n > 1) return bad_request("'structured_outputs' must set only one of json, json_object, choice", "structured_outputs");
  return std::nullopt;
}

}  // namespace

const std::vector<std::string>& structured_output_fields() {
  static const std::vector<std::string> v = {"response_format", "guided_json",  "guided_choice",
                                             "guided_regex",    "guided_grammar", "structured_outputs",
                                             "guided_decoding_backend", "guided_whitespace_pattern"};
  return v;
}

std::optional<ApiError> parse_structured_output(const OrderedJson& body,
                                                std::shared_ptr<const structured::Grammar>* grammar) {
  std::vector<std::string> given;
  static const std::vector<std::string> kFields = {"response_format", "guided_json",    "guided_choice",
                                                   "guided_regex",    "guided_grammar", "structured_outputs"};
  for (const std::string& f : kFields) {
    const OrderedJson* v = field(body, f);
    if (!v) continue;
    if (f == "response_format" && v->is_object() && v->value("type", "") == "text") continue;
    given.push_back(f);
  }
  if (given.size() > 1)
    return bad_request("'" + given[0] + "' and '" + given[1] + "' both ask for structured output; give one", given[1]);
  if (field(body, "guided_whitespace_pattern"))
    return unsupported_field("guided_whitespace_pattern", "whitespace is fixed (at most one space or newline between "
                                                          "JSON tokens)");
  if (given.empty()) {
    if (const OrderedJson* v = field(body, "response_format")) return response_format(*v, grammar);  // type checks
    return std::nullopt;
  }
  const std::string& f = given[0];
  const OrderedJson& v = *field(body, f);
  if (f == "response_format") return response_format(v, grammar);
  if (f == "guided_json") return schema_grammar(v, f, grammar);
  if (f == "guided_choice") return choice_grammar(v, f, grammar);
  if (f == "structured_outputs") return structured_outputs(v, grammar);
  if (f == "guided_regex")
    return unsupported_field(f, "regular expressions are not supported; use guided_choice or guided_json");
  return unsupported_field(f, "grammars are not supported; use guided_json or response_format json_schema");
}

}  // namespace mxserve::server
