// JSON-schema value keywords in the grammar: minimum / maximum / exclusiveMinimum / exclusiveMaximum /
// multipleOf, the default safe-integer range, minLength / maxLength, pattern (the regex subset and its
// errors), format, minItems / maxItems -- accepted and rejected strings through the matcher, prefixes
// that are cut at the first impossible byte, the token mask against the brute force, and the closing
// (fewest bytes to complete, a shortest completion) on these nodes.
#include <gtest/gtest.h>

#include <random>

#include "structured/grammar_constraint.h"
#include "structured/regex.h"
#include "test_support.h"

namespace mxserve::structured {
namespace {

using OJ = nlohmann::ordered_json;

std::shared_ptr<const Grammar> schema(const std::string& text) {
  auto g = compile_json_schema(OJ::parse(text));
  EXPECT_TRUE(g.is_ok()) << text << ": " << g.status().to_string();
  return g.is_ok() ? *g : nullptr;
}

std::string error_of(const std::string& text) {
  auto g = compile_json_schema(OJ::parse(text));
  return g.is_ok() ? std::string("ok") : g.status().message();
}

bool full_match(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.accept(text) && m.can_end();
}

void expect_language(const std::string& s, std::initializer_list<const char*> good, std::initializer_list<const char*> bad) {
  auto g = schema(s);
  ASSERT_NE(g, nullptr);
  for (const char* t : good) EXPECT_TRUE(full_match(g, t)) << s << " should accept " << t;
  for (const char* t : bad) EXPECT_FALSE(full_match(g, t)) << s << " should reject " << t;
}

TEST(SchemaKeywords, IntegerBounds) {
  expect_language(R"({"type":"integer","minimum":0})", {"0", "7", "9007199254740991"},
                  {"-1", "-0", "9007199254740992", "123456789012345678", "1.0"});
  expect_language(R"({"type":"integer","minimum":-5,"maximum":12})", {"-5", "-1", "0", "9", "10", "12"},
                  {"-6", "13", "100", "-10"});
  expect_language(R"({"type":"integer","exclusiveMinimum":3,"exclusiveMaximum":7})", {"4", "6"}, {"3", "7", "0"});
  expect_language(R"({"type":"integer","minimum":3,"exclusiveMinimum":true,"maximum":5})", {"4", "5"}, {"3"});
  expect_language(R"({"type":"integer","minimum":0.5,"maximum":2.5})", {"1", "2"}, {"0", "3"});
  expect_language(R"({"type":"integer","multipleOf":5,"minimum":-20,"maximum":20})", {"-20", "-5", "0", "15", "20"},
                  {"-21", "7", "25", "3"});
  expect_language(R"({"type":"integer","minimum":100,"maximum":199})", {"100", "150", "199"}, {"99", "200", "1000"});
  expect_language(R"({"type":"integer","maximum":-10})", {"-10", "-9007199254740991"}, {"-9", "0", "5"});
  // Default range: JSON's safe integers (tool arguments never get 18-digit values).
  expect_language(R"({"type":"integer"})", {"-9007199254740991", "9007199254740991", "0"},
                  {"9007199254740992", "-9007199254740992", "100000000000000000"});
  // The automaton cuts a prefix at the first byte no completion can fix.
  Matcher m(schema(R"({"type":"integer","minimum":5,"maximum":9})"));
  EXPECT_FALSE(m.accept("1"));
  EXPECT_FALSE(m.accept("-"));
  EXPECT_TRUE(m.accept("7"));
  Matcher big(schema(R"({"type":"integer","minimum":0,"maximum":250})"));
  EXPECT_TRUE(big.accept("25"));
  EXPECT_FALSE(big.accept("1"));  // 251
  EXPECT_TRUE(big.accept("0"));
}

TEST(SchemaKeywords, NumberBounds) {
  expect_language(R"({"type":"number","minimum":0.5,"maximum":2.5})", {"0.5", "1", "2.5", "2.49", "1.25"},
                  {"0.4", "2.51", "3", "-1", "0", "1e0"});
  expect_language(R"({"type":"number","exclusiveMinimum":0,"maximum":1})", {"0.1", "1", "0.0001"}, {"0", "0.0", "1.5", "-0.1"});
  expect_language(R"({"type":"number","minimum":-1.5})", {"-1.5", "-1", "0", "12345.5"}, {"-1.6", "-2"});
  expect_language(R"({"type":"number","minimum":0.1,"maximum":0.1})", {"0.1", "0.10"}, {"0.2", "0.09"});
  EXPECT_NE(error_of(R"({"type":"number","minimum":3,"maximum":2})").find("no number satisfies"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"integer","minimum":3.2,"maximum":3.8})").find("no integer"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"number","multipleOf":0.5})").find("'multipleOf' is supported for type 'integer' only"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type":"integer","multipleOf":0})").find("positive integer"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"string","minimum":0})").find("'minimum' does not apply to type 'string'"), std::string::npos);
}

TEST(SchemaKeywords, StringLengths) {
  expect_language(R"({"type":"string","minLength":2,"maxLength":3})",
                  {R"("ab")", R"("abc")", "\"\xC3\xA9\xC3\xA9\"", R"("\n\t")", R"("\u00e9a")"},
                  {R"("a")", R"("abcd")", R"("")", "\"\xC3\xA9\""});
  expect_language(R"({"type":"string","maxLength":0})", {R"("")"}, {R"("a")"});
  expect_language(R"({"type":"string","minLength":1})", {R"("x")", R"("long text")"}, {R"("")"});
  EXPECT_NE(error_of(R"({"type":"string","minLength":3,"maxLength":2})").find("'maxLength' is below 'minLength'"),
            std::string::npos);
}

TEST(SchemaKeywords, Patterns) {
  expect_language(R"({"type":"string","pattern":"^[A-Z]{3}-\\d{2}$"})", {R"("ABC-12")"},
                  {R"("AB-12")", R"("ABCD-12")", R"("abc-12")", R"("ABC-1")", R"(" ABC-12")"});
  // Unanchored patterns match anywhere (JSON Schema semantics).
  expect_language(R"({"type":"string","pattern":"ab+c"})", {R"("abc")", R"("xxabbbcyy")"}, {R"("ac")", R"("")"});
  expect_language(R"({"type":"string","pattern":"^(cat|dog)s?$"})", {R"("cat")", R"("dogs")"}, {R"("cow")", R"("cats!")"});
  expect_language(R"({"type":"string","pattern":"^[^0-9]*$"})", {R"("")", R"("abc")", "\"\xC3\xA9\xE2\x82\xAC\""},
                  {R"("a1")"});
  expect_language(R"({"type":"string","pattern":"^.{2}$"})", {R"("ab")", "\"\xE2\x82\xAC\xC3\xA9\""}, {R"("abc")", R"("a")"});
  expect_language(R"({"type":"string","pattern":"^(?:\\w+\\.)?\\w+$"})", {R"("a.b")", R"("ab")"}, {R"("a.")", R"(".b")"});
  expect_language(R"({"type":"string","pattern":"^a{2,}?$"})", {R"("aa")", R"("aaaa")"}, {R"("a")"});
  // Characters that need escapes in JSON are never generated: the pattern stays on unescaped text.
  expect_language(R"({"type":"string","pattern":"^x.y$"})", {R"("x-y")"}, {R"("x\"y")", R"("x\ny")"});
  // Pattern with length bounds (a product automaton).
  expect_language(R"({"type":"string","pattern":"^[a-z]+$","minLength":2,"maxLength":3})", {R"("ab")", R"("abc")"},
                  {R"("a")", R"("abcd")", R"("a1")"});
  // Outside the subset: a 400 naming the construct.
  const std::pair<const char*, const char*> unsupported[] = {
      {"(a)\\\\1", "backreference"},          {"(?=a)b", "lookaround"},        {"\\\\bword", "word boundary"},
      {"[\\u00e9]", "non-ASCII character in a character class"},                {"\\\\p{L}", "Unicode property"},
      {"(?i)abc", "inline flags"},            {"a^b", "anchor"},               {"a{2,1}", "m < n"},
      {"a{5000}", "above 1000"},              {"a++", "possessive"},           {"[abc", "unclosed character class"},
      {"(ab", "unclosed group"},              {"*a", "nothing to repeat"},     {"^\\\"$", "matches no string"}};
  for (const auto& [p, what] : unsupported) {
    const std::string e = error_of(std::string(R"({"type":"string","pattern":")") + p + "\"}");
    EXPECT_NE(e.find(what), std::string::npos) << p << " -> " << e;
    EXPECT_NE(e.find("pattern"), std::string::npos) << e;
  }
}

TEST(SchemaKeywords, Formats) {
  expect_language(R"({"type":"string","format":"date"})", {R"("2024-02-29")", R"("1999-12-31")"},
                  {R"("2024-13-01")", R"("2024-1-01")", R"("24-01-01")", R"("2024-01-32")", R"("2023-02-29")", R"("1900-02-29")",
                   R"("2024-04-31")"});
  expect_language(R"({"type":"string","format":"date"})", {R"("2000-02-29")", R"("2024-04-30")", R"("2023-01-31")"}, {});
  expect_language(R"({"type":"string","format":"date-time"})",
                  {R"("2024-02-29T13:45:00Z")", R"("2024-02-29T13:45:00.123+02:00")"},
                  {R"("2024-02-29 13:45:00Z")", R"("2024-02-29T25:00:00Z")", R"("2024-02-29T13:45:00")"});
  expect_language(R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"},
                  {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"});
  expect_language(R"({"type":"string","format":"email"})", {R"("a.b@example.com")", R"("x+y@sub.domain.org")"},
                  {R"("a@b")", R"("@example.com")", R"("a b@example.com")"});
  EXPECT_NE(error_of(R"({"type":"string","format":"uri"})").find("'format': \"uri\" is not supported"), std::string::npos);
}

TEST(SchemaKeywords, ItemsAndNesting) {
  expect_language(R"({"type":"array","items":{"type":"integer","minimum":1,"maximum":3},"minItems":2,"maxItems":3})",
                  {"[1,2]", "[3, 3, 1]"}, {"[1]", "[1,2,3,1]", "[0,1]", "[1,4]"});
  expect_language(R"({"type":"object","required":["age","code"],"properties":{"age":{"type":"integer","minimum":0,"maximum":150},
                    "code":{"type":"string","pattern":"^[A-Z]{2}$"}}})",
                  {R"({"age":42,"code":"FR"})"}, {R"({"age":151,"code":"FR"})", R"({"age":4,"code":"fr"})"});
}

// The token mask equals the brute force (every token tried) along random walks through these schemas.
TEST(SchemaKeywords, MaskMatchesBruteForce) {
  auto ix = TokenIndex::build(testing::fragment_vocab(), 320);
  std::mt19937_64 rng(7);
  for (const char* s :
       {R"({"type":"object","required":["n","s","d"],"properties":{"n":{"type":"integer","minimum":-3,"maximum":345},
           "s":{"type":"string","minLength":1,"maxLength":4},"d":{"type":"string","pattern":"^(red|green|[a-c]+)$"},
           "x":{"type":"number","minimum":0,"exclusiveMaximum":2}}})",
        R"({"type":"array","items":{"type":"string","format":"date"},"maxItems":2})"}) {
    auto g = schema(s);
    for (int w = 0; w < 20; ++w) {
      GrammarConstraint c(g, ix);
      std::vector<uint32_t> mask(static_cast<size_t>(ix->words()));
      for (int step = 0; step < 40; ++step) {
        c.fill_allowed(mask);
        ASSERT_EQ(mask, testing::brute_force_mask(c.matcher(), *ix)) << s << " step " << step;
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < ix->vocab_size(); ++t)
          if (runtime::mask_has(mask, t)) allowed.push_back(t);
        if (allowed.empty() || (c.complete() && rng() % 2 == 0)) break;
        ASSERT_TRUE(c.accept(allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)]));
      }
    }
  }
}

// The closing: min_finish_bytes is the length of shortest_completion, which completes the document.
TEST(SchemaKeywords, ShortestCompletion) {
  struct Case {
    const char* schema;
    const char* prefix;
    const char* completion;
  };
  const Case cases[] = {
      {R"({"type":"object","required":["a","b"],"properties":{"a":{"type":"string","minLength":2},"b":{"type":"integer","minimum":10}}})",
       R"({"a":"x)", "?\",\"b\":10}"},
      {R"({"type":"array","items":{"type":"integer","minimum":100},"minItems":2})", "[1", "00,100]"},
      {R"({"type":"string","pattern":"^[0-9]{3}-x$"})", R"("1)", "00-x\""},
      {R"({"type":"number","minimum":0.25,"maximum":0.5})", "0.", "3"},
      {R"({"type":"object","properties":{"a":{"type":"string"}}})", R"({"a":"\u00)", "00\"}"},
  };
  for (const Case& c : cases) {
    Matcher m(schema(c.schema));
    ASSERT_TRUE(m.accept(c.prefix)) << c.prefix;
    auto s = m.shortest_completion();
    ASSERT_TRUE(s.has_value()) << c.schema;
    EXPECT_EQ(static_cast<int64_t>(s->size()), *m.min_finish_bytes()) << c.schema;
    EXPECT_EQ(s->size(), std::string(c.completion).size()) << c.schema << " completion " << *s;
    ASSERT_TRUE(m.accept(*s)) << *s;
    EXPECT_TRUE(m.can_end()) << c.prefix << *s;
  }
}

}  // namespace
}  // namespace mxserve::structured
