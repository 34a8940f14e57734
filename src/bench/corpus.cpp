// TokenCorpus loading (see corpus.h). The extract's bytes come from corpus_blob.S (.incbin).
#include "bench/corpus.h"

#include <fstream>
#include <sstream>

extern "C" const char mx_bench_corpus_begin[];
extern "C" const char mx_bench_corpus_end[];

namespace mxserve::bench {

std::string_view embedded_corpus_text() {
  return std::string_view(mx_bench_corpus_begin, static_cast<size_t>(mx_bench_corpus_end - mx_bench_corpus_begin));
}

Result<TokenCorpus> TokenCorpus::load(const std::string& path, const TokenCodec& codec) {
  TokenCorpus c;
  std::string owned;
  std::string_view text;
  if (path.empty()) {
    text = embedded_corpus_text();
    c.source_ = "embedded Brown corpus extract";
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found("--corpus " + path + ": cannot open file");
    std::ostringstream ss;
    ss << in.rdbuf();
    owned = ss.str();
    text = owned;
    c.source_ = path;
  }
  MX_ASSIGN_OR_RETURN(c.ids_, codec.encode(text));
  if (c.ids_.size() < 2) return invalid_argument("corpus " + c.source_ + " has fewer than 2 tokens");
  return c;
}

std::vector<int32_t> TokenCorpus::slice(size_t offset, size_t n) const {
  std::vector<int32_t> out;
  out.reserve(n);
  size_t pos = offset % ids_.size();
  for (size_t i = 0; i < n; ++i) {
    out.push_back(ids_[pos]);
    if (++pos == ids_.size()) pos = 0;
  }
  return out;
}

}  // namespace mxserve::bench
