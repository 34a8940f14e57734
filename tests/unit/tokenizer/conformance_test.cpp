// Conformance: mxserve's encode == @lenml/tokenizers (transformers.js port, run by node now) on
// every corpus line for the qwen3, deepseek_v3, gptoss and llama3 tokenizer.json files; and
// decode(encode(x)) == x wherever the tokenizer is lossless (qwen3 normalizes to NFC, so only
// NFC lines are checked for it).
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mxserve::tokenizer {
namespace {

using testing::corpus_path;
using testing::load_corpus;
using testing::node_modules;
using testing::require_node_modules;
using testing::run_command;
using testing::split_lines;
using testing::source_dir;
using testing::tokenizer_json_path;

bool is_nfc(const std::string& s) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(err);
  return n->isNormalized(icu::UnicodeString::fromUTF8(s), err);
}

class Conformance : public ::testing::TestWithParam<std::string> {};

TEST_P(Conformance, IdsMatchReferenceOnEveryCorpusLine) {
  if (!require_node_modules()) return;
  const std::string pkg = GetParam();
  auto tok = Tokenizer::load(tokenizer_json_path(pkg));
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  std::vector<std::string> corpus = load_corpus(corpus_path());
  ASSERT_GT(corpus.size(), 1000u);
  std::string out = run_command("node " + source_dir() + "/tools/tokenizer/encode_ref.mjs " + node_modules() + " " +
                                pkg + " " + corpus_path());
  std::vector<std::string> expected = split_lines(out);
  ASSERT_EQ(expected.size(), corpus.size()) << "node output line count differs";
  size_t mismatches = 0, roundtrip_fail = 0, roundtrip_checked = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    auto ids = (*tok)->encode(corpus[i], /*add_special_tokens=*/true);
    ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
    std::vector<int32_t> want = nlohmann::json::parse(expected[i]).get<std::vector<int32_t>>();
    if (*ids != want) {
      if (++mismatches <= 5) {
        size_t k = 0;
        while (k < want.size() && k < ids->size() && want[k] == (*ids)[k]) ++k;
        ADD_FAILURE() << pkg << " line " << i + 1 << ": first difference at token " << k << " (got "
                      << (k < ids->size() ? std::to_string((*ids)[k]) : "end") << ", want "
                      << (k < want.size() ? std::to_string(want[k]) : "end") << ")\n  text: "
                      << nlohmann::json(corpus[i]).dump().substr(0, 300) << "\n  decoded near: "
                      << nlohmann::json((*tok)->decode(std::span(want).subspan(k > 3 ? k - 3 : 0, std::min<size_t>(8, want.size() - (k > 3 ? k - 3 : 0))), false)).dump();
      }
      continue;
    }
    if (pkg != "qwen3" || is_nfc(corpus[i])) {
      ++roundtrip_checked;
      if ((*tok)->decode(*ids, false) != corpus[i] && ++roundtrip_fail <= 3)
        ADD_FAILURE() << pkg << " line " << i + 1 << ": decode(encode(x)) != x";
    }
  }
  EXPECT_EQ(mismatches, 0u) << pkg << ": lines with different ids out of " << corpus.size();
  EXPECT_EQ(roundtrip_fail, 0u) << pkg << ": round-trip failures out of " << roundtrip_checked;
  std::printf("[conformance] %s: %zu lines, %zu mismatches, %zu round-trips checked\n", pkg.c_str(), corpus.size(),
              mismatches, roundtrip_checked);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Conformance, ::testing::Values("qwen3", "deepseek_v3", "gptoss", "llama3"));

}  // namespace
}  // namespace mxserve::tokenizer
