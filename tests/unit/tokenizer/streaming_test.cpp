// StreamingDetokenizer: pushing ids one at a time reproduces decode(all) exactly, every chunk is
// valid UTF-8, and stop strings split across tokens are held back and never emitted.
#include "test_util.h"
#include "tokenizer/streaming_detokenizer.h"
#include "tokenizer/utf8.h"

namespace mxserve::tokenizer {
namespace {

class Streaming : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!testing::require_node_modules()) GTEST_SKIP();
    auto t = Tokenizer::load(testing::tokenizer_json_path(GetParam()));
    ASSERT_TRUE(t.is_ok());
    tok_ = std::move(t).value();
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_P(Streaming, ConcatenationEqualsFullDecodeOnCorpus) {
  std::vector<std::string> corpus = testing::load_corpus(testing::corpus_path());
  for (size_t i = 0; i < corpus.size(); i += 23) {
    auto ids = tok_->encode(corpus[i], false);
    ASSERT_TRUE(ids.is_ok());
    StreamingDetokenizer d(*tok_, {}, /*skip_special_tokens=*/false);
    std::string out;
    for (int32_t id : *ids) {
      std::string chunk = d.push(id);
      ASSERT_TRUE(is_valid_utf8(chunk)) << "line " << i;
      out += chunk;
    }
    out += d.finish();
    EXPECT_EQ(out, tok_->decode(*ids, false)) << "line " << i;
  }
}

TEST_P(Streaming, StopStringAcrossTokensIsHeldBackAndNeverEmitted) {
  const std::string text = "The answer is 42.\n\nUser: what 👩🏽‍💻 next? more text";
  for (const std::string stop : {"\n\nUser:", "👩🏽‍💻", "42", "never-appears"}) {
    auto ids = tok_->encode(text, false);
    StreamingDetokenizer d(*tok_, {stop, "zzz-unused"});
    std::string out;
    for (int32_t id : *ids) {
      std::string chunk = d.push(id);
      out += chunk;
      // Emitted text never contains any part of a stop string that later completes.
      size_t stop_pos = text.find(stop);
      if (stop_pos != std::string::npos) EXPECT_LE(out.size(), stop_pos) << stop;
      if (d.stopped()) break;
    }
    out += d.finish();
    size_t stop_pos = text.find(stop);
    if (stop_pos == std::string::npos) {
      EXPECT_FALSE(d.stopped());
      EXPECT_EQ(out, text);
    } else {
      EXPECT_TRUE(d.stopped()) << stop;
      EXPECT_EQ(d.matched_stop(), stop);
      EXPECT_EQ(out, text.substr(0, stop_pos)) << stop;
    }
  }
}

TEST_P(Streaming, PartialStopPrefixIsReleasedWhenRuledOut) {
  auto ids = tok_->encode("abc</th and more", false);
  StreamingDetokenizer d(*tok_, {"</think>"});
  std::string out;
  for (int32_t id : *ids) out += d.push(id);
  out += d.finish();
  EXPECT_EQ(out, "abc</th and more");
  EXPECT_FALSE(d.stopped());
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Streaming, ::testing::Values("qwen3", "llama3"));

}  // namespace
}  // namespace mxserve::tokenizer
