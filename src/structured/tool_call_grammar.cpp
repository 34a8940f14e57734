// Tool calls -> Grammar (tool_call_grammar.h). The node graph:
//   root   = calls | [\n]think_open RAW(think_close) calls (optional block) | RAW(think_close) calls (open)
//   calls  = REPEAT(1..max_calls, SEQ(call_open, ANYOF(tool...)))
//   tool   = SEQ(name after_name, TAGOBJECT(key_open K key_to_value -> value ..., close call_close))
//   value  = raw string: RAW(value_close, never call_close) after_value | LITERALS(enum + value_close + after_value)
//            other:      SEQ(JSON(schema), value_close after_value)
// The call_open prefix is shared, so the matcher forks per tool only at the first byte of the name.
#include "structured/tool_call_grammar.h"

#include <algorithm>
#include <set>

namespace mxserve::structured {
namespace {

using json = nlohmann::ordered_json;

bool is_edge_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

class ToolGrammarBuilder {
 public:
  ToolGrammarBuilder(const ToolCallGrammarRequest& r, std::vector<std::string>* ignored)
      : r_(r), ignored_(ignored), g_(std::make_shared<Grammar>()) {
    g_->tag_safe_strings = true;  // before the values compile: pattern automata exclude "</"
  }

  Result<std::shared_ptr<const Grammar>> run() {
    const ToolCallSyntax& s = r_.syntax;
    if (r_.tools.empty()) return invalid_argument("a tool-call grammar needs at least one tool");
    if (s.call_open.empty() || s.value_close.empty() || s.call_close.empty() || s.key_open.empty())
      return invalid_argument("the tool-call syntax has an empty tag");
    Node tools = make(NodeKind::kAnyOf);
    for (const ToolSpec& t : r_.tools) {
      MX_ASSIGN_OR_RETURN(int32_t n, tool(t));
      tools.alts.push_back(n);
    }
    Node call = make(NodeKind::kSequence);
    call.alts = {literal(s.call_open), g_->add(std::move(tools))};
    Node calls = make(NodeKind::kRepeat);
    calls.item = g_->add(std::move(call));
    calls.min_items = 1;
    calls.max_items = r_.max_calls;
    const int32_t calls_node = g_->add(std::move(calls));
    switch (r_.reasoning) {
      case ReasoningPrefix::kNone:
        g_->root = calls_node;
        break;
      case ReasoningPrefix::kOpen:
        g_->root = sequence({raw_text({s.think_close}), calls_node});
        break;
      case ReasoningPrefix::kOptional: {
        if (s.think_open.empty()) return invalid_argument("an optional reasoning block needs think_open");
        // The block may also open without think_open's leading newline (the parsers skip leading whitespace).
        Node either = make(NodeKind::kAnyOf);
        const int32_t thought = raw_text({s.think_close});
        either.alts = {sequence({literal(s.think_open), thought, calls_node}), calls_node};
        if (s.think_open.size() > 1 && s.think_open[0] == '\n')
          either.alts.push_back(sequence({literal(s.think_open.substr(1)), thought, calls_node}));
        g_->root = g_->add(std::move(either));
        break;
      }
    }
    g_->json = true;
    g_->leading_ws = false;
    g_->tag_safe_strings = true;
    g_->close_within_budget = true;
    g_->describe = "tool_calls(" + std::to_string(r_.tools.size()) + " tools" +
                   (r_.max_calls > 0 ? ", at most " + std::to_string(r_.max_calls) : std::string()) + ")";
    MX_RETURN_IF_ERROR(g_->finalize());
    return std::shared_ptr<const Grammar>(g_);
  }

 private:
  static Node make(NodeKind k) {
    Node n;
    n.kind = k;
    return n;
  }
  int32_t literal(const std::string& text) {
    Node n = make(NodeKind::kLiterals);
    n.literals = {text};
    return g_->add(std::move(n));
  }
  int32_t sequence(std::vector<int32_t> items) {
    Node n = make(NodeKind::kSequence);
    n.alts = std::move(items);
    return g_->add(std::move(n));
  }
  int32_t raw_text(std::vector<std::string> delimiters) {
    Node n = make(NodeKind::kRawText);
    n.literals = std::move(delimiters);
    return g_->add(std::move(n));
  }
  void ignore(const std::string& what) {
    if (ignored_) ignored_->push_back(what);
  }

  Result<int32_t> tool(const ToolSpec& t) {
    const ToolCallSyntax& s = r_.syntax;
    Node obj = make(NodeKind::kTagObject);
    obj.literals = {s.call_close};
    obj.ordered = t.args.size() > 32;
    for (const ToolArg& a : t.args) {
      const std::string where = t.field + "/properties/" + a.key;
      const bool writable = !a.key.empty() && a.key.find('<') == std::string::npos && !is_edge_space(a.key.front()) &&
                            !is_edge_space(a.key.back());
      if (!writable) {
        if (a.required)
          return invalid_argument("required property " + json(a.key).dump() + " of " + t.field +
                                  " cannot be written as a tool-call key (it is empty, has '<' or edge whitespace)");
        ignore("property " + json(a.key).dump() + " (not writable as a key) at " + t.field);
        continue;
      }
      MX_ASSIGN_OR_RETURN(int32_t v, value(t, a, where));
      obj.props.push_back(Property{s.key_open + a.key + s.key_to_value, v, a.required});
    }
    const int32_t args = g_->add(std::move(obj));
    return sequence({literal(t.name + s.after_name), args});
  }

  Result<int32_t> value(const ToolSpec& t, const ToolArg& a, const std::string& where) {
    const ToolCallSyntax& s = r_.syntax;
    const std::string end = s.value_close + s.after_value;
    if (!a.raw_string) {  // the same rules as response_format: an unsupported keyword is an error
      auto node = add_json_schema(g_.get(), t.parameters, a.schema, where, SchemaOptions{});
      if (!node.is_ok()) return invalid_argument(node.status().message());
      return sequence({*node, literal(end)});
    }
    if (a.schema.is_object()) {
      const auto& known = supported_schema_keywords();
      static const std::set<std::string> not_for_strings = {
          "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "items", "minItems",
          "maxItems", "properties", "required", "additionalProperties"};
      for (const auto& [k, v] : a.schema.items()) {
        if (std::find(known.begin(), known.end(), k) == known.end())
          return invalid_argument("unsupported keyword '" + k + "' at " + where);
        if (not_for_strings.count(k))
          return invalid_argument("keyword '" + k + "' does not apply to type 'string' at " + where);
      }
    }
    std::vector<std::string> choices;
    bool listed = false;
    if (a.schema.is_object())
      for (const char* key : {"enum", "const"}) {
        auto it = a.schema.find(key);
        if (it == a.schema.end()) continue;
        listed = true;
        for (const json& v : it->is_array() && std::string(key) == "enum" ? *it : json::array({*it}))
          if (v.is_string()) choices.push_back(v.get<std::string>() + end);
      }
    if (listed) {
      if (choices.empty()) return invalid_argument("'enum'/'const' of string property at " + where + " has no string");
      std::sort(choices.begin(), choices.end());
      choices.erase(std::unique(choices.begin(), choices.end()), choices.end());
      Node n = make(NodeKind::kLiterals);
      n.literals = std::move(choices);
      return g_->add(std::move(n));
    }
    bool needs_terminator = false;
    MX_ASSIGN_OR_RETURN(int32_t raw, add_raw_string(g_.get(), a.schema, {s.value_close, s.call_close}, &needs_terminator, where));
    if (needs_terminator) return sequence({raw, literal(end)});
    if (s.after_value.empty()) return raw;
    return sequence({raw, literal(s.after_value)});
  }

  const ToolCallGrammarRequest& r_;
  std::vector<std::string>* ignored_;
  std::shared_ptr<Grammar> g_;
};

}  // namespace

Result<std::shared_ptr<const Grammar>> compile_tool_calls(const ToolCallGrammarRequest& request,
                                                          std::vector<std::string>* ignored) {
  return ToolGrammarBuilder(request, ignored).run();
}

}  // namespace mxserve::structured
