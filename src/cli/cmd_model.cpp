// verify-fixture, generate, inspect: the model-level subcommands.
#include <cstdio>
#include <optional>
#include <sstream>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/fixture.h"
#include "io/checkpoint.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/weight_table.h"
#include "quant/precision_map.h"
#include "runtime/sequence_runner.h"

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
  return opt;
}

int cmd_generate(int argc, char** argv) {
  auto args = Args::parse(argc, argv,
                          {"--model", "--config", "--ids", "--max-tokens", "--backend", "--block-size", "--seed",
                           "--num-layers"},
                          {"--ignore-eos", "--synthetic-weights"});
  if (!args.is_ok()) return fail(args.status());
  std::string model_path;
  auto load = model_load_options(*args, &model_path);
  if (!load.is_ok()) return fail(load.status());
  load->load_mtp = false;
  auto ids_text = args->get("--ids");
  if (!ids_text.is_ok()) return fail(ids_text.status());
  auto ids = parse_id_list(*ids_text, "--ids");
  auto max_tokens = args->get_int("--max-tokens", 16);
  auto block_size = args->get_int("--block-size", 16);
  if (!ids.is_ok()) return fail(ids.status());
  if (!max_tokens.is_ok()) return fail(max_tokens.status());
  if (!block_size.is_ok()) return fail(block_size.status());
  if (*max_tokens <= 0 || *block_size <= 0) return fail(invalid_argument("--max-tokens and --block-size must be positive"));
  auto be = backend::make_backend(args->get_or("--backend", "cpu"));
  if (!be.is_ok()) return fail(be.status());
  auto model = model::load_causal_lm(model_path, **be, *load);
  if (!model.is_ok()) return fail(model.status());
  const auto& cfg = (*model)->config();
  for (int32_t id : *ids)
    if (id >= cfg.vocab_size)
      return fail(invalid_argument("--ids: token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                   std::to_string(cfg.vocab_size) + ")"));
  const int64_t total = static_cast<int64_t>(ids->size()) + *max_tokens;
  runtime::SequenceRunner runner(**model, **be, total / *block_size + 2, *block_size);
  std::vector<int64_t> stop = args->has("--ignore-eos") ? std::vector<int64_t>{} : cfg.eos_token_ids;
  auto out = runner.greedy(*ids, *max_tokens, 512, stop);
  if (!out.is_ok()) return fail(out.status());
  std::ostringstream os;
  for (size_t i = 0; i < out->size(); ++i) os << (i ? "," : "") << (*out)[i];
  std::printf("%s\n", os.str().c_str());
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
