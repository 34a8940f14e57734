// verify-fixture, generate, inspect: the model-level subcommands.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/fixture.h"
#include "io/checkpoint.h"
#include "kernels/moe_tuning.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/weight_table.h"
#include "quant/precision_map.h"
#include "runtime/engine.h"
#include "runtime/sequence_runner.h"
#include "cli/spec_flags.h"

#include <chrono>
#include <set>

namespace mxserve::cli {
namespace {

int fail(const Status& s, int code = 2) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return code;
}

}  // namespace

int cmd_verify_fixture(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {"--backend", "--block-size", "--chunk-size", "--max-rel-l2"}, {});
  if (!args.is_ok()) return fail(args.status());
  if (args->positional().size() != 1)
    return fail(invalid_argument("usage: mxserve verify-fixture DIR [--backend cpu|cuda] [--block-size N]"));
  FixtureOptions opt;
  auto bs = args->get_int("--block-size", 16);
  auto cs = args->get_int("--chunk-size", 7);
  auto tol = args->get_double("--max-rel-l2", 1e-4);
  if (!bs.is_ok()) return fail(bs.status());
  if (!cs.is_ok()) return fail(cs.status());
  if (!tol.is_ok()) return fail(tol.status());
  if (*bs <= 0 || *cs <= 0) return fail(invalid_argument("--block-size and --chunk-size must be positive"));
  opt.block_size = *bs;
  opt.chunk_size = *cs;
  opt.max_rel_l2 = *tol;
  auto be = backend::make_backend(args->get_or("--backend", "cpu"));
  if (!be.is_ok()) return fail(be.status());
  const std::string dir = args->positional()[0];
  auto report = verify_fixture(dir, **be, opt);
  if (!report.is_ok()) return fail(report.status());
  std::printf("%s: %d cases, %d failed checks (tolerance rel_l2 <= %.1e, backend %s)\n", dir.c_str(),
              report->cases, report->failures, opt.max_rel_l2, (*be)->name().c_str());
  return report->failures == 0 ? 0 : 1;
}

// Model source flags shared by generate and serve: --model DIR, or --config FILE --synthetic-weights.
Result<model::LoadOptions> model_load_options(const Args& args, std::string* path) {
  model::LoadOptions opt;
  opt.synthetic = args.has("--synthetic-weights");
  if (args.has("--model") == args.has("--config"))
    return invalid_argument("give exactly one of --model DIR or --config FILE (with --synthetic-weights)");
  if (args.has("--config") && !opt.synthetic)
    return invalid_argument("--config needs --synthetic-weights (there is no checkpoint to read)");
  *path = args.has("--model") ? *args.get("--model") : *args.get("--config");
  MX_ASSIGN_OR_RETURN(int64_t seed, args.get_int("--seed", 0));
  MX_ASSIGN_OR_RETURN(opt.num_layers_override, args.get_int("--num-layers", 0));
  if (opt.num_layers_override < 0) return invalid_argument("--num-layers must be positive");
  opt.seed = static_cast<uint64_t>(seed);
  opt.synthetic_quantization = args.get_or("--quantization", "");
  return opt;
}

int cmd_generate(int argc, char** argv) {
  std::set<std::string> value_flags = {"--model", "--config", "--ids", "--max-tokens", "--backend", "--block-size",
                                       "--seed", "--num-layers", "--quantization", "--moe-tuning-dir"};
  std::set<std::string> bool_flags = {"--ignore-eos", "--synthetic-weights"};
  value_flags.insert(kSpecValueFlags.begin(), kSpecValueFlags.end());
  bool_flags.insert(kSpecBoolFlags.begin(), kSpecBoolFlags.end());
  auto args = Args::parse(argc, argv, value_flags, bool_flags);
  if (!args.is_ok()) return fail(args.status());
  std::string model_path;
  auto load = model_load_options(*args, &model_path);
  if (!load.is_ok()) return fail(load.status());
  auto spec = parse_spec_flags(*args);
  if (!spec.is_ok()) return fail(spec.status());
  load->load_mtp = spec->num_steps > 0;
  auto ids_text = args->get("--ids");
  if (!ids_text.is_ok()) return fail(ids_text.status());
  auto ids = parse_id_list(*ids_text, "--ids");
  auto max_tokens = args->get_int("--max-tokens", 16);
  auto block_size = args->get_int("--block-size", 16);
  if (!ids.is_ok()) return fail(ids.status());
  if (!max_tokens.is_ok()) return fail(max_tokens.status());
  if (!block_size.is_ok()) return fail(block_size.status());
  if (*max_tokens <= 0 || *block_size <= 0) return fail(invalid_argument("--max-tokens and --block-size must be positive"));
  if (args->has("--moe-tuning-dir"))  // before the backend: it validates every table's variant names
    if (Status s = kernels::add_global_moe_tuning_dir(args->get_or("--moe-tuning-dir", "")); !s.is_ok()) return fail(s);
  auto be = backend::make_backend(args->get_or("--backend", "cpu"));
  if (!be.is_ok()) return fail(be.status());
  auto model = model::load_causal_lm(model_path, **be, *load);
  if (!model.is_ok()) return fail(model.status());
  if (spec->num_steps > 0 && !(*model)->has_mtp())
    return fail(invalid_argument("--speculative-algorithm mtp: the model has no MTP layer (num_nextn_predict_layers)"));
  const auto& cfg = (*model)->config();

  runtime::EngineConfig ec;
  ec.scheduler.block_size = *block_size;
  ec.n_blocks = (static_cast<int64_t>(ids->size()) + *max_tokens + 32) / *block_size + 4;
  ec.max_model_len = static_cast<int64_t>(ids->size()) + *max_tokens + 1;
  ec.eos_token_ids = cfg.eos_token_ids;
  ec.spec = *spec;
  runtime::Engine engine(ec, runtime::make_model_executor(**model, **be, ec.n_blocks, ec.scheduler.block_size));
  runtime::RequestSpec req;
  req.prompt = *ids;
  req.sampling.temperature = 0;
  req.sampling.max_tokens = static_cast<int32_t>(*max_tokens);
  req.sampling.ignore_eos = args->has("--ignore-eos");
  std::vector<int32_t> out;
  runtime::Usage usage;
  std::string error;
  std::chrono::steady_clock::time_point first_token;
  auto id = engine.submit(req, [&](const runtime::TokenEvent& ev) {
    if (ev.token >= 0 && out.empty()) first_token = std::chrono::steady_clock::now();
    if (ev.token >= 0) out.push_back(ev.token);
    if (ev.finish != runtime::FinishReason::kNone) usage = ev.usage;
    if (ev.finish == runtime::FinishReason::kError) error = ev.error;
  });
  if (!id.is_ok()) return fail(id.status());
  const auto t0 = std::chrono::steady_clock::now();
  while (!engine.idle()) engine.step();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!error.empty()) return fail(internal_error(error), 1);
  std::ostringstream os;
  for (size_t i = 0; i < out.size(); ++i) os << (i ? "," : "") << out[i];
  std::printf("%s\n", os.str().c_str());
  std::fprintf(stderr, "generated %zu tokens in %.3f s (%.1f tok/s)", out.size(), secs, out.size() / secs);
  if (out.size() > 1) {  // steady state: the first step carries the prefill and one-time kernel loading
    const double ttft = std::chrono::duration<double>(first_token - t0).count();
    std::fprintf(stderr, "; time to first token %.3f s, decode %.1f tok/s", ttft,
                 static_cast<double>(out.size() - 1) / std::max(secs - ttft, 1e-9));
  }
  if (spec->num_steps > 0)
    std::fprintf(stderr, "; speculative: %lld drafted, %lld accepted (acceptance length %.2f per step)",
                 static_cast<long long>(usage.spec_draft_tokens), static_cast<long long>(usage.spec_accepted_tokens),
                 engine.stats().spec.num_drafts > 0
                     ? 1.0 + static_cast<double>(engine.stats().spec.num_accepted_tokens) / engine.stats().spec.num_drafts
                     : 1.0);
  std::fprintf(stderr, "\n");
  return 0;
}

int cmd_inspect(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {}, {});
  if (!args.is_ok()) return fail(args.status());
  if (args->positional().size() != 1) return fail(invalid_argument("usage: mxserve inspect DIR|FILE.safetensors"));
  const std::string path = args->positional()[0];
  auto ckpt = io::Checkpoint::open(path);
  if (!ckpt.is_ok()) return fail(ckpt.status());
  int64_t n_layers = -1;
  quant::DetectOptions dopt;
  std::optional<model::ModelConfig> cfg;
  if (io::is_directory(path) && io::file_exists(path + "/config.json")) {
    auto c = model::load_model_config(path);
    if (!c.is_ok()) return fail(c.status());
    cfg = *c;
    n_layers = cfg->n_layers;
    if (cfg->quant && cfg->quant->block_rows > 0) {
      dopt.fp8_block_rows = cfg->quant->block_rows;
      dopt.fp8_block_cols = cfg->quant->block_cols;
    }
  }
  std::printf("%-64s %-9s %-22s %s\n", "tensor", "dtype", "shape", "precision");
  for (const auto& name : (*ckpt)->names()) {
    const auto* t = (*ckpt)->find(name);
    std::printf("%-64s %-9s %-22s %s\n", name.c_str(), dtype_name(t->info->dtype),
                shape_to_string(t->info->shape).c_str(), quant::tensor_precision_label(**ckpt, name, dopt).c_str());
  }
  std::printf("%zu tensors in %zu file(s)\n", (*ckpt)->names().size(), (*ckpt)->num_files());
  const quant::PrecisionMap map = quant::precision_map(**ckpt, n_layers, dopt);
  std::printf("precision map (Linear weights; counts after 'x'):\n%s", quant::format_precision_map(map).c_str());
  if (cfg) {
    std::printf("config: %s\n", model::describe_config(*cfg).c_str());
    if (cfg->quant)
      std::printf("quantization_config: quant_method %s\n", quant::quant_method_name(cfg->quant->method));
  }
  return map.errors.empty() ? 0 : 1;
}

}  // namespace mxserve::cli
