// Unit tests of the tokenizer pipeline pieces that the four real vocabularies do not exercise
// (Split behaviours and invert, Metaspace + byte_fallback + SentencePiece-style decoders,
// added-token lstrip / rstrip / single_word, TemplateProcessing), plus bad input: invalid UTF-8,
// oversized input, malformed tokenizer.json, unknown ids.
#include <filesystem>

#include "test_util.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace mxserve::tokenizer {
namespace {

using nlohmann::json;

std::vector<std::string> pre_tokenize(const json& config, std::string_view text) {
  auto pt = PreTokenizer::from_json(config);
  EXPECT_TRUE(pt.is_ok()) << pt.status().to_string();
  std::deque<std::string> arena;
  std::vector<std::string_view> pieces{text};
  EXPECT_TRUE((*pt)->apply(pieces, PreTokenizeContext{&arena, true}).is_ok());
  return std::vector<std::string>(pieces.begin(), pieces.end());
}

json split(const char* behavior, bool invert, const char* regex = "-") {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", behavior}, {"invert", invert}};
}

using V = std::vector<std::string>;

TEST(PreTokenizer, SplitBehaviours) {
  const char* t = "a-b--c-";
  EXPECT_EQ(pre_tokenize(split("Removed", false), t), (V{"a", "b", "c"}));
  EXPECT_EQ(pre_tokenize(split("Isolated", false), t), (V{"a", "-", "b", "-", "-", "c", "-"}));
  EXPECT_EQ(pre_tokenize(split("MergedWithPrevious", false), t), (V{"a-", "b-", "-", "c-"}));
  EXPECT_EQ(pre_tokenize(split("MergedWithNext", false), t), (V{"a", "-b", "-", "-c", "-"}));
  EXPECT_EQ(pre_tokenize(split("Contiguous", false), t), (V{"a", "-", "b", "--", "c", "-"}));
  // invert: the pattern describes the pieces to keep.
  EXPECT_EQ(pre_tokenize(split("Removed", true, "[a-z]+"), "ab, cd!"), (V{"ab", "cd"}));
  EXPECT_EQ(pre_tokenize(split("Isolated", true, "[a-z]+"), "ab, cd"), (V{"ab", ", ", "cd"}));
  json literal = {{"type", "Split"}, {"pattern", {{"String", ", "}}}, {"behavior", "Removed"}, {"invert", false}};
  EXPECT_EQ(pre_tokenize(literal, "x, y, z"), (V{"x", "y", "z"}));
}

TEST(Regex, WhiteSpaceRewriteKeepsOnigurumaMeaningOfBackslashS) {
  std::string ws = "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
  EXPECT_EQ(Regex::translate(R"(\s+(?!\S))"), "[" + ws + "]+(?![^" + ws + "])");
  EXPECT_EQ(Regex::translate(R"([^\s\p{L}]|[]\s]|\\s)"), "[^" + ws + "\\p{L}]|[]" + ws + "]|\\\\s");
  auto re = Regex::compile(R"(\s+)");
  ASSERT_TRUE(re.is_ok());
  std::vector<std::pair<size_t, size_t>> m;
  ASSERT_TRUE((*re)->find_all("a\xE1\xA0\x8E" "b\xC2\x85" "c", m).is_ok());  // U+180E is not White_Space; U+0085 is
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0], (std::pair<size_t, size_t>{5, 7}));
  EXPECT_FALSE(Regex::compile("(?<").is_ok());
}

TEST(PreTokenizer, DigitsMetaspaceWhitespace) {
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", true}}, "ab123c"), (V{"ab", "1", "2", "3", "c"}));
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", false}}, "ab123c"), (V{"ab", "123", "c"}));
  EXPECT_EQ(pre_tokenize({{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}, {"split", true}},
                         "hi there"),
            (V{"\xE2\x96\x81hi", "\xE2\x96\x81there"}));
  EXPECT_EQ(pre_tokenize({{"type", "WhitespaceSplit"}}, " a  b\tc "), (V{"a", "b", "c"}));
  EXPECT_EQ(pre_tokenize({{"type", "Whitespace"}}, "hi, you!"), (V{"hi", ",", "you", "!"}));
  // ByteLevel with its GPT-2 regex (the model then sees raw bytes).
  EXPECT_EQ(pre_tokenize({{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}, "Hello world's"),
            (V{" Hello", " world", "'s"}));
}

// A SentencePiece-style BPE: Prepend/Replace normalizers, byte_fallback, Llama-2 decoders.
json spm_tokenizer() {
  return json::parse(R"({
    "normalizer": {"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": null,
    "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>", "fuse_unk": true,
      "vocab": {"<unk>": 0, "<s>": 1, "▁": 2, "h": 3, "i": 4, "▁h": 5, "▁hi": 6, "<0xC3>": 7, "<0xA9>": 8},
      "merges": ["▁ h", ["▁h", "i"]]},
    "added_tokens": [{"id": 1, "content": "<s>", "special": true}],
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
  })");
}

TEST(Tokenizer, SentencePieceStyleByteFallbackAndTemplate) {
  auto tok = Tokenizer::from_json_text(spm_tokenizer().dump());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  auto ids = (*tok)->encode("hi \xC3\xA9", false);
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{6, 2, 7, 8}));
  auto with_bos = (*tok)->encode("hi \xC3\xA9", true);
  EXPECT_EQ(*with_bos, (std::vector<int32_t>{1, 6, 2, 7, 8}));
  EXPECT_EQ((*tok)->decode(*ids, false), "hi \xC3\xA9");
  EXPECT_EQ((*tok)->decode(*with_bos, true), "hi \xC3\xA9");
  // Unknown characters fuse into one <unk>.
  auto unk = (*tok)->encode("hxyz", false);
  EXPECT_EQ(*unk, (std::vector<int32_t>{5, 0}));
  EXPECT_EQ((*tok)->vocab_size(), 9);
  EXPECT_EQ((*tok)->token_to_id("<s>"), 1);
  EXPECT_TRUE((*tok)->is_special(1));
  EXPECT_FALSE((*tok)->token_to_id("nope").has_value());
}

class Qwen : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::require_node_modules()) GTEST_SKIP();
    base_ = json::parse(testing::read_text(testing::tokenizer_json_path("qwen3")));
  }
  json base_;
};

TEST_F(Qwen, AddedTokenStripAndSingleWord) {
  for (auto& a : base_["added_tokens"])
    if (a["content"] == "<|im_end|>") a["lstrip"] = a["rstrip"] = true;
  base_["added_tokens"].push_back({{"id", 151700}, {"content", "foo"}, {"special", false}, {"single_word", true},
                                   {"lstrip", false}, {"rstrip", false}, {"normalized", false}});
  auto tok = Tokenizer::from_json_text(base_.dump());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  auto plain = Tokenizer::load(testing::tokenizer_json_path("qwen3"));
  auto a = (*tok)->encode("a  <|im_end|>\n b", false);
  auto b = (*plain)->encode("a<|im_end|>b", false);
  EXPECT_EQ(*a, *b);  // whitespace on both sides absorbed into the token
  auto word = (*tok)->encode("x foo y", false);
  EXPECT_NE(std::find(word->begin(), word->end(), 151700), word->end());
  auto inner = (*tok)->encode("xfooy", false);
  EXPECT_EQ(std::find(inner->begin(), inner->end(), 151700), inner->end());
  EXPECT_EQ((*tok)->decode(*word, false), "x foo y");
}

TEST_F(Qwen, BadInputIsAnErrorNotACrash) {
  auto tok = Tokenizer::from_json_text(base_.dump());
  ASSERT_TRUE(tok.is_ok());
  for (std::string bad : {std::string("abc\xFF"), std::string("\xC3"), std::string("\xED\xA0\x80"),  // lone surrogate
                          std::string("\xC0\xAF"), std::string("\xF4\x90\x80\x80"), std::string("x\x80y")}) {
    auto r = (*tok)->encode(bad, true);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("UTF-8"), std::string::npos);
  }
  std::string huge(Tokenizer::kMaxInputBytes + 1, 'a');
  EXPECT_FALSE((*tok)->encode(huge, true).is_ok());
  // Large, degenerate inputs: one 2 MB word and a 1 MB whitespace run.
  std::string word(2 << 20, 'z'), spaces(1 << 20, ' ');
  auto w = (*tok)->encode(word, false);
  ASSERT_TRUE(w.is_ok());
  EXPECT_EQ((*tok)->decode(*w, false), word);
  auto s = (*tok)->encode(spaces + "x", false);
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ((*tok)->decode(*s, false), spaces + "x");
  // Unknown special-token-looking strings are plain text; unknown ids decode to nothing.
  auto fake = (*tok)->encode("<|not_a_token|>", true);
  EXPECT_GT(fake->size(), 1u);
  std::vector<int32_t> odd = {-5, 9707, 99999999};
  EXPECT_EQ((*tok)->decode(odd, false), "Hello");
  // Decoding a split multi-byte character yields U+FFFD, never invalid UTF-8.
  auto e = (*tok)->encode("\xF0\x90\x8C\xB0\xF0\x9D\x84\x9E", false);  // Gothic a + musical G clef
  ASSERT_GE(e->size(), 2u);
  std::string half = (*tok)->decode(std::span<const int32_t>(*e).first(1), false);
  EXPECT_TRUE(is_valid_utf8(half));
}

TEST(Tokenizer, MalformedTokenizerJsonGivesClearErrors) {
  struct Case {
    std::string text, expect;
  };
  std::vector<Case> cases = {
      {"", "not valid JSON"},
      {"[1,2]", "not an object"},
      {"{}", "missing 'model'"},
      {R"({"model": {"type": "Unigram", "vocab": []}})", "Unigram"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})", "missing from the vocab"},
      {R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})", "not an integer"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [5]}})", "merge #0"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(("}, "behavior": "Isolated"}})", "invalid regex"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "normalizer": {"type": "Precompiled"}})", "Precompiled"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [{"id": 1}]})", "added_tokens"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "decoder": {"type": "CTC"}})", "CTC"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}]}})", "<s>"},
  };
  for (const Case& c : cases) {
    auto t = Tokenizer::from_json_text(c.text);
    ASSERT_FALSE(t.is_ok()) << c.text;
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos) << t.status().to_string();
  }
  EXPECT_EQ(Tokenizer::load("/nonexistent/tokenizer.json").status().code(), StatusCode::kNotFound);
}

TEST(Tokenizer, LoadDirReadsConfigAndTemplate) {
  if (!testing::require_node_modules()) return;
  auto dir = std::filesystem::temp_directory_path() / "mxserve_tokenizer_load_dir";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(testing::tokenizer_json_path("deepseek_v3"), dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(testing::tokenizer_config_path("deepseek_v3"), dir / "tokenizer_config.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto tok = Tokenizer::load_dir(dir.string());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->bos_token(), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ((*tok)->eos_token(), "<｜end▁of▁sentence｜>");
  EXPECT_NE((*tok)->chat_template().find("tool_calls"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mxserve::tokenizer
