// quantize and compare: the weight-quantization subcommands. `compare` measures what quantization costs:
// per-token KL(A || B), top-1 agreement and logit cosine of two models teacher-forced on the same
// prompts, and the perplexity of each on a text (token ids: there is no tokenizer in this build yet).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/args.h"
#include "launch/model_path.h"
#include "cli/commands.h"
#include "model/causal_lm.h"
#include "eval/logit_metrics.h"
#include "quant/quantizer.h"

namespace mxserve::cli {
namespace {

int fail(const Status& s, int code = 2) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return code;
}

// --exclude may repeat: collect every value and hand the rest to Args (which keeps one value per flag).
std::vector<char*> take_repeated(int argc, char** argv, const std::string& flag, std::vector<std::string>& values,
                                 Status& status) {
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == flag) {
      if (i + 1 >= argc) status = invalid_argument("flag " + flag + " needs a value");
      else values.push_back(argv[++i]);
    } else if (a.rfind(flag + "=", 0) == 0) {
      values.push_back(a.substr(flag.size() + 1));
    } else {
      rest.push_back(argv[i]);
    }
  }
  return rest;
}

// A file of token ids: one sequence per line, ids separated by commas and/or spaces; '#' starts a comment.
Result<std::vector<std::vector<int32_t>>> read_id_lines(const std::string& path, const std::string& flag) {
  std::ifstream in(path);
  if (!in) return not_found(flag + " " + path + ": cannot open");
  std::vector<std::vector<int32_t>> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
    for (char& c : line)
      if (c == ',' || c == '\t') c = ' ';
    std::istringstream is(line);
    std::vector<int32_t> ids;
    std::string tok;
    while (is >> tok) {
      char* end = nullptr;
      const long v = std::strtol(tok.c_str(), &end, 10);
      if (*end != '\0' || v < 0 || v > INT32_MAX)
        return invalid_argument(flag + " " + path + ":" + std::to_string(n) + ": '" + tok + "' is not a token id");
      ids.push_back(static_cast<int32_t>(v));
    }
    if (!ids.empty()) out.push_back(std::move(ids));
  }
  if (out.empty()) return invalid_argument(flag + " " + path + ": no token ids");
  return out;
}

}  // namespace

int cmd_compare(int argc, char** argv) {
  std::vector<std::string> models;
  Status st;
  std::vector<char*> rest = take_repeated(argc, argv, "--model", models, st);
  if (!st.is_ok()) return fail(st);
  auto args = Args::parse(static_cast<int>(rest.size()), rest.data(), {"--prompts", "--text", "--backend"}, {},
                          {"--model"});
  if (!args.is_ok()) return fail(args.status());
  if (models.size() != 2 || !args->positional().empty())
    return fail(invalid_argument("usage: mxserve compare --model A --model B --prompts FILE [--text FILE] [--backend cpu|cuda]"));
  auto prompts_path = args->get("--prompts");
  if (!prompts_path.is_ok()) return fail(prompts_path.status());
  auto prompts = read_id_lines(*prompts_path, "--prompts");
  if (!prompts.is_ok()) return fail(prompts.status());
  std::vector<std::vector<int32_t>> text;
  if (args->has("--text")) {
    auto t = read_id_lines(args->get_or("--text", ""), "--text");
    if (!t.is_ok()) return fail(t.status());
    text = *t;
  }
  auto be = backend::make_backend(args->get_or("--backend", "cpu"));
  if (!be.is_ok()) return fail(be.status());
  std::unique_ptr<model::CausalLM> m[2];
  for (int i = 0; i < 2; ++i) {
    if (Status mp = launch::check_model_path(models[i]); !mp.is_ok()) return fail(mp);
    auto r = model::load_causal_lm(models[i], **be, model::LoadOptions{.load_mtp = false});
    if (!r.is_ok()) return fail(r.status());
    m[i] = std::move(r).value();
  }
  const int64_t V = m[0]->config().vocab_size;
  if (m[1]->config().vocab_size != V)
    return fail(invalid_argument("the models' vocabularies differ: " + std::to_string(V) + " vs " +
                                 std::to_string(m[1]->config().vocab_size)));
  for (const auto* set : {&*prompts, &text})
    for (const auto& ids : *set)
      for (int32_t id : ids)
        if (id >= V) return fail(invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary"));

  eval::LogitComparison cmp;
  for (const auto& ids : *prompts) {
    auto a = eval::all_logits(*m[0], **be, ids);
    auto b = eval::all_logits(*m[1], **be, ids);
    if (!a.is_ok()) return fail(a.status());
    if (!b.is_ok()) return fail(b.status());
    for (int64_t t = 0; t < static_cast<int64_t>(ids.size()); ++t)
      cmp.add_row(a->data<float>() + t * V, b->data<float>() + t * V, V);
  }
  std::printf("A: %s\nB: %s\n", models[0].c_str(), models[1].c_str());
  std::printf("prompts: %zu, tokens: %lld\n", prompts->size(), static_cast<long long>(cmp.tokens));
  std::printf("KL(A||B) per token: mean %.6f  max %.6f\n", cmp.mean_kl(), cmp.kl_max);
  std::printf("top-1 agreement: %.2f%% (%lld/%lld)\n", 100.0 * cmp.top1(), static_cast<long long>(cmp.top1_agree),
              static_cast<long long>(cmp.tokens));
  std::printf("logit cosine: mean %.6f\n", cmp.mean_cos());
  if (!text.empty()) {
    for (int i = 0; i < 2; ++i) {
      double nll = 0;
      int64_t n = 0;
      for (const auto& ids : text) {
        auto l = eval::all_logits(*m[i], **be, ids);
        if (!l.is_ok()) return fail(l.status());
        for (int64_t t = 0; t + 1 < static_cast<int64_t>(ids.size()); ++t) {
          nll -= eval::log_softmax(l->data<float>() + t * V, V)[ids[t + 1]];
          ++n;
        }
      }
      std::printf("perplexity %s: %.4f over %lld tokens\n", i == 0 ? "A" : "B", n ? std::exp(nll / n) : NAN,
                  static_cast<long long>(n));
    }
  }
  return 0;
}

int cmd_quantize(int argc, char** argv) {
  quant::QuantizeOptions o;
  Status st;
  std::vector<char*> rest = take_repeated(argc, argv, "--exclude", o.exclude_globs, st);
  if (!st.is_ok()) return fail(st);
  auto args = Args::parse(static_cast<int>(rest.size()), rest.data(),
                          {"--in", "--out", "--scheme", "--scale-rule", "--mtp-layer", "--shard-size-mb"},
                          {"--quantize-shared-experts"}, {"--exclude"});
  if (!args.is_ok()) return fail(args.status());
  if (!args->positional().empty())
    return fail(invalid_argument("usage: mxserve quantize --in DIR --out DIR --scheme mxfp4|fp8-block|fp8-channel|fp8-tensor "
                                 "[--scale-rule even|floor|ceil] [--exclude GLOB ...] [--quantize-shared-experts] "
                                 "[--mtp-layer same|bf16] [--shard-size-mb N]"));
  auto in = args->get("--in");
  auto out = args->get("--out");
  auto scheme = args->get("--scheme");
  if (!in.is_ok()) return fail(in.status());
  if (!out.is_ok()) return fail(out.status());
  if (!scheme.is_ok()) return fail(scheme.status());
  auto sc = quant::parse_scheme(*scheme);
  if (!sc.is_ok()) return fail(sc.status());
  auto rule = quant::parse_scale_rule(args->get_or("--scale-rule", "even"));
  if (!rule.is_ok()) return fail(rule.status().with_context("--scale-rule"));
  if (*sc != quant::Scheme::kMxfp4 && args->has("--scale-rule"))
    return fail(invalid_argument("--scale-rule applies to --scheme mxfp4 only"));
  const std::string mtp = args->get_or("--mtp-layer", "same");
  if (mtp != "same" && mtp != "bf16") return fail(invalid_argument("--mtp-layer '" + mtp + "': expected same or bf16"));
  auto shard_mb = args->get_int("--shard-size-mb", 4096);
  if (!shard_mb.is_ok()) return fail(shard_mb.status());
  if (*shard_mb <= 0) return fail(invalid_argument("--shard-size-mb must be positive"));
  o.in_dir = *in;
  o.out_dir = *out;
  o.scheme = *sc;
  o.scale_rule = *rule;
  o.quantize_shared_experts = args->has("--quantize-shared-experts");
  o.mtp_bf16 = mtp == "bf16";
  o.shard_bytes = static_cast<uint64_t>(*shard_mb) << 20;
  auto report = quant::quantize_checkpoint(o, stderr);
  if (!report.is_ok()) return fail(report.status());
  std::printf("%s -> %s: %lld of %lld tensors quantized to %s%s%s, %lld shard(s), %.2f MB -> %.2f MB, %zu Linear modules "
              "kept unquantized (listed in quantization_config)\n",
              o.in_dir.c_str(), o.out_dir.c_str(), static_cast<long long>(report->n_quantized),
              static_cast<long long>(report->n_tensors), quant::scheme_name(o.scheme),
              o.scheme == quant::Scheme::kMxfp4 ? " scale rule " : "",
              o.scheme == quant::Scheme::kMxfp4 ? quant::scale_rule_name(o.scale_rule) : "",
              static_cast<long long>(report->n_shards), report->bytes_in / 1e6, report->bytes_out / 1e6,
              report->kept_modules.size());
  return 0;
}

}  // namespace mxserve::cli
