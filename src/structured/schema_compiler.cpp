// JSON schema -> Grammar (grammar.h). One pass over the schema; $ref to "#/$defs/NAME" (or
// "#/definitions/NAME") compiles each definition once, so recursive schemas become cycles in the node
// graph. Every keyword is either understood, an annotation (ignored), or an error naming it.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "core/check.h"
#include "structured/grammar.h"
#include "structured/matcher.h"
#include "structured/number_bounds.h"

namespace mxserve::structured {
namespace {

using json = nlohmann::ordered_json;

const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> s = {"title", "description", "default", "examples", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "$defs", "definitions"};
  return s;
}

const std::set<std::string>& understood_keywords() {
  static const std::set<std::string> s = {"type",  "properties", "required", "additionalProperties", "items",
                                          "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
                                          "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
                                          "minLength", "maxLength", "pattern", "format"};
  return s;
}

Node make_node(NodeKind kind) {
  Node n;
  n.kind = kind;
  return n;
}

bool json_type_is(const json& v, const std::string& type) {
  if (type == "null") return v.is_null();
  if (type == "boolean") return v.is_boolean();
  if (type == "string") return v.is_string();
  if (type == "integer") return v.is_number_integer() || (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())));
  if (type == "number") return v.is_number();
  if (type == "array") return v.is_array();
  if (type == "object") return v.is_object();
  return false;
}

class Compiler {
 public:
  Compiler(Grammar* g, const json& root, const SchemaOptions& options) : root_(root), g_(g), options_(options) {}

  Result<int32_t> compile_node(const json& schema, const std::string& path) { return compile(schema, path); }

 private:
  int32_t add(Node n) { return g_->add(std::move(n)); }
  static Status err(const std::string& path, const std::string& what) {
    return invalid_argument(what + " at " + (path.empty() ? "/" : path));
  }

  int32_t literals(std::vector<std::string> lits) {
    std::sort(lits.begin(), lits.end());
    lits.erase(std::unique(lits.begin(), lits.end()), lits.end());
    Node n;
    n.kind = NodeKind::kLiterals;
    n.literals = std::move(lits);
    return add(std::move(n));
  }

  int32_t any_value() {
    if (any_value_ >= 0) return any_value_;
    any_value_ = add(make_node(NodeKind::kAnyOf));
    Node obj = make_node(NodeKind::kAnyObject);
    obj.item = any_value_;
    Node arr = make_node(NodeKind::kArray);
    arr.item = any_value_;
    const int32_t o = add(std::move(obj)), a = add(std::move(arr)), s = add(make_node(NodeKind::kString)),
                  num = add(make_node(NodeKind::kNumber)), lit = literals({"true", "false", "null"});
    g_->nodes[any_value_].alts = {o, a, s, num, lit};
    return any_value_;
  }

  Result<int32_t> ref(const std::string& target, const std::string& path) {
    if (target == "#") return err(path, "'$ref': \"#\" (a recursive root) is not supported");
    std::string name, container;
    for (const char* key : {"$defs", "definitions"}) {
      const std::string prefix = std::string("#/") + key + "/";
      if (target.rfind(prefix, 0) == 0) {
        name = target.substr(prefix.size());
        container = key;
      }
    }
    const bool found = !name.empty() && name.find('/') == std::string::npos && root_.contains(container) &&
                       root_[container].is_object() && root_[container].contains(name);
    if (!found) return err(path, "'$ref': " + json(target).dump() + " must name an entry of the root's $defs or definitions");
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    // A placeholder alternative first, so a recursive reference finds it; it forwards to the definition.
    const int32_t slot = add(make_node(NodeKind::kAnyOf));
    refs_[target] = slot;
    MX_ASSIGN_OR_RETURN(int32_t body, compile(root_[container][name], "/" + container + "/" + name));
    g_->nodes[slot].alts = {body};
    return slot;
  }

  Result<int32_t> compile(const json& s, const std::string& path) {
    if (++depth_ > 64) return err(path, "schema nesting deeper than 64");
    auto r = compile_inner(s, path);
    --depth_;
    return r;
  }

  Result<int32_t> compile_inner(const json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value();
      return err(path, "schema 'false' matches nothing");
    }
    if (!s.is_object()) return err(path, "a schema must be an object or a boolean");
    for (const auto& [k, v] : s.items()) {
      if (understood_keywords().count(k) || annotation_keywords().count(k)) continue;
      if (!options_.lenient) return err(path, "unsupported keyword '" + k + "'");
      if (options_.ignored) options_.ignored->push_back("'" + k + "' at " + (path.empty() ? "/" : path));
    }
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) return err(path, "'$ref' must be a string");
      for (const auto& [k, v] : s.items())
        if (understood_keywords().count(k) && k != "$ref") return err(path, "'$ref' next to '" + k + "' is not supported");
      return ref(s["$ref"].get<std::string>(), path);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array() && !t.empty())
        for (const auto& x : t) {
          if (!x.is_string()) return err(path, "'type' must be a string or a list of strings");
          types.push_back(x.get<std::string>());
        }
      else return err(path, "'type' must be a string or a non-empty list of strings");
      static const std::set<std::string> known = {"object", "array", "string", "number", "integer", "boolean", "null"};
      for (const auto& t2 : types)
        if (!known.count(t2)) return err(path, "unknown type " + json(t2).dump());
    }
    auto type_ok = [&](const json& v) {
      if (types.empty()) return true;
      for (const auto& t : types)
        if (json_type_is(v, t)) return true;
      return false;
    };
    if (s.contains("const") || s.contains("enum")) {
      std::vector<std::string> lits;
      if (s.contains("const")) {
        if (type_ok(s["const"])) lits.push_back(s["const"].dump());
      } else {
        if (!s["enum"].is_array() || s["enum"].empty()) return err(path, "'enum' must be a non-empty list");
        for (const auto& v : s["enum"])
          if (type_ok(v)) lits.push_back(v.dump());
      }
      if (lits.empty()) return err(path, "no value of 'enum'/'const' has the schema's 'type'");
      return literals(std::move(lits));
    }
    for (const char* comb : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(comb)) continue;
      const json& list = s[comb];
      if (!list.is_array() || list.empty()) return err(path, "'" + std::string(comb) + "' must be a non-empty list");
      if (std::string(comb) == "allOf" && list.size() != 1)
        return err(path, "'allOf' with more than one schema is not supported");
      for (const auto& [k, v] : s.items())
        if (understood_keywords().count(k) && k != comb)
          return err(path, "'" + std::string(comb) + "' next to '" + k + "' is not supported");
      Node n = make_node(NodeKind::kAnyOf);
      for (size_t i = 0; i < list.size(); ++i) {
        MX_ASSIGN_OR_RETURN(int32_t alt, compile(list[i], path + "/" + comb + "/" + std::to_string(i)));
        n.alts.push_back(alt);
      }
      return add(std::move(n));
    }
    if (types.empty()) {  // infer from the keywords present
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) types = {"object"};
      else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) types = {"array"};
      else if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength") || s.contains("format")) types = {"string"};
      else if (s.contains("multipleOf")) types = {"integer"};
      else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum"))
        types = {"number"};
      else return any_value();
    }
    Node alt = make_node(NodeKind::kAnyOf);
    for (const auto& t : types) {
      MX_ASSIGN_OR_RETURN(int32_t n, compile_type(s, t, path));
      alt.alts.push_back(n);
    }
    if (alt.alts.size() == 1) return alt.alts[0];
    return add(std::move(alt));
  }

  Result<int32_t> compile_type(const json& s, const std::string& t, const std::string& path) {
    auto only_for = [&](const std::vector<std::string>& keys, const std::string& type) -> Status {
      for (const auto& k : keys)
        if (s.contains(k) && t != type) {
          // A keyword of another type: fine when that type is also listed (type: [object, null]).
          const json& ty = s["type"];
          const bool listed = ty.is_array() && std::find(ty.begin(), ty.end(), json(type)) != ty.end();
          if (!listed) return err(path, "keyword '" + k + "' does not apply to type '" + t + "'");
        }
      return Status::ok();
    };
    MX_RETURN_IF_ERROR(only_for({"properties", "required", "additionalProperties"}, "object"));
    MX_RETURN_IF_ERROR(only_for({"items", "minItems", "maxItems"}, "array"));
    MX_RETURN_IF_ERROR(only_for({"minLength", "maxLength", "pattern", "format"}, "string"));
    if (t != "number") MX_RETURN_IF_ERROR(only_for({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}, "integer"));
    if (t == "string") return compile_string(s, path);
    if (t == "number" || t == "integer") return compile_number(s, t == "integer", path);
    if (t == "boolean") return literals({"true", "false"});
    if (t == "null") return literals({"null"});
    if (t == "array") return compile_array(s, path);
    return compile_object(s, path);
  }

  Status length_bounds(const json& s, const std::string& path, int64_t* min_len, int64_t* max_len) {
    for (const char* key : {"minLength", "maxLength"}) {
      if (!s.contains(key)) continue;
      const json& v = s[key];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1000000)
        return err(path, "'" + std::string(key) + "' must be an integer in [0, 1000000]");
      *(std::string(key) == "minLength" ? min_len : max_len) = v.get<int64_t>();
    }
    if (*max_len >= 0 && *max_len < *min_len) return err(path, "'maxLength' is below 'minLength'");
    return Status::ok();
  }

 public:
  // The automaton of `pattern` / `format` (empty pattern string: none). Shared with tool raw strings.
  Result<std::string> string_pattern(const json& s, const std::string& path) {
    if (s.contains("pattern") && s.contains("format")) return err(path, "'pattern' next to 'format' is not supported");
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return err(path, "'pattern' must be a string");
      return s["pattern"].get<std::string>();
    }
    if (s.contains("format")) {
      if (!s["format"].is_string()) return err(path, "'format' must be a string");
      const std::string f = s["format"].get<std::string>();
      std::string p = format_pattern(f);
      if (p.empty())
        return err(path, "'format': " + json(f).dump() + " is not supported (supported: date-time, date, time, uuid, email, ipv4)");
      return p;
    }
    return std::string();
  }
  Result<int32_t> add_dfa(const std::string& pattern, RegexOptions o, const std::string& path) {
    auto dfa = compile_regex(pattern, o);
    if (!dfa.is_ok()) return err(path, dfa.status().message());
    g_->dfas.push_back(*dfa);
    return static_cast<int32_t>(g_->dfas.size()) - 1;
  }
  // A raw-text tool value (no quotes) with the string keywords: kDfaText with pattern / format, else
  // kRawText up to `terminators[0]` with the length bounds (the caller appends the terminator after a DFA).
  Result<int32_t> raw_string(const json& s, const std::vector<std::string>& terminators, bool* needs_terminator,
                             const std::string& path) {
    int64_t min_len = 0, max_len = -1;
    if (s.is_object()) MX_RETURN_IF_ERROR(length_bounds(s, path, &min_len, &max_len));
    std::string pattern;
    if (s.is_object()) {
      MX_ASSIGN_OR_RETURN(pattern, string_pattern(s, path));
    }
    Node n = make_node(pattern.empty() ? NodeKind::kRawText : NodeKind::kDfaText);
    n.min_len = min_len;
    n.max_len = max_len;
    *needs_terminator = !pattern.empty();
    if (pattern.empty()) {
      n.literals = terminators;
    } else {
      RegexOptions o;
      o.text = RegexOptions::Text::kRawText;
      o.no_close_tag = true;
      o.min_chars = min_len;
      o.max_chars = max_len;
      MX_ASSIGN_OR_RETURN(n.dfa, add_dfa(pattern, o, path));
    }
    return add(std::move(n));
  }

 private:
  Result<int32_t> compile_string(const json& s, const std::string& path) {
    Node n = make_node(NodeKind::kString);
    MX_RETURN_IF_ERROR(length_bounds(s, path, &n.min_len, &n.max_len));
    MX_ASSIGN_OR_RETURN(std::string pattern, string_pattern(s, path));
    if (!pattern.empty()) {
      RegexOptions o;
      o.no_close_tag = g_->tag_safe_strings;
      o.min_chars = n.min_len;
      o.max_chars = n.max_len;
      MX_ASSIGN_OR_RETURN(n.dfa, add_dfa(pattern, o, path));
    }
    return add(std::move(n));
  }

  // minimum / maximum / exclusiveMinimum / exclusiveMaximum (numbers, or draft-4 booleans next to
  // minimum / maximum) and multipleOf (integers).
  Result<int32_t> compile_number(const json& s, bool integer, const std::string& path) {
    Node n = make_node(integer ? NodeKind::kInteger : NodeKind::kNumber);
    auto num = [&](const char* key) -> Result<std::optional<double>> {
      if (!s.contains(key)) return std::optional<double>();
      const json& v = s[key];
      if (v.is_boolean()) return std::optional<double>();
      if (!v.is_number()) return err(path, "'" + std::string(key) + "' must be a number");
      return std::optional<double>(v.get<double>());
    };
    MX_ASSIGN_OR_RETURN(auto mn, num("minimum"));
    MX_ASSIGN_OR_RETURN(auto mx, num("maximum"));
    MX_ASSIGN_OR_RETURN(auto xmn, num("exclusiveMinimum"));
    MX_ASSIGN_OR_RETURN(auto xmx, num("exclusiveMaximum"));
    const bool draft4_lo = s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean() && s["exclusiveMinimum"].get<bool>();
    const bool draft4_hi = s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean() && s["exclusiveMaximum"].get<bool>();
    // The tighter of the inclusive and exclusive bound on each side.
    std::optional<double> lo = mn, hi = mx;
    bool lo_excl = draft4_lo && mn.has_value(), hi_excl = draft4_hi && mx.has_value();
    if (xmn && (!lo || *xmn >= *lo)) lo = xmn, lo_excl = true;
    if (xmx && (!hi || *xmx <= *hi)) hi = xmx, hi_excl = true;
    if (integer) {
      constexpr double kSafe = static_cast<double>(kMaxSafeInteger);
      if (lo) n.int_lo = static_cast<int64_t>(std::max(-kSafe, std::min(kSafe + 1, lo_excl ? std::floor(*lo) + 1 : std::ceil(*lo))));
      if (hi) n.int_hi = static_cast<int64_t>(std::min(kSafe, std::max(-kSafe - 1, hi_excl ? std::ceil(*hi) - 1 : std::floor(*hi))));
      if (s.contains("multipleOf")) {
        const json& m = s["multipleOf"];
        if (!m.is_number() || m.get<double>() < 1 || m.get<double>() != std::floor(m.get<double>()) || m.get<double>() > kSafe)
          return err(path, "'multipleOf' must be a positive integer for type 'integer'");
        n.multiple_of = static_cast<int64_t>(m.get<double>());
      }
      if (bounds::min_value_bytes(n) < 0)
        return err(path, "no integer in JSON's safe range satisfies 'minimum'/'maximum'/'multipleOf'");
      return add(std::move(n));
    }
    if (s.contains("multipleOf")) return err(path, "'multipleOf' is supported for type 'integer' only");
    if (lo || hi) {
      n.bounded = true;
      n.lo = lo ? *lo : -1e300;
      n.hi = hi ? *hi : 1e300;
      n.lo_excl = lo_excl;
      n.hi_excl = hi_excl;
      if (bounds::min_value_bytes(n) < 0) return err(path, "no number satisfies 'minimum'/'maximum'");
    }
    return add(std::move(n));
  }

  Result<int32_t> compile_array(const json& s, const std::string& path) {
    Node n = make_node(NodeKind::kArray);
    auto count = [&](const char* key, int64_t* out) -> Status {
      if (!s.contains(key)) return Status::ok();
      const json& v = s[key];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 100000)
        return err(path, "'" + std::string(key) + "' must be an integer in [0, 100000]");
      *out = v.get<int64_t>();
      return Status::ok();
    };
    MX_RETURN_IF_ERROR(count("minItems", &n.min_items));
    MX_RETURN_IF_ERROR(count("maxItems", &n.max_items));
    if (n.max_items >= 0 && n.max_items < n.min_items) return err(path, "'maxItems' is below 'minItems'");
    if (s.contains("items")) {
      if (s["items"].is_array()) return err(path, "'items' as a list (tuple validation) is not supported");
      MX_ASSIGN_OR_RETURN(n.item, compile(s["items"], path + "/items"));
    } else {
      n.item = any_value();
    }
    return add(std::move(n));
  }

  Result<int32_t> compile_object(const json& s, const std::string& path) {
    const json* props = s.contains("properties") ? &s["properties"] : nullptr;
    if (props && !props->is_object()) return err(path, "'properties' must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return err(path, "'required' must be a list of strings");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) return err(path, "'required' must be a list of strings");
        if (!props || !props->contains(r.get<std::string>()))
          return err(path, "required property " + r.dump() + " is not in 'properties'");
        required.insert(r.get<std::string>());
      }
    }
    if (s.contains("additionalProperties")) {
      const json& ap = s["additionalProperties"];
      if (ap.is_object() && !(props && !props->empty())) {  // a map: any keys, values of that schema
        Node n = make_node(NodeKind::kAnyObject);
        MX_ASSIGN_OR_RETURN(n.item, compile(ap, path + "/additionalProperties"));
        return add(std::move(n));
      }
      if (!ap.is_boolean())
        return err(path, "'additionalProperties' as a schema next to 'properties' is not supported (use false)");
    }
    if (!props && !s.contains("additionalProperties")) {  // {"type": "object"}: any object
      Node n = make_node(NodeKind::kAnyObject);
      n.item = any_value();
      return add(std::move(n));
    }
    Node n = make_node(NodeKind::kObject);
    if (props)
      for (const auto& [name, sub] : props->items()) {
        std::string escaped;
        for (char c : name) escaped += (c == '~') ? "~0" : (c == '/') ? "~1" : std::string(1, c);
        MX_ASSIGN_OR_RETURN(int32_t v, compile(sub, path + "/properties/" + escaped));
        n.props.push_back(Property{json(name).dump(), v, required.count(name) > 0});
      }
    return add(std::move(n));
  }

  const json& root_;
  Grammar* g_;
  SchemaOptions options_;
  std::map<std::string, int32_t> refs_;
  int32_t any_value_ = -1;
  int depth_ = 0;
};

}  // namespace

const std::vector<std::string>& supported_schema_keywords() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out(understood_keywords().begin(), understood_keywords().end());
    out.insert(out.end(), annotation_keywords().begin(), annotation_keywords().end());
    return out;
  }();
  return v;
}

Result<int32_t> add_json_schema(Grammar* g, const nlohmann::ordered_json& root, const nlohmann::ordered_json& schema,
                                const std::string& path, const SchemaOptions& options) {
  return Compiler(g, root, options).compile_node(schema, path);
}

Result<int32_t> add_raw_string(Grammar* g, const nlohmann::ordered_json& schema, const std::vector<std::string>& terminators,
                               bool* needs_terminator, const std::string& path) {
  const nlohmann::ordered_json root = nlohmann::ordered_json::object();
  return Compiler(g, root, SchemaOptions{}).raw_string(schema, terminators, needs_terminator, path);
}

Result<std::shared_ptr<const Grammar>> compile_json_schema(const nlohmann::ordered_json& schema) {
  auto g = std::make_shared<Grammar>();
  MX_ASSIGN_OR_RETURN(g->root, add_json_schema(g.get(), schema, schema, "", SchemaOptions{}));
  g->json = true;
  g->describe = "json_schema";
  MX_RETURN_IF_ERROR(g->finalize());
  return std::shared_ptr<const Grammar>(g);
}

std::shared_ptr<const Grammar> any_json_object_grammar() {
  static const std::shared_ptr<const Grammar> g = [] {
    auto r = compile_json_schema(json{{"type", "object"}});
    MX_CHECK_MSG(r.is_ok(), "the json_object grammar must compile");
    auto copy = std::make_shared<Grammar>(**r);
    copy->describe = "json_object";
    return std::shared_ptr<const Grammar>(copy);
  }();
  return g;
}

Result<std::shared_ptr<const Grammar>> compile_choice(const std::vector<std::string>& choices) {
  if (choices.empty()) return invalid_argument("the list of choices is empty");
  std::set<std::string> seen;
  for (const auto& c : choices) {
    if (c.empty()) return invalid_argument("a choice is the empty string");
    if (!seen.insert(c).second) return invalid_argument("choice " + json(c).dump() + " is listed twice");
  }
  auto g = std::make_shared<Grammar>();
  Node n = make_node(NodeKind::kLiterals);
  n.literals.assign(seen.begin(), seen.end());
  g->nodes.push_back(std::move(n));
  g->root = 0;
  g->json = false;
  g->describe = "choice(" + std::to_string(choices.size()) + ")";
  MX_RETURN_IF_ERROR(g->finalize());
  return std::shared_ptr<const Grammar>(g);
}

}  // namespace mxserve::structured

namespace mxserve::structured {

Status Grammar::finalize() {
  const size_t n = nodes.size();
  std::vector<char> productive(n, 0);
  // The fewest bytes of each number node's values (bounded ones: a digit search, done once here).
  std::vector<int64_t> number_bytes(n, -1);
  for (size_t i = 0; i < n; ++i) {
    const Node& nd = nodes[i];
    if (nd.kind == NodeKind::kInteger || (nd.kind == NodeKind::kNumber && nd.bounded)) number_bytes[i] = bounds::min_value_bytes(nd);
    else if (nd.kind == NodeKind::kNumber) number_bytes[i] = 1;
  }
  auto set_bit = [](std::array<uint64_t, 4>& s, uint8_t b) { s[b >> 6] |= uint64_t{1} << (b & 63); };
  for (bool changed = true; changed;) {  // fixpoint over cycles ($ref, any value)
    changed = false;
    for (size_t i = 0; i < n; ++i) {
      Node& nd = nodes[i];
      std::array<uint64_t, 4> first{};
      bool prod = false;
      switch (nd.kind) {
        case NodeKind::kObject:
        case NodeKind::kAnyObject:
          set_bit(first, '{');
          prod = true;
          for (const Property& p : nd.props) prod = prod && productive[p.value];
          break;
        case NodeKind::kArray:
          set_bit(first, '[');
          prod = nd.min_items == 0 || productive[nd.item];
          break;
        case NodeKind::kString:
          set_bit(first, '"');
          prod = true;
          break;
        case NodeKind::kNumber:
        case NodeKind::kInteger: {
          const bool bounded = nd.kind == NodeKind::kInteger || nd.bounded;
          if (!bounded || bounds::may_be_negative(nd)) set_bit(first, '-');
          if (!bounded || bounds::may_be_nonnegative(nd))
            for (uint8_t d = '0'; d <= '9'; ++d) set_bit(first, d);
          prod = number_bytes[i] >= 0;
          break;
        }
        case NodeKind::kDfaText:
          for (int b = 0; b < 256; ++b)
            if (dfas[nd.dfa]->step(0, static_cast<uint8_t>(b)) >= 0) set_bit(first, static_cast<uint8_t>(b));
          prod = true;
          break;
        case NodeKind::kLiterals:
          for (const auto& l : nd.literals) set_bit(first, static_cast<uint8_t>(l[0]));
          prod = !nd.literals.empty();
          break;
        case NodeKind::kAnyOf:
          for (int32_t a : nd.alts) {
            if (!productive[a]) continue;  // an unproductive alternative never starts
            for (int w = 0; w < 4; ++w) first[w] |= nodes[a].first[w];
            prod = true;
          }
          break;
        case NodeKind::kSequence:
          prod = !nd.alts.empty();
          for (int32_t a : nd.alts) prod = prod && productive[a];
          if (!nd.alts.empty()) first = nodes[nd.alts[0]].first;
          break;
        case NodeKind::kRepeat:
          first = nodes[nd.item].first;
          prod = productive[nd.item] && nd.min_items >= 1;
          break;
        case NodeKind::kRawText:
          for (int b = 0; b < 256; ++b)
            if (raw_lexer::next(0, static_cast<uint8_t>(b)) >= 0) set_bit(first, static_cast<uint8_t>(b));
          prod = !nd.literals.empty();
          break;
        case NodeKind::kTagObject:
          prod = !nd.literals.empty() && !nd.literals[0].empty();
          if (prod) set_bit(first, static_cast<uint8_t>(nd.literals[0][0]));
          for (const Property& p : nd.props) {
            prod = prod && productive[p.value] && !p.key.empty();
            if (!p.key.empty()) set_bit(first, static_cast<uint8_t>(p.key[0]));
          }
          break;
      }
      if (first != nd.first || static_cast<char>(prod) != productive[i]) {
        nd.first = first;
        productive[i] = prod;
        changed = true;
      }
    }
  }
  for (const Node& nd : nodes) {
    if (nd.kind == NodeKind::kRawText)
      for (const std::string& l : nd.literals) {
        bool ascii = true;
        for (char c : l) ascii = ascii && static_cast<uint8_t>(c) < 0x80;
        if (l.empty() || l[0] != '<' || l.size() > 255 || !ascii)
          return invalid_argument("raw text delimiter " + nlohmann::ordered_json(l).dump() + " must be ASCII, start with '<', at most 255 bytes");
      }
    if (nd.kind == NodeKind::kTagObject && !nd.ordered && nd.props.size() > 32)
      return invalid_argument("a tagged object with more than 32 properties must be ordered");
  }
  for (size_t i = 0; i < n; ++i)
    if (!productive[i] && nodes[i].kind != NodeKind::kAnyOf)
      return invalid_argument("the schema requires a value that can never be completed (a required recursive $ref?)");
  if (!productive[root]) return invalid_argument("the schema matches nothing");
  compute_min_bytes(number_bytes);
  return Status::ok();
}

}  // namespace mxserve::structured

namespace mxserve::structured {

void Grammar::compute_min_bytes(const std::vector<int64_t>& number_bytes) {
  constexpr int64_t kInf = int64_t{1} << 40;
  for (Node& nd : nodes) nd.min_bytes = kInf;
  auto mb = [&](int32_t i) { return nodes[i].min_bytes; };
  for (bool changed = true; changed;) {
    changed = false;
    for (Node& nd : nodes) {
      int64_t v = kInf;
      switch (nd.kind) {
        case NodeKind::kObject: {
          int64_t sum = 2, req = 0;
          for (const Property& p : nd.props)
            if (p.required) sum += static_cast<int64_t>(p.key.size()) + 1 + mb(p.value), ++req;
          v = sum + std::max<int64_t>(req - 1, 0);
          break;
        }
        case NodeKind::kAnyObject: v = 2; break;
        case NodeKind::kArray:
          v = 2 + (nd.min_items > 0 ? nd.min_items * mb(nd.item) + nd.min_items - 1 : 0);
          break;
        case NodeKind::kString: v = 2 + (nd.dfa >= 0 ? dfas[nd.dfa]->dist[0] : nd.min_len); break;
        case NodeKind::kNumber:
        case NodeKind::kInteger: {
          v = number_bytes[static_cast<size_t>(&nd - nodes.data())];
          if (v < 0) v = kInf;
          break;
        }
        case NodeKind::kLiterals:
          for (const auto& l : nd.literals) v = std::min<int64_t>(v, static_cast<int64_t>(l.size()));
          break;
        case NodeKind::kAnyOf:
          for (int32_t a : nd.alts) v = std::min(v, mb(a));
          break;
        case NodeKind::kSequence:
          v = 0;
          for (int32_t a : nd.alts) v += mb(a);
          break;
        case NodeKind::kRepeat: v = nd.min_items * mb(nd.item); break;
        case NodeKind::kRawText: v = nd.min_len + static_cast<int64_t>(nd.literals[0].size()); break;
        case NodeKind::kDfaText: v = dfas[nd.dfa]->dist[0]; break;
        case NodeKind::kTagObject:
          v = static_cast<int64_t>(nd.literals[0].size());
          for (const Property& p : nd.props)
            if (p.required) v += static_cast<int64_t>(p.key.size()) + mb(p.value);
          break;
      }
      v = std::min(v, kInf);
      if (v != nd.min_bytes) {
        nd.min_bytes = v;
        changed = true;
      }
    }
  }
}

}  // namespace mxserve::structured
