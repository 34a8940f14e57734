// Workload generators, checked with the codec: exact lengths, shared-prefix group structure,
// uniqueness, file parsing; the embedded corpus is real text.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "bench/corpus.h"
#include "bench/workload.h"
#include "tokenizer/utf8.h"

namespace mxserve::bench {
namespace {

class WorkloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = TokenCorpus::load("", codec_);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    corpus_ = std::make_unique<TokenCorpus>(std::move(c).value());
  }
  size_t count(const std::string& s) { return codec_.encode(s)->size(); }
  WordCodec codec_;
  std::unique_ptr<TokenCorpus> corpus_;
};

TEST_F(WorkloadTest, EmbeddedCorpusIsRealText) {
  EXPECT_GT(embedded_corpus_text().size(), 500000u);
  EXPECT_LT(embedded_corpus_text().size(), 1600000u);
  EXPECT_EQ(embedded_corpus_text().substr(0, 21), "The Fulton County Gra");
  EXPECT_GT(corpus_->ids().size(), 150000u);
}

TEST_F(WorkloadTest, SharedPrefixLengthsAndGroups) {
  WorkloadConfig c;
  c.kind = WorkloadKind::kSharedPrefix;
  c.input_len = 2000;
  c.output_len = 100;
  c.cache_hit_rate = 0.6;
  c.num_groups = 4;
  auto w = make_workload(c, &codec_, corpus_.get());
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ((*w)->default_warmup(), 4);
  std::vector<std::vector<int32_t>> group_prefix(4);
  std::set<std::vector<int32_t>> suffix_starts;
  for (int i = 0; i < 40; ++i) {
    auto p = (*w)->prompt(0, i);
    ASSERT_TRUE(p.is_ok());
    if (i < 4) {
      EXPECT_EQ(p->group, i);  // priming requests cover every group in order
    }
    EXPECT_EQ(p->input_tokens, 2000);
    EXPECT_EQ(static_cast<int64_t>(count(p->text)), 2000);
    EXPECT_EQ(p->prefix_tokens, 1200);
    EXPECT_EQ(p->output_len, 100);
    auto ids = *codec_.encode(p->text);
    std::vector<int32_t> prefix(ids.begin(), ids.begin() + 1200);
    if (group_prefix[p->group].empty()) group_prefix[p->group] = prefix;
    EXPECT_EQ(prefix, group_prefix[p->group]) << "request " << i;
    suffix_starts.insert(std::vector<int32_t>(ids.begin() + 1200, ids.begin() + 1210));
  }
  EXPECT_EQ(suffix_starts.size(), 40u);  // every suffix is unique
  for (int a = 0; a < 4; ++a)
    for (int b = a + 1; b < 4; ++b) EXPECT_NE(group_prefix[a][0] == group_prefix[b][0] &&
                                              group_prefix[a][1] == group_prefix[b][1], true);
  // Same (stream, i) -> same prompt; another stream -> another suffix, same group prefixes.
  EXPECT_EQ((*w)->prompt(0, 7)->text, (*w)->prompt(0, 7)->text);
  EXPECT_NE((*w)->prompt(0, 7)->text, (*w)->prompt(1, 7)->text);
  EXPECT_EQ((*w)->prompt(1, 2)->text.substr(0, 200), (*w)->prompt(0, 2)->text.substr(0, 200));
}

TEST_F(WorkloadTest, RandomRangeAndSingleStreamUniqueness) {
  WorkloadConfig c;
  c.input_len = 300;
  c.output_len = 50;
  c.range_ratio = 0.5;
  auto w = make_workload(c, &codec_, corpus_.get());
  ASSERT_TRUE(w.is_ok());
  int64_t lo = 1 << 30, hi = 0;
  for (int i = 0; i < 200; ++i) {
    auto p = (*w)->prompt(0, i);
    EXPECT_EQ(static_cast<int64_t>(count(p->text)), p->input_tokens);
    EXPECT_GE(p->input_tokens, 150);
    EXPECT_LE(p->input_tokens, 450);
    EXPECT_GE(p->output_len, 25);
    EXPECT_LE(p->output_len, 75);
    lo = std::min(lo, p->input_tokens);
    hi = std::max(hi, p->input_tokens);
  }
  EXPECT_LT(lo, 175);
  EXPECT_GT(hi, 425);
  c.kind = WorkloadKind::kSingleStream;
  c.input_len = 1000;
  auto s = make_workload(c, &codec_, corpus_.get());
  std::set<std::string> firsts;
  for (int i = 0; i < 20; ++i) {
    auto p = (*s)->prompt(0, i);
    EXPECT_EQ(p->input_tokens, 1000);
    firsts.insert(p->text.substr(0, 24));  // the nonce
  }
  EXPECT_EQ(firsts.size(), 20u);
}

TEST_F(WorkloadTest, FileJsonl) {
  const std::string path = ::testing::TempDir() + "/bench_prompts.jsonl";
  {
    std::ofstream f(path);
    f << R"({"prompt": "one two three", "output_len": 7})" << "\n\n"
      << R"({"messages": [{"role": "user", "content": "hi"}]})" << "\n";
  }
  WorkloadConfig c;
  c.kind = WorkloadKind::kFile;
  c.file = path;
  c.output_len = 33;
  auto w = make_workload(c, &codec_, nullptr);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ((*w)->prompt(0, 0)->input_tokens, 3);
  EXPECT_EQ((*w)->prompt(0, 0)->output_len, 7);
  EXPECT_TRUE((*w)->prompt(0, 1)->messages.is_array());
  EXPECT_EQ((*w)->prompt(0, 1)->output_len, 33);
  EXPECT_EQ((*w)->prompt(0, 2)->output_len, 7);  // cycles
  {
    std::ofstream f(path);
    f << R"({"prompt": "x"})" << "\n" << R"({"nothing": 1})" << "\n";
  }
  auto bad = make_workload(c, &codec_, nullptr);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find(":2:"), std::string::npos);
}

// A byte-level BPE codec decodes a slice that starts inside a multi-byte character to bytes that are not UTF-8 (the
// GPU run of 2026-12-06: `bench --workload shared-prefix` aborted on json's type_error 316). fit_prompt's text is
// valid UTF-8 and its token count is the re-encoded text's.
class BrokenUtf8Codec final : public TokenCodec {
 public:
  Result<std::vector<int32_t>> encode(std::string_view text) const override {
    return std::vector<int32_t>(text.size(), 7);  // one token per byte
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s = "\x80\xbf";  // continuation bytes first, as a slice cut inside a character gives
    for (size_t i = 0; i < ids.size(); ++i) s += 'a';
    return s + "\xe2\x82";  // and a truncated 3-byte sequence last
  }
  std::string describe() const override { return "broken utf-8 (test)"; }
  bool exact_for_model() const override { return true; }
};

TEST_F(WorkloadTest, FittedPromptTextIsValidUtf8) {
  BrokenUtf8Codec broken;
  auto t = fit_prompt(broken, *corpus_, {1, 2, 3}, 11, 40);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_TRUE(tokenizer::is_valid_utf8(t->text)) << t->text;
  EXPECT_NE(t->text.find("\xef\xbf\xbd"), std::string::npos) << "invalid bytes become U+FFFD";
  EXPECT_EQ(t->tokens, static_cast<int64_t>(t->text.size())) << "counted on the text that is sent";
}

TEST(TokenCodec, ProductPathFailsLoudlyWithoutModelTokenizer) {
  auto c = make_token_codec("/nonexistent/tokenizer.json");
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("--tokenizer"), std::string::npos);
  auto w = make_token_codec("builtin:words");
  ASSERT_TRUE(w.is_ok());
  EXPECT_FALSE((*w)->exact_for_model());
}

}  // namespace
}  // namespace mxserve::bench
