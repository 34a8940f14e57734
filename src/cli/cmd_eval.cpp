// `mxserve eval`: model quality on real text. perplexity (sliding windows), compare (two precisions or two
// models: KL, top-1 agreement, relative L2 of logits), acceptance (cmd_eval_spec.cpp), tasks
// (cmd_eval_tasks.cpp). The measures themselves live in eval/logit_metrics.h, shared with `mxserve compare`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/command_table.h"
#include "cli/eval_common.h"
#include "launch/model_path.h"
#include "eval/logit_metrics.h"

namespace mxserve::cli {
namespace {

constexpr const char* kUsage =
    "usage: mxserve eval perplexity|compare|acceptance|tasks [flags] (`mxserve eval SUBCOMMAND --help` lists them)";

Status write_json(const Args& args, const nlohmann::ordered_json& j) {
  if (!args.has("--json")) return Status::ok();
  const std::string path = args.get_or("--json", "");
  std::ofstream f(path);
  if (!f) return invalid_argument("--json " + path + ": cannot write");
  f << j.dump(1) << "\n";
  return Status::ok();
}

// Window: --window, else min(1024, max_position_embeddings).
Result<int64_t> window_of(const Args& args, const model::ModelConfig& c) {
  int64_t dflt = 1024;
  if (c.max_position_embeddings > 0) dflt = std::min<int64_t>(dflt, c.max_position_embeddings);
  MX_ASSIGN_OR_RETURN(int64_t w, args.get_int("--window", dflt));
  if (w < 2) return invalid_argument("--window must be at least 2");
  if (c.max_position_embeddings > 0 && w > c.max_position_embeddings)
    return invalid_argument("--window " + std::to_string(w) + " exceeds max_position_embeddings " +
                            std::to_string(c.max_position_embeddings));
  return w;
}

int eval_perplexity(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {"--model", "--text", "--tokenizer", "--backend", "--window", "--stride",
                                       "--max-tokens", "--quantization", "--kv-cache-dtype", "--json"}, {});
  if (!args.is_ok()) return eval_fail(args.status());
  if (!args->has("--model") || !args->has("--text") || !args->positional().empty())
    return eval_fail(invalid_argument("eval perplexity needs --model DIR and --text FILE (and no positional "
                                      "argument; `mxserve eval perplexity --help` lists the flags)"));
  auto kv_dtype = kv_cache_dtype_flag(*args);
  if (!kv_dtype.is_ok()) return eval_fail(kv_dtype.status());
  const std::string dir = *args->get("--model");
  auto be = backend::make_backend(args->get_or("--backend", "cpu"));
  if (!be.is_ok()) return eval_fail(be.status());
  auto m = load_eval_model(dir, args->get_or("--quantization", ""), **be, /*load_mtp=*/false,
                           EvalModelOptions{.kv_cache_dtype = *kv_dtype});
  if (!m.is_ok()) return eval_fail(m.status());
  const auto& cfg = (*m)->model->config();
  auto window = window_of(*args, cfg);
  if (!window.is_ok()) return eval_fail(window.status());
  auto stride = args->get_int("--stride", *window / 2);
  auto max_tokens = args->get_int("--max-tokens", 0);
  if (!stride.is_ok()) return eval_fail(stride.status());
  if (!max_tokens.is_ok()) return eval_fail(max_tokens.status());
  auto ids = text_file_ids(*args->get("--text"), args->get_or("--tokenizer", dir), *max_tokens, cfg.vocab_size);
  if (!ids.is_ok()) return eval_fail(ids.status());
  ProgressLine progress("tokens");
  auto p = eval::sliding_perplexity(*(*m)->model, **be, *ids, *window, *stride,
                                    [&](int64_t done, int64_t total) { progress.update(done, total); });
  progress.finish();
  if (!p.is_ok()) return eval_fail(p.status());
  std::printf("perplexity %.4f over %lld tokens (window %lld, stride %lld; model %s, precision %s, backend %s)\n",
              p->value(), static_cast<long long>(p->tokens), static_cast<long long>(*window),
              static_cast<long long>(*stride), dir.c_str(), (*m)->precision.c_str(), (*be)->name().c_str());
  nlohmann::ordered_json j = {{"model", dir}, {"text", *args->get("--text")}, {"precision", (*m)->precision},
                              {"backend", (*be)->name()}, {"window", *window}, {"stride", *stride},
                              {"tokens", p->tokens}, {"nll_per_token", p->nll_sum / p->tokens},
                              {"perplexity", p->value()}};
  if (auto st = write_json(*args, j); !st.is_ok()) return eval_fail(st);
  return 0;
}

int eval_compare(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {"--model", "--model-b", "--text", "--tokenizer", "--backend", "--backend-b",
                                       "--window", "--max-tokens", "--quantization", "--kv-cache-dtype", "--json",
                                       "--num-layers", "--random-tokens"},
                          {"--synthetic-weights"});
  if (!args.is_ok()) return eval_fail(args.status());
  if (!args->has("--model") || args->has("--text") == args->has("--random-tokens") || !args->positional().empty())
    return eval_fail(invalid_argument("eval compare needs --model DIR and one of --text FILE or --random-tokens N "
                                      "(`mxserve eval compare --help` lists the flags)"));
  // Synthetic weights (--model is a config.json): only the KV cache or the backend can differ between A and B.
  const bool synthetic = args->has("--synthetic-weights");
  if (synthetic && (args->has("--model-b") || args->has("--quantization")))
    return eval_fail(invalid_argument("eval compare --synthetic-weights: A and B share the config; compare "
                                      "--kv-cache-dtype or --backend-b"));
  auto num_layers = args->get_int("--num-layers", 0);
  if (!num_layers.is_ok()) return eval_fail(num_layers.status());
  if (*num_layers < 0 || (*num_layers > 0 && !synthetic))
    return eval_fail(invalid_argument("--num-layers needs --synthetic-weights and must be positive"));
  auto kv_dtype_b = kv_cache_dtype_flag(*args);
  if (!kv_dtype_b.is_ok()) return eval_fail(kv_dtype_b.status());
  const std::string dir_a = *args->get("--model"), dir_b = args->get_or("--model-b", dir_a);
  if (!synthetic)  // both paths checked before either model is loaded, each named by its flag
    for (const auto& [flag, dir] : {std::pair<std::string, std::string>{"--model", dir_a}, {"--model-b", dir_b}})
      if (Status st = launch::check_model_path(dir, flag); !st.is_ok()) return eval_fail(st);
  const std::string backend_a = args->get_or("--backend", "cpu"), backend_b = args->get_or("--backend-b", backend_a);
  const std::string quant_b = args->get_or("--quantization", "");
  if (dir_a == dir_b && backend_a == backend_b && (quant_b.empty() || quant_b == "none") &&
      *kv_dtype_b == kvcache::KvCacheDtype::kAuto)
    return eval_fail(invalid_argument("eval compare: A and B are the same model, precision, KV cache and backend; give "
                                      "--quantization, --kv-cache-dtype, --model-b or --backend-b"));
  auto be_a_r = backend::make_backend(backend_a);
  if (!be_a_r.is_ok()) return eval_fail(be_a_r.status());
  std::unique_ptr<backend::Backend> be_a_own = std::move(*be_a_r), be_b_own;
  backend::Backend* be_a = be_a_own.get();
  backend::Backend* be_b = be_a;
  if (backend_b != backend_a) {
    auto r = backend::make_backend(backend_b);
    if (!r.is_ok()) return eval_fail(r.status());
    be_b_own = std::move(*r);
    be_b = be_b_own.get();
  }
  auto a = load_eval_model(dir_a, "", *be_a, false, EvalModelOptions{.synthetic = synthetic, .num_layers = *num_layers});
  if (!a.is_ok()) return eval_fail(a.status());
  auto b = load_eval_model(dir_b, quant_b, *be_b, false,
                           EvalModelOptions{.kv_cache_dtype = *kv_dtype_b, .synthetic = synthetic, .num_layers = *num_layers});
  if (!b.is_ok()) return eval_fail(b.status());
  const auto& cfg = (*a)->model->config();
  const int64_t V = cfg.vocab_size;
  if ((*b)->model->config().vocab_size != V)
    return eval_fail(invalid_argument("the models' vocabularies differ: " + std::to_string(V) + " vs " +
                                      std::to_string((*b)->model->config().vocab_size)));
  auto window = window_of(*args, cfg);
  auto max_tokens = args->get_int("--max-tokens", 4096);
  if (!window.is_ok()) return eval_fail(window.status());
  if (!max_tokens.is_ok()) return eval_fail(max_tokens.status());
  Result<std::vector<int32_t>> ids = std::vector<int32_t>();
  if (args->has("--random-tokens")) {  // deterministic ids (splitmix64 of the index) for synthetic models
    auto n = args->get_int("--random-tokens", 0);
    if (!n.is_ok()) return eval_fail(n.status());
    if (*n < 2) return eval_fail(invalid_argument("--random-tokens must be at least 2"));
    for (int64_t i = 0; i < *n; ++i) {
      uint64_t z = static_cast<uint64_t>(i) + 0x9e3779b97f4a7c15ull;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      ids->push_back(static_cast<int32_t>((z ^ (z >> 31)) % static_cast<uint64_t>(V)));
    }
  } else {
    ids = text_file_ids(*args->get("--text"), args->get_or("--tokenizer", dir_a), *max_tokens, V);
  }
  if (!ids.is_ok()) return eval_fail(ids.status());
  const std::string text_name = args->has("--text") ? *args->get("--text") : "random:" + std::to_string(ids->size());
  eval::LogitComparison cmp;
  double nll[2] = {0, 0};
  int64_t scored = 0;
  const int64_t N = static_cast<int64_t>(ids->size());
  ProgressLine progress("tokens");
  for (int64_t begin = 0; begin + 1 < N; begin += *window) {  // non-overlapping windows
    std::vector<int32_t> w(ids->begin() + begin, ids->begin() + std::min(begin + *window, N));
    auto la = eval::all_logits(*(*a)->model, *be_a, w);
    auto lb = eval::all_logits(*(*b)->model, *be_b, w);
    if (!la.is_ok()) return eval_fail(la.status());
    if (!lb.is_ok()) return eval_fail(lb.status());
    for (int64_t t = 0; t < static_cast<int64_t>(w.size()); ++t) {
      const float* ra = la->data<float>() + t * V;
      const float* rb = lb->data<float>() + t * V;
      cmp.add_row(ra, rb, V);
      if (t + 1 < static_cast<int64_t>(w.size())) {
        nll[0] -= eval::log_softmax(ra, V)[w[t + 1]];
        nll[1] -= eval::log_softmax(rb, V)[w[t + 1]];
        ++scored;
      }
    }
    progress.update(std::min(begin + *window, N), N);
  }
  progress.finish();
  const double ppl_a = std::exp(nll[0] / std::max<int64_t>(scored, 1)), ppl_b = std::exp(nll[1] / std::max<int64_t>(scored, 1));
  const char* kv_b = kvcache::kv_cache_dtype_name(*kv_dtype_b);
  std::printf("A: %s (%s, %s, kv auto)\nB: %s (%s, %s, kv %s)\n", dir_a.c_str(), (*a)->precision.c_str(),
              be_a->name().c_str(), dir_b.c_str(), (*b)->precision.c_str(), be_b->name().c_str(), kv_b);
  std::printf("tokens: %lld (non-overlapping windows of %lld)\n", static_cast<long long>(cmp.tokens),
              static_cast<long long>(*window));
  std::printf("KL(A||B) per token: mean %.6f  max %.6f\n", cmp.mean_kl(), cmp.kl_max);
  std::printf("top-1 agreement: %.2f%%\n", 100.0 * cmp.top1());
  std::printf("logits: relative L2 %.3e, mean cosine %.6f\n", cmp.rel_l2(), cmp.mean_cos());
  std::printf("perplexity: A %.4f, B %.4f (%+.2f%%)\n", ppl_a, ppl_b, 100.0 * (ppl_b / ppl_a - 1));
  nlohmann::ordered_json j = {{"a", {{"model", dir_a}, {"precision", (*a)->precision}, {"backend", be_a->name()}}},
                              {"b", {{"model", dir_b}, {"precision", (*b)->precision}, {"backend", be_b->name()}, {"kv_cache_dtype", kv_b}}},
                              {"text", text_name}, {"tokens", cmp.tokens}, {"window", *window},
                              {"kl_mean", cmp.mean_kl()}, {"kl_max", cmp.kl_max}, {"top1_agreement", cmp.top1()},
                              {"logits_rel_l2", cmp.rel_l2()}, {"cosine_mean", cmp.mean_cos()},
                              {"perplexity_a", ppl_a}, {"perplexity_b", ppl_b}};
  if (auto st = write_json(*args, j); !st.is_ok()) return eval_fail(st);
  return 0;
}

}  // namespace

int cmd_eval(int argc, char** argv) {
  if (argc < 2) return eval_fail(invalid_argument(kUsage));
  const std::string sub = argv[1];
  if (sub == "perplexity") return eval_perplexity(argc - 1, argv + 1);
  if (sub == "compare") return eval_compare(argc - 1, argv + 1);
  if (sub == "acceptance") return eval_acceptance(argc - 1, argv + 1);
  if (sub == "tasks") return eval_tasks(argc - 1, argv + 1);
  if (sub == "--help" || sub == "-h") {
    print_command_help(*find_command_help("eval"), stdout);
    return 0;
  }
  const std::string near = nearest_name(sub, {"perplexity", "compare", "acceptance", "tasks"});
  return eval_fail(invalid_argument("eval: unknown subcommand '" + sub + "' (" +
                                    (near.empty() ? "" : "did you mean " + near + "? ") +
                                    "`mxserve eval --help` lists them)"));
}

}  // namespace mxserve::cli
