// TokenCorpus: the real English text prompts are cut from, and its token ids under the run's codec.
// Owns: access to the embedded Brown-corpus extract (data/brown_extract.txt, linked into the binary,
// so the product needs no data files at run time) or a user file given with `--corpus FILE`.
// Invariant: ids() is non-empty after a successful load (loading fails on an empty corpus).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bench/token_codec.h"
#include "core/status.h"

namespace mxserve::bench {

// The embedded extract (about 1.2 MB, one paragraph per line).
std::string_view embedded_corpus_text();

class TokenCorpus {
 public:
  // path empty -> the embedded extract.
  static Result<TokenCorpus> load(const std::string& path, const TokenCodec& codec);
  const std::vector<int32_t>& ids() const { return ids_; }
  const std::string& source() const { return source_; }
  // n ids starting at `offset` (mod size), wrapping around the end.
  std::vector<int32_t> slice(size_t offset, size_t n) const;

 private:
  std::vector<int32_t> ids_;
  std::string source_;
};

}  // namespace mxserve::bench
