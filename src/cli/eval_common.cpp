#include "cli/eval_common.h"
#include "launch/model_path.h"

#include <cstdlib>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "quant/quantizer.h"
#include "tokenizer/tokenizer.h"

namespace mxserve::cli {

ProgressLine::ProgressLine(const char* unit) : unit_(unit), tty_(isatty(STDERR_FILENO) == 1) {}

void ProgressLine::update(int64_t done, int64_t total) {
  if (tty_) {
    std::fprintf(stderr, "\r%lld/%lld %s", static_cast<long long>(done), static_cast<long long>(total), unit_);
    printed_ = true;
    return;
  }
  const int64_t tenth = total > 0 ? done * 10 / total : 10;
  if (tenth == last_tenth_) return;
  last_tenth_ = tenth;
  std::fprintf(stderr, "%lld/%lld %s\n", static_cast<long long>(done), static_cast<long long>(total), unit_);
}

void ProgressLine::finish() {
  if (tty_ && printed_) std::fprintf(stderr, "\n");
  printed_ = false;
}

int eval_fail(const Status& s, int code) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return code;
}

EvalModel::~EvalModel() {
  model.reset();
  if (!temp_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(temp_dir, ec);
  }
}

Result<std::unique_ptr<EvalModel>> load_eval_model(const std::string& dir, const std::string& quantization,
                                                   backend::Backend& be, bool load_mtp,
                                                   const EvalModelOptions& options) {
  if (!options.synthetic) MX_RETURN_IF_ERROR(launch::check_model_path(dir));
  auto em = std::make_unique<EvalModel>();
  std::string path = dir;
  em->precision = options.synthetic ? "synthetic" : "checkpoint";
  if (!quantization.empty() && quantization != "none") {
    MX_ASSIGN_OR_RETURN(quant::Scheme scheme, quant::parse_scheme(quantization));
    char tmpl[] = "/tmp/mxserve_eval_XXXXXX";
    if (!mkdtemp(tmpl)) return internal_error("cannot create a temporary directory for the quantized copy");
    em->temp_dir = tmpl;
    quant::QuantizeOptions o;
    o.in_dir = dir;
    o.out_dir = em->temp_dir + "/model";
    o.scheme = scheme;
    std::fprintf(stderr, "quantizing %s to %s in %s ...\n", dir.c_str(), quantization.c_str(), o.out_dir.c_str());
    auto r = quant::quantize_checkpoint(o, nullptr);
    if (!r.is_ok()) return r.status().with_context("--quantization " + quantization);
    path = o.out_dir;
    em->precision = quantization;
  }
  model::LoadOptions lo;
  lo.load_mtp = load_mtp;
  lo.kv_cache_dtype = options.kv_cache_dtype;
  lo.synthetic = options.synthetic;
  lo.num_layers_override = options.num_layers;
  MX_ASSIGN_OR_RETURN(em->model, model::load_causal_lm(path, be, lo));
  return em;
}

Result<std::vector<int32_t>> text_file_ids(const std::string& path, const std::string& tokenizer_dir,
                                           int64_t max_tokens, int64_t vocab_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("--text " + path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  MX_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::load_dir(tokenizer_dir));
  auto ids = tok->encode(ss.str(), /*add_special_tokens=*/false);
  if (!ids.is_ok()) return ids.status().with_context("--text " + path);
  std::vector<int32_t> out = std::move(*ids);
  if (max_tokens > 0 && static_cast<int64_t>(out.size()) > max_tokens) out.resize(static_cast<size_t>(max_tokens));
  for (int32_t id : out)
    if (id >= vocab_size)
      return invalid_argument("--text " + path + ": token id " + std::to_string(id) + " from the tokenizer in " +
                              tokenizer_dir + " is outside the model's vocabulary (" + std::to_string(vocab_size) +
                              "): wrong --tokenizer?");
  return out;
}

Result<kvcache::KvCacheDtype> kv_cache_dtype_flag(const Args& args) {
  return kvcache::parse_kv_cache_dtype(args.get_or("--kv-cache-dtype", "auto"));
}

}  // namespace mxserve::cli
