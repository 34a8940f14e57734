// verify-fixture, generate, inspect: the model-level subcommands. Models are built by the launch root
// (launch/launch.h), as the server builds its own.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/fixture.h"
#include "cli/fixture_graphs.h"
#include "io/checkpoint.h"
#include "launch/launch.h"
#include "launch/multinode.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/decisions.h"
#include "model/weight_table.h"
#include "quant/precision_map.h"
#include "runtime/engine.h"
#include "runtime/sequence_runner.h"
#include "cli/graph_flags.h"
#include "cli/runs.h"
#include "launch/model_path.h"
#include "cli/spec_flags.h"
#include "cli/parallel_flags.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

namespace mxserve::cli {
namespace {

int fail(const Status& s, int code = 2) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return code;
}

}  // namespace

int cmd_verify_fixture(int argc, char** argv) {
  std::set<std::string> value_flags = {"--backend", "--block-size", "--chunk-size", "--max-rel-l2", "--kv-cache-dtype"};
  value_flags.insert(kParallelValueFlags.begin(), kParallelValueFlags.end());
  std::set<std::string> bool_flags = kParallelBoolFlags;
  bool_flags.insert("--decision-aware");
  bool_flags.insert(kGraphBoolFlags.begin(), kGraphBoolFlags.end());
  auto args = Args::parse(argc, argv, value_flags, bool_flags);
  if (!args.is_ok()) return fail(args.status());
  if (args->positional().size() != 1)
    return fail(invalid_argument("usage: mxserve verify-fixture DIR [--backend cpu|cuda] [--block-size N] "
                                 "[--tp-size N] [--dp-size N [--enable-dp-attention]] [--ep-size N | --enable-expert-parallel] "
                                 "[--kv-cache-dtype auto|fp8_e4m3 (with a --max-rel-l2 for FP8's error)] [--decision-aware] "
                                 "[--disable-cuda-graph | --enforce-eager | --cuda-graph]"));
  auto parallel = parse_parallel_flags(*args);
  if (!parallel.is_ok()) return fail(parallel.status());
  const std::string backend_name = args->get_or("--backend", "cpu");
  // CUDA graphs (on by default on CUDA, as for generate / serve): decode through graph replays must give the
  // eager engine's tokens (cli/fixture_graphs.h). At tp > 1 the lockstep model captures too (the joined capture
  // on the shared-device stand-in, per-rank graphs over NCCL: launch/lockstep_model.h), its MTP draft steps
  // eagerly; at dp > 1 it refuses graphs (the DP split and merge are host work each step), so nothing to check.
  auto graphs = parse_cuda_graph_flags(*args, backend_name);
  if (!graphs.is_ok()) return fail(graphs.status());
  if (*graphs && backend_name != "cuda")
    return fail(invalid_argument("--cuda-graph: the " + backend_name + " backend has no CUDA graphs (use --backend cuda)"));
  const bool one_rank = parallel->tp == 1 && parallel->dp == 1;
  const bool graphs_checked = parallel->dp == 1;
  if (*graphs && !graphs_checked)
    std::printf("cuda graphs: not checked (--dp-size %d: the DP split and merge are host work each step, so these "
                "steps run eagerly; this run has %d tp x %d dp)\n",
                parallel->dp, parallel->tp, parallel->dp);
  if (launch::process_dist_init().nnodes > 1)
    return fail(unsupported("verify-fixture with --nnodes " + std::to_string(launch::process_dist_init().nnodes) +
                            ": it checks every rank's outputs in one process (run it on one node)"));
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
  const std::string dir = args->positional()[0];
  if (Status st = launch::check_model_path(dir, "fixture directory"); !st.is_ok()) return fail(st);
  launch::LaunchConfig lc;
  lc.model.path = dir;
  lc.model.load_mtp = true;  // the fixture's MTP logits are checked when the model has the layer
  lc.backend = backend_name;
  auto kv_dtype = kvcache::parse_kv_cache_dtype(args->get_or("--kv-cache-dtype", "auto"));
  if (!kv_dtype.is_ok()) return fail(kv_dtype.status());
  lc.model.kv_cache_dtype = *kv_dtype;
  lc.parallel = *parallel;
  auto lm = launch::launch_model(lc);
  if (!lm.is_ok()) return fail(lm.status());
  // Decision-aware checks (cli/fixture_decisions.h): always on a reduced-precision backend, on request on the CPU;
  // the reference is the fixture on the CPU backend in f32; the bound is bf16's rounding (the CPU run judges as a
  // bf16 backend would be judged).
  opt.decision_aware = args->has("--decision-aware") || (*lm)->backend().activation_dtype() != DType::kF32;
  opt.unit_roundoff = model::kBf16UnitRoundoff;
  std::unique_ptr<backend::Backend> ref_be;
  std::unique_ptr<model::CausalLM> ref_model;
  if (opt.decision_aware) {
    ref_be = backend::make_cpu_backend();
    auto ref = model::load_causal_lm(dir, *ref_be, model::LoadOptions{});
    if (!ref.is_ok()) return fail(ref.status());
    ref_model = std::move(*ref);
    opt.reference = ref_model.get();
    opt.reference_backend = ref_be.get();
  }
  auto report = verify_fixture_model(dir, (*lm)->model(), (*lm)->backend(), opt);
  if (!report.is_ok()) return fail(report.status());
  int failures = report->failures;
  if (*graphs && graphs_checked) {
    auto g = verify_fixture_graphs(dir, (*lm)->model(), (*lm)->backend(), opt.block_size, /*mtp_draft_graphs=*/one_rank);
    if (!g.is_ok()) return fail(g.status());
    failures += g->failures;
  }
  std::printf("%s: %d cases, %d failed checks (tolerance rel_l2 <= %.1e, backend %s, cuda graphs %s)\n", dir.c_str(),
              report->cases, failures, opt.max_rel_l2, (*lm)->backend_name().c_str(),
              *graphs ? (graphs_checked ? "on" : "on, not checked") : "off");
  return failures == 0 ? 0 : 1;
}

// Model source flags of generate: --model DIR, or --config FILE --synthetic-weights.
Result<launch::ModelSource> model_source(const Args& args) {
  launch::ModelSource opt;
  opt.synthetic = args.has("--synthetic-weights");
  if (args.has("--model") == args.has("--config"))
    return invalid_argument("give exactly one of --model DIR or --config FILE (with --synthetic-weights)");
  if (args.has("--config") && !opt.synthetic)
    return invalid_argument("--config needs --synthetic-weights (there is no checkpoint to read)");
  opt.path = args.has("--model") ? *args.get("--model") : *args.get("--config");
  // --seed and --num-layers only shape synthetic weights: with a checkpoint they would be ignored.
  for (const char* f : {"--seed", "--num-layers", "--quantization"})
    if (args.has(f) && !opt.synthetic)
      return invalid_argument(std::string(f) + " applies to --synthetic-weights only (a checkpoint's weights, layers and "
                              "precision are read from it)");
  MX_ASSIGN_OR_RETURN(int64_t seed, args.get_int("--seed", 0));
  MX_ASSIGN_OR_RETURN(opt.num_layers, args.get_int("--num-layers", 0));
  if (opt.num_layers < 0) return invalid_argument("--num-layers must be positive");
  opt.seed = static_cast<uint64_t>(seed);
  opt.synthetic_quantization = args.get_or("--quantization", "");
  MX_ASSIGN_OR_RETURN(opt.kv_cache_dtype, kvcache::parse_kv_cache_dtype(args.get_or("--kv-cache-dtype", "auto")));
  return opt;
}

namespace {

// --prompt-len L: ids 1000, 1001, ... modulo the vocabulary.
std::vector<int32_t> synthetic_prompt(int64_t len, int64_t vocab) {
  std::vector<int32_t> ids(len);
  for (int64_t i = 0; i < len; ++i) ids[i] = static_cast<int32_t>((1000 + i) % vocab);
  return ids;
}

// One engine over `model`: `run.batch` copies of the prompt (copy i with its first token shifted by i, so
// they share no prefix), greedy. Prints the tokens (print_tokens), a summary and a RESULT JSON line.
Status generate_once(launch::LaunchedModel& lm, const std::vector<int32_t>& ids, const GenerateRun& run,
                     int64_t max_tokens, int64_t block_size, bool ignore_eos, bool print_tokens, bool report = true) {
  const auto& cfg = lm.config();
  const auto& spec = run.spec;
  const int64_t batch = run.batch;
  runtime::EngineConfig ec;
  ec.scheduler.block_size = block_size;
  const int64_t per_seq = static_cast<int64_t>(ids.size()) + max_tokens + 32 + spec.num_steps;
  ec.n_blocks = batch * ((per_seq + block_size - 1) / block_size) + 4;
  ec.max_model_len = static_cast<int64_t>(ids.size()) + max_tokens + 1;
  ec.scheduler.max_num_batched_tokens = std::max<int64_t>(ec.scheduler.max_num_batched_tokens, batch * (spec.num_steps + 1));
  ec.eos_token_ids = cfg.eos_token_ids;
  ec.spec = spec;
  ec.cuda_graphs = run.cuda_graphs;
  if (run.cuda_graphs) ec.scheduler.max_running = batch;  // graphs for the buckets this run can use
  const std::unique_ptr<runtime::Engine> engine_ptr = lm.make_engine(ec);
  runtime::Engine& engine = *engine_ptr;
  std::vector<std::vector<int32_t>> outs(batch);
  std::vector<runtime::Usage> usages(batch);
  std::vector<std::chrono::steady_clock::time_point> first_token(batch);
  std::string error;
  for (int64_t b = 0; b < batch; ++b) {
    runtime::RequestSpec req;
    req.prompt = ids;
    if (b > 0) req.prompt[0] = static_cast<int32_t>((req.prompt[0] + b) % cfg.vocab_size);
    req.sampling.temperature = 0;
    req.sampling.max_tokens = static_cast<int32_t>(max_tokens);
    req.sampling.ignore_eos = ignore_eos;
    auto id = engine.submit(req, [&, b](const runtime::TokenEvent& ev) {
      if (ev.token >= 0) {
        if (outs[b].empty()) first_token[b] = std::chrono::steady_clock::now();
        outs[b].push_back(ev.token);
      }
      if (ev.finish != runtime::FinishReason::kNone) usages[b] = ev.usage;
      if (ev.finish == runtime::FinishReason::kError) error = ev.error;
    });
    if (!id.is_ok()) return id.status();
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (!engine.idle()) engine.step();
  const auto t1 = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(t1 - t0).count();
  if (!error.empty()) return internal_error(error);
  if (!report) return Status::ok();
  if (print_tokens)
    for (const auto& out : outs) {
      std::ostringstream os;
      for (size_t i = 0; i < out.size(); ++i) os << (i ? "," : "") << out[i];
      std::printf("%s\n", os.str().c_str());
    }
  // Decode throughput: from the moment every sequence has its first token (prefill over) to the end.
  auto all_first = t0;
  int64_t total = 0;
  for (int64_t b = 0; b < batch; ++b) {
    total += static_cast<int64_t>(outs[b].size());
    if (!outs[b].empty()) all_first = std::max(all_first, first_token[b]);
  }
  const double prefill_s = std::chrono::duration<double>(all_first - t0).count();
  const double decode_s = std::chrono::duration<double>(t1 - all_first).count();
  const double decode_tok_s = decode_s > 0 ? static_cast<double>(total - batch) / decode_s : 0.0;
  const runtime::EngineStats st = engine.stats();
  const double acc_len =
      st.spec.num_drafts > 0 ? 1.0 + static_cast<double>(st.spec.num_accepted_tokens) / st.spec.num_drafts : 1.0;
  const runtime::Usage& usage = usages[0];
  std::fprintf(stderr, "generated %lld tokens in %.3f s (%.1f tok/s)", static_cast<long long>(total), secs, total / secs);
  if (spec.num_steps > 0)
    std::fprintf(stderr, "; speculative: %lld drafted, %lld accepted (acceptance length %.2f per step)",
                 static_cast<long long>(usage.spec_draft_tokens), static_cast<long long>(usage.spec_accepted_tokens),
                 acc_len);
  std::fprintf(stderr, "\n");
  // One machine-readable line (dev/gpu/spec_perf.sh parses it).
  std::fprintf(stderr,
               "RESULT {\"batch\":%lld,\"prompt_len\":%zu,\"generated\":%lld,\"seconds\":%.4f,\"prefill_s\":%.4f,"
               "\"decode_s\":%.4f,\"decode_tok_s\":%.2f,\"spec_steps\":%d,\"simulate\":%.2f,\"adaptive\":%s,"
               "\"acceptance_length\":%.3f,\"final_n\":%d,\"mean_n\":%.2f,\"estimated_gain\":%.3f,\"engine_steps\":%lld,"
               "\"topk\":%d,\"draft_tokens\":%d}\n",
               static_cast<long long>(batch), ids.size(), static_cast<long long>(total), secs, prefill_s, decode_s,
               decode_tok_s, spec.num_steps, spec.simulate_acceptance.value_or(0.0), spec.adaptive ? "true" : "false",
               acc_len, st.spec.current_steps,
               st.spec.num_drafts > 0 ? static_cast<double>(st.spec.num_draft_tokens) / st.spec.num_drafts : 0.0,
               st.spec.estimated_gain, static_cast<long long>(st.steps), spec.topk,
               spec.tree() ? spec.num_draft_tokens : spec.num_steps + 1);
  return Status::ok();
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  std::set<std::string> value_flags = {"--model", "--config", "--ids", "--max-tokens", "--backend", "--block-size",
                                       "--seed", "--num-layers", "--quantization", "--batch", "--prompt-len", "--runs",
                                       "--moe-tuning-dir", "--kv-cache-dtype"};
  std::set<std::string> bool_flags = {"--ignore-eos", "--synthetic-weights"};
  value_flags.insert(kSpecValueFlags.begin(), kSpecValueFlags.end());
  bool_flags.insert(kSpecBoolFlags.begin(), kSpecBoolFlags.end());
  bool_flags.insert(kGraphBoolFlags.begin(), kGraphBoolFlags.end());
  value_flags.insert(kParallelValueFlags.begin(), kParallelValueFlags.end());
  bool_flags.insert(kParallelBoolFlags.begin(), kParallelBoolFlags.end());
  auto args = Args::parse(argc, argv, value_flags, bool_flags);
  if (!args.is_ok()) return fail(args.status());
  auto cuda_graphs = parse_cuda_graph_flags(*args, args->get_or("--backend", "cpu"));
  if (!cuda_graphs.is_ok()) return fail(cuda_graphs.status());
  launch::LaunchConfig lc;
  auto parallel = parse_parallel_flags(*args);
  if (!parallel.is_ok()) return fail(parallel.status());
  if (launch::process_dist_init().node_rank > 0)  // a follower runs node 0's steps: `mxserve serve --node-rank R`
    return fail(unsupported("generate --node-rank " + std::to_string(launch::process_dist_init().node_rank) +
                            ": generate runs on node 0; start the other nodes with `mxserve serve` and the same "
                            "flags (docs/parallel.md \"Several nodes\")"));
  lc.parallel = *parallel;
  auto source = model_source(*args);
  if (!source.is_ok()) return fail(source.status());
  lc.model = *source;
  launch::ModelSource* load = &lc.model;
  auto spec = parse_spec_flags(*args);
  if (!spec.is_ok()) return fail(spec.status());
  load->require_mtp = spec->num_steps > 0;
  // --runs "b=..,n=..,a=..,adaptive=..;...": several engine runs over one loaded model (benchmarks).
  std::vector<GenerateRun> runs;
  if (args->has("--runs")) {
    auto parsed = parse_runs(args->get_or("--runs", ""), *spec);
    if (!parsed.is_ok()) return fail(parsed.status());
    runs = std::move(*parsed);
    for (const auto& r : runs) load->require_mtp = load->require_mtp || r.spec.num_steps > 0;
  }
  // --ids a,b,c or --prompt-len L (ids 1000, 1001, ... modulo the vocabulary: a benchmark prompt).
  if (args->has("--ids") == args->has("--prompt-len")) return fail(invalid_argument("give exactly one of --ids or --prompt-len"));
  Result<std::vector<int32_t>> ids = std::vector<int32_t>{};
  if (args->has("--ids")) {
    auto ids_text = args->get("--ids");
    if (!ids_text.is_ok()) return fail(ids_text.status());
    ids = parse_id_list(*ids_text, "--ids");
  }
  auto prompt_len = args->get_int("--prompt-len", 0);
  if (!prompt_len.is_ok()) return fail(prompt_len.status());
  auto batch = args->get_int("--batch", 1);
  if (!batch.is_ok()) return fail(batch.status());
  if (*batch < 1 || *batch > 4096) return fail(invalid_argument("--batch must be in [1, 4096]"));
  auto max_tokens = args->get_int("--max-tokens", 16);
  auto block_size = args->get_int("--block-size", 16);
  if (!ids.is_ok()) return fail(ids.status());
  if (!max_tokens.is_ok()) return fail(max_tokens.status());
  if (!block_size.is_ok()) return fail(block_size.status());
  if (*max_tokens <= 0 || *block_size <= 0) return fail(invalid_argument("--max-tokens and --block-size must be positive"));
  lc.moe_tuning_dir = args->get_or("--moe-tuning-dir", "");
  lc.backend = args->get_or("--backend", "cpu");
  auto launched = launch::launch_model(lc);
  if (!launched.is_ok()) return fail(launched.status());
  launch::LaunchedModel& lm = **launched;
  const auto& cfg = lm.config();
  if (Status st = lm.spec_self_test(*spec, *block_size); !st.is_ok()) return fail(st);

  if (args->has("--prompt-len")) {
    if (*prompt_len < 1) return fail(invalid_argument("--prompt-len must be positive"));
    ids = synthetic_prompt(*prompt_len, cfg.vocab_size);
  }
  // A context past the model's positions (RoPE beyond max_position_embeddings) is bad input, named, as serve's
  // --max-model-len check does: the prompt of every run plus --max-tokens.
  if (cfg.max_position_embeddings > 0) {
    std::vector<std::pair<int64_t, std::string>> lens = {{static_cast<int64_t>(ids->size()),
                                                          args->has("--ids") ? "--ids" : "--prompt-len"}};
    for (const auto& r : runs)
      if (r.prompt_len > 0) lens.push_back({r.prompt_len, "--runs prompt length"});
    for (const auto& [len, flag] : lens)
      if (len + *max_tokens > cfg.max_position_embeddings)
        return fail(invalid_argument(flag + " (" + std::to_string(len) + " tokens) + --max-tokens " +
                                     std::to_string(*max_tokens) + " exceed the model's max_position_embeddings (" +
                                     std::to_string(cfg.max_position_embeddings) + ")"));
  }
  for (int32_t id : *ids)  // bad input, named, with exit code 2 (not an engine error mid-run)
    if (id >= cfg.vocab_size)
      return fail(invalid_argument("--ids: token id " + std::to_string(id) + " is outside the model's vocabulary (" +
                                   std::to_string(cfg.vocab_size) + " tokens)"));
  if (!runs.empty()) {
    // Warm-up (CUDA context, kernels, allocator): not reported.
    GenerateRun warm{1, runs.front().spec};
    warm.cuda_graphs = *cuda_graphs;
    for (const auto& r : runs) if (r.spec.num_steps > warm.spec.num_steps) warm.spec = r.spec;
    std::vector<int32_t> short_ids(ids->begin(), ids->begin() + std::min<size_t>(ids->size(), 32));
    if (Status st = generate_once(lm, short_ids, warm, 8, *block_size, true, false, false); !st.is_ok())
      return fail(st, 1);
  } else {
    runs.push_back({*batch, *spec});
  }
  for (auto& r : runs) r.cuda_graphs = *cuda_graphs;
  for (const auto& r : runs)
    if (Status st = generate_once(lm, r.prompt_len > 0 ? synthetic_prompt(r.prompt_len, cfg.vocab_size) : *ids, r,
                                  *max_tokens, *block_size, args->has("--ignore-eos"), !args->has("--runs"));
        !st.is_ok())
      return fail(st, 1);
  return 0;
}

int cmd_inspect(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {}, {});
  if (!args.is_ok()) return fail(args.status());
  if (args->positional().size() != 1) return fail(invalid_argument("usage: mxserve inspect DIR|FILE.safetensors"));
  const std::string path = args->positional()[0];
  // A missing path, a hub id or a file that is not a .safetensors: say which (a directory without config.json is
  // fine here: its tensors are listed without the precision map's layer count).
  const bool safetensors_file = path.size() > 12 && path.substr(path.size() - 12) == ".safetensors";
  if (!io::is_directory(path) && !safetensors_file)
    if (Status st = launch::check_model_path(path, "inspect"); !st.is_ok()) return fail(st);
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
