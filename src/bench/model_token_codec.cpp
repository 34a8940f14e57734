// The one-file adapter from bench's TokenCodec to the model tokenizer (mxserve::tokenizer): prompts are
// built and counted with the target model's own tokenizer (tokenizer.json file or model directory).
#include <sys/stat.h>

#include "bench/token_codec.h"
#include "tokenizer/tokenizer.h"

namespace mxserve::bench {
namespace {

class ModelTokenCodec final : public TokenCodec {
 public:
  ModelTokenCodec(std::unique_ptr<tokenizer::Tokenizer> tok, std::string path)
      : tok_(std::move(tok)), path_(std::move(path)) {}
  Result<std::vector<int32_t>> encode(std::string_view text) const override {
    return tok_->encode(text, /*add_special_tokens=*/false);
  }
  std::string decode(std::span<const int32_t> ids) const override {
    return tok_->decode(ids, /*skip_special_tokens=*/false);
  }
  std::string describe() const override { return "tokenizer at " + path_; }
  bool exact_for_model() const override { return true; }

 private:
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::string path_;
};

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

Result<std::unique_ptr<TokenCodec>> load_model_token_codec(const std::string& path) {
  auto tok = is_dir(path) ? tokenizer::Tokenizer::load_dir(path) : tokenizer::Tokenizer::load(path);
  if (!tok.is_ok()) return tok.status().with_context("--tokenizer " + path);
  return std::unique_ptr<TokenCodec>(std::make_unique<ModelTokenCodec>(std::move(*tok), path));
}

}  // namespace mxserve::bench
