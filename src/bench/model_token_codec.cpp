// The one-file adapter from bench's TokenCodec to the model tokenizer (mxserve::tokenizer).
// Owns: load_model_token_codec(). Until the tokenizer module is merged it fails loudly: `mxserve
// bench` never substitutes an approximate count for the target model's tokenizer.
// At merge, replace the body with (sketch):
//   MX_ASSIGN_OR_RETURN(auto tok, is_directory(path) ? tokenizer::Tokenizer::load_dir(path)
//                                                    : tokenizer::Tokenizer::load(path));
//   return std::make_unique<ModelTokenCodec>(std::move(tok), path);
// where ModelTokenCodec::encode(text) = tok->encode(text, /*add_special_tokens=*/false) and
// decode(ids) = tok->decode(ids, /*skip_special_tokens=*/false), exact_for_model() = true.
#include "bench/token_codec.h"

namespace mxserve::bench {

Result<std::unique_ptr<TokenCodec>> load_model_token_codec(const std::string& path) {
  return unsupported(
      "this build of mxserve bench has no model tokenizer linked in (tokenizer module not merged yet), "
      "so it cannot count tokens for '" + path +
      "'. Use --tokenizer builtin:words only against test servers (1 token = 1 word, approximate), "
      "or --workload file with explicit prompts");
}

}  // namespace mxserve::bench
