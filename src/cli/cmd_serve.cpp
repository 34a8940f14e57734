// mxserve serve: the OpenAI-compatible server. Parses flags (vLLM/SGLang names where the meaning
// matches), binds the port first (so /health answers 503 while the model loads), loads the model,
// publishes it, then waits for SIGINT/SIGTERM: stop taking work, let in-flight requests finish for
// --shutdown-timeout seconds, abort the rest, stop. A second signal exits at once.
#include <atomic>
#include <csignal>
#include <set>
#include <cstdio>
#include <thread>

#include "chat/output_parser.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/graph_flags.h"
#include "cli/spec_flags.h"
#include "cli/parallel_flags.h"
#include "core/logging.h"
#include "server/http_server.h"
#include "server/serving_model.h"

namespace mxserve::cli {
namespace {

const char* kUsage = R"(usage: mxserve serve (--model DIR | --config FILE --synthetic-weights) [flags]

model:
  --model DIR                  checkpoint directory (config.json + safetensors); tokenizer files too
  --config FILE                a config.json (or its directory), with --synthetic-weights
  --synthetic-weights          deterministic random weights instead of a checkpoint
  --num-layers N               override num_hidden_layers (synthetic weights)
  --seed N                     synthetic weight seed (0)
  --quantization EXPERTS[:REST]  synthetic weights' precision plan, each mxfp4|fp8-block|bf16
                               (e.g. mxfp4:fp8-block: MXFP4 routed experts, FP8 other projections)
  --tokenizer DIR              tokenizer.json + tokenizer_config.json (default: the model directory)
  --backend cpu|cuda           (cpu)
  --moe-tuning-dir DIR         MoE kernel tables (*.json from `mxserve tune-moe`) added to, and overriding, the
                               ones built in from configs/moe/ (docs/cuda.md "MXFP4 MoE: tuned tables and selection")
server:
  --host ADDR                  (127.0.0.1; 0.0.0.0 for all interfaces)
  --port N                     (8000)
  --served-model-name NAME     the model id clients send (default: the --model/--config path)
  --api-key KEY                require 'Authorization: Bearer KEY' on /v1/*
  --max-request-body-bytes N   decoded request bodies larger than this get a 413 (8MiB)
  --http-threads N             requests handled at once; idle or slow connections hold no thread (2048)
  --max-connections N          open connections; beyond, the longest-waiting idle one is closed (8192)
  --max-header-bytes N         request line + headers larger than this get a 431 (32KiB)
  --max-header-count N         more header fields than this get a 431 (100)
  --http-header-timeout S      a request head must arrive within S seconds of its first byte (10)
  --http-body-timeout S        a request body must arrive within S seconds of its head (60)
  --http-keepalive-timeout S   an idle kept-alive connection is closed after S seconds (30)
  --http-write-timeout S       a client that reads nothing of its response for S seconds is dropped (30)
  --max-logprobs N             largest top_logprobs / completions logprobs (20, as vLLM)
  --max-logprob-entries N      non-streaming: n x max_tokens x (top_logprobs + 1) above this is a 400 (262144)
  --stats-interval S           seconds between stats log lines, 0 = off (10)
  --allowed-origins LIST       CORS: origins a browser page may call from (comma-separated or a JSON list;
                               * = any); off by default
  --spec-acceptance-alarm B    warn (and set mxserve:spec_decode_acceptance_collapsed) when the first draft
                               is accepted in fewer than B of the last --spec-acceptance-window verify steps
                               (0.2; 0 = off)
  --spec-acceptance-window N   verify steps the alarm judges (256)
  --shutdown-timeout S         on SIGINT/SIGTERM, wait this long for in-flight requests (10)
  --log-level debug|info|warn|error
runtime:
  --max-model-len N            prompt + output limit (default: max_position_embeddings, capped by the KV cache)
  --max-num-seqs N             running requests per step (256)
  --max-num-batched-tokens N   tokens per step (2048; 8192 with --backend cuda, as vLLM on H100/H200-class GPUs:
                               a lone 10k prompt's TTFT 1.01 s -> 0.96 s on GLM-4.5-Air, docs/perf/prefill.md)
  --chunked-prefill-size N     prefill tokens per step (2048; 8192 with --backend cuda)
  --max-itl-ms MS              ITL target: a step with decodes takes only the prefill tokens that keep its
                               predicted time (a cost model fitted online) within MS; 0 = the two caps above
                               alone (50; docs/scheduling.md)
  --min-prefill-chunk N        prefill tokens a step with decodes always gets under --max-itl-ms (256)
  --slo-ttft-ms MS             TTFT target: prefills ordered earliest deadline first (arrival + MS), those
                               predicted to miss it after the others, a near-deadline prefill's chunk may pass
                               --chunked-prefill-size (still within --max-itl-ms); 0 = off, FCFS (0;
                               docs/scheduling.md)
  --block-size N               tokens per KV block (16)
  --kv-cache-memory SIZE       KV pool size, e.g. 4GiB (1GiB); it holds the KV cache only (the model's layout: K and V)
  --num-kv-blocks N            KV pool size in blocks (overrides --kv-cache-memory)
  --kv-cache-dtype auto|bf16|fp8_e4m3|fp8  KV cache element type (auto = bf16 on cuda, f32 on cpu); fp8_e4m3
                               stores e4m3 codes + one f32 scale per (token, kv head): ~1.9x the tokens per GiB
  --moe-activation-dtype bf16|fp8_e4m3  MXFP4 experts' prefill GEMMs: bf16 activations (W4A16, default) or
                               per-token FP8 e4m3 (W4A8: 2x the tensor-core rate, a few % logit error; an
                               accuracy gate against bf16 is logged at start-up; docs/perf/prefill.md)
  --disable-prefix-cache       (aliases --disable-radix-cache, --no-enable-prefix-caching)
  --max-queued-requests N      waiting requests beyond which new ones get 503 + Retry-After (1024)
  --cuda-graph                 replay CUDA graphs for plain decode steps (default on the CUDA backend);
                               --disable-cuda-graph / --enforce-eager keep every step eager
chat output (docs/server.md "Reasoning and tool calls"):
  --tool-call-parser NAME      glm45 (GLM-4.5/4.6) | glm47 (GLM-4.7/5.x) | none; default: detected from the
                               chat template (logged)
  --reasoning-parser NAME      glm45 (<think>...</think> -> reasoning_content) | none; default: detected
speculative decoding (MTP):
  --speculative-algorithm mtp  draft with the model's MTP layer (aliases NEXTN, EAGLE)
  --speculative-num-steps N    drafted tokens per step (3); the tree depth in tree mode
  --speculative-eagle-topk K   1: chain mode (default); K > 1: tree mode, K children per expanded node
  --speculative-num-draft-tokens M  tree mode: verify the best M - 1 draft nodes (sglang counts the
                               verified token too; default 1 + min(N*K, tree capacity)); chain: N + 1
  --no-speculative-adaptive    keep N fixed (by default N drops when drafts are not accepted)
  --speculative-simulate-acceptance A  accept drafts at this simulated mean length per step: the output is
                               MEANINGLESS; allowed only with --benchmark-mode
  --benchmark-mode             allow benchmark-only settings (--speculative-simulate-acceptance); responses carry
                               'x-mxserve-simulated-acceptance: true' and /metrics mxserve:spec_decode_simulated_acceptance
)";

std::atomic<int> g_stop_signals{0};

void on_stop_signal(int) {
  if (g_stop_signals.fetch_add(1) >= 1) std::_Exit(130);
}

int fail(const Status& s) {
  std::fprintf(stderr, "error: %s\n\n%s", s.to_string().c_str(), kUsage);
  return 2;
}

Result<int64_t> positive(const Args& a, const std::string& flag, int64_t fallback) {
  auto v = a.get_int(flag, fallback);
  if (!v.is_ok()) return v.status();
  if (*v <= 0) return invalid_argument("flag " + flag + " must be positive, got " + std::to_string(*v));
  return *v;
}

Result<double> positive_seconds(const Args& a, const std::string& flag, double fallback) {
  auto v = a.get_double(flag, fallback);
  if (!v.is_ok()) return v.status();
  if (!(*v > 0) || *v > 86400) return invalid_argument("flag " + flag + " must be in (0, 86400] seconds");
  return *v;
}

#define MX_CLI_TRY(lhs, expr) \
  auto lhs##_r = (expr);      \
  if (!lhs##_r.is_ok()) return fail(lhs##_r.status()); \
  auto lhs = *lhs##_r

}  // namespace

int cmd_serve(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf("%s\nparallel:\n%s", kUsage, kParallelUsage);
      return 0;
    }
  std::set<std::string> value_flags = {"--model", "--config", "--num-layers", "--seed", "--quantization", "--tokenizer", "--backend", "--moe-tuning-dir", "--host", "--port",
       "--served-model-name", "--api-key", "--max-request-body-bytes", "--http-threads", "--stats-interval",
       "--max-connections", "--max-header-bytes", "--max-header-count", "--http-header-timeout", "--http-body-timeout",
       "--http-keepalive-timeout", "--http-write-timeout", "--max-logprobs", "--max-logprob-entries",
       "--shutdown-timeout", "--log-level", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens",
       "--chunked-prefill-size", "--block-size", "--kv-cache-memory", "--num-kv-blocks", "--kv-cache-dtype",
       "--moe-activation-dtype", "--max-queued-requests", "--tool-call-parser", "--reasoning-parser", "--max-itl-ms", "--min-prefill-chunk"};
  value_flags.insert("--slo-ttft-ms");
  std::set<std::string> bool_flags = {"--synthetic-weights", "--disable-prefix-cache", "--disable-radix-cache",
                                      "--no-enable-prefix-caching", "--benchmark-mode"};
  value_flags.insert({"--allowed-origins", "--spec-acceptance-alarm", "--spec-acceptance-window"});
  value_flags.insert(kSpecValueFlags.begin(), kSpecValueFlags.end());
  bool_flags.insert(kSpecBoolFlags.begin(), kSpecBoolFlags.end());
  bool_flags.insert(kGraphBoolFlags.begin(), kGraphBoolFlags.end());
  value_flags.insert(kParallelValueFlags.begin(), kParallelValueFlags.end());
  bool_flags.insert(kParallelBoolFlags.begin(), kParallelBoolFlags.end());
  auto args = Args::parse(argc, argv, value_flags, bool_flags);
  if (!args.is_ok()) return fail(args.status());
  const Args& a = *args;
  if (!a.positional().empty()) return fail(invalid_argument("unexpected argument '" + a.positional()[0] + "'"));
  if (a.has("--log-level")) {
    LogLevel level;
    if (!parse_log_level(a.get_or("--log-level", ""), &level))
      return fail(invalid_argument("--log-level must be debug, info, warn or error"));
    set_log_level(level);
  }

  server::ServingConfig sc;
  const bool synthetic = a.has("--synthetic-weights");
  if (a.has("--model") == a.has("--config")) return fail(invalid_argument("give exactly one of --model DIR or --config FILE"));
  if (a.has("--config") && !synthetic) return fail(invalid_argument("--config needs --synthetic-weights (no checkpoint)"));
  if (a.has("--num-layers") && !synthetic) return fail(invalid_argument("--num-layers needs --synthetic-weights"));
  if (a.has("--seed") && !synthetic)
    return fail(invalid_argument("--seed seeds synthetic weights only; with --model the weights are read from the checkpoint "
                                 "(a request's sampling seed is its \"seed\" field)"));
  sc.model_path = a.has("--model") ? a.get_or("--model", "") : a.get_or("--config", "");
  sc.synthetic_weights = synthetic;
  MX_CLI_TRY(num_layers, a.get_int("--num-layers", 0));
  if (num_layers < 0) return fail(invalid_argument("--num-layers must be positive"));
  sc.num_layers = num_layers;
  MX_CLI_TRY(seed, a.get_int("--seed", 0));
  sc.seed = static_cast<uint64_t>(seed);
  sc.synthetic_quantization = a.get_or("--quantization", "");
  if (!sc.synthetic_quantization.empty() && !synthetic)
    return fail(invalid_argument("--quantization needs --synthetic-weights (a checkpoint's precision is read from it)"));
  sc.tokenizer_dir = a.get_or("--tokenizer", "");
  sc.backend = a.get_or("--backend", "cpu");
  MX_CLI_TRY(parallel, parse_parallel_flags(a));
  sc.parallel = parallel;
  sc.moe_tuning_dir = a.get_or("--moe-tuning-dir", "");
  if (sc.backend != "cpu" && sc.backend != "cuda") return fail(invalid_argument("--backend must be cpu or cuda"));
  MX_CLI_TRY(max_model_len, a.get_int("--max-model-len", 0));
  if (max_model_len < 0) return fail(invalid_argument("--max-model-len must be positive"));
  sc.max_model_len = max_model_len;
  MX_CLI_TRY(max_num_seqs, positive(a, "--max-num-seqs", 256));
  // Larger prefill chunks keep the GPU's MoE and attention kernels in their efficient buckets; decode steps stay
  // protected by --max-itl-ms, which trims the prefill share of a mixed step.
  const int64_t default_step_tokens = sc.backend == "cuda" ? 8192 : 2048;
  MX_CLI_TRY(max_batched, positive(a, "--max-num-batched-tokens", default_step_tokens));
  MX_CLI_TRY(chunked, positive(a, "--chunked-prefill-size", default_step_tokens));
  MX_CLI_TRY(block_size, positive(a, "--block-size", 16));
  MX_CLI_TRY(max_itl_ms, a.get_double("--max-itl-ms", 50));
  if (!(max_itl_ms >= 0) || max_itl_ms > 1e6)
    return fail(invalid_argument("--max-itl-ms must be a number of milliseconds >= 0 (0 = off), got " +
                                 a.get_or("--max-itl-ms", "")));
  MX_CLI_TRY(min_prefill_chunk, positive(a, "--min-prefill-chunk", 256));
  sc.max_itl_seconds = max_itl_ms / 1e3;
  sc.min_prefill_chunk = min_prefill_chunk;
  MX_CLI_TRY(slo_ttft_ms, a.get_double("--slo-ttft-ms", 0));
  if (!(slo_ttft_ms >= 0) || slo_ttft_ms > 1e7)
    return fail(invalid_argument("--slo-ttft-ms must be a number of milliseconds >= 0 (0 = off), got " +
                                 a.get_or("--slo-ttft-ms", "")));
  sc.slo_ttft_seconds = slo_ttft_ms / 1e3;
  MX_CLI_TRY(num_blocks, a.get_int("--num-kv-blocks", 0));  // 0: unset, sized from --kv-cache-memory
  if (a.has("--num-kv-blocks") && num_blocks <= 0)
    return fail(invalid_argument("--num-kv-blocks must be positive, got " + std::to_string(num_blocks) +
                                 " (leave it out to size the pool from --kv-cache-memory)"));
  MX_CLI_TRY(max_queued, positive(a, "--max-queued-requests", 1024));
  sc.max_num_seqs = max_num_seqs;
  sc.max_num_batched_tokens = max_batched;
  sc.chunked_prefill_size = chunked;
  sc.block_size = block_size;
  sc.num_kv_blocks = num_blocks;
  MX_CLI_TRY(kv_dtype, kvcache::parse_kv_cache_dtype(a.get_or("--kv-cache-dtype", "auto")));
  sc.kv_cache_dtype = kv_dtype;
  sc.moe_activation_dtype = a.get_or("--moe-activation-dtype", "bf16");
  if (sc.moe_activation_dtype != "bf16" && sc.moe_activation_dtype != "fp8_e4m3")
    return fail(invalid_argument("--moe-activation-dtype must be bf16 or fp8_e4m3, got '" + sc.moe_activation_dtype + "'"));
  if (sc.moe_activation_dtype == "fp8_e4m3" && sc.backend != "cuda")
    return fail(invalid_argument("--moe-activation-dtype fp8_e4m3 needs --backend cuda (FP8 wgmma MoE kernels)"));
  sc.max_queued_requests = max_queued;
  if (a.has("--kv-cache-memory")) {
    MX_CLI_TRY(kv_bytes, server::parse_byte_size(a.get_or("--kv-cache-memory", "")));
    sc.kv_cache_bytes = kv_bytes;
  }
  sc.tool_call_parser = a.get_or("--tool-call-parser", "");
  sc.reasoning_parser = a.get_or("--reasoning-parser", "");
  if (a.has("--tool-call-parser")) {
    MX_CLI_TRY(tool_format, chat::parse_tool_call_format(sc.tool_call_parser));
    (void)tool_format;
  }
  if (a.has("--reasoning-parser")) {
    MX_CLI_TRY(reasoning_format, chat::parse_reasoning_format(sc.reasoning_parser));
    (void)reasoning_format;
  }
  MX_CLI_TRY(spec, parse_spec_flags(a));
  sc.spec = spec;
  sc.benchmark_mode = a.has("--benchmark-mode");
  if (spec.simulate_acceptance && !sc.benchmark_mode)
    return fail(invalid_argument("--speculative-simulate-acceptance makes every response meaningless (drafts are "
                                 "accepted at a simulated rate, not verified by the model): add --benchmark-mode to "
                                 "serve it anyway, for throughput measurements only"));
  if (sc.benchmark_mode && !spec.simulate_acceptance)
    return fail(invalid_argument("--benchmark-mode without a benchmark setting: it only allows "
                                 "--speculative-simulate-acceptance A"));
  if (sc.benchmark_mode) {
    MX_LOG(kWarn) << "BENCHMARK MODE: drafts are accepted at a simulated mean length of " << *spec.simulate_acceptance
                  << " per step, not verified; every response is marked x-mxserve-simulated-acceptance: true";
  }
  sc.enable_prefix_cache =
      !(a.has("--disable-prefix-cache") || a.has("--disable-radix-cache") || a.has("--no-enable-prefix-caching"));
  MX_CLI_TRY(cuda_graphs, parse_cuda_graph_flags(a, sc.backend));
  sc.cuda_graphs = cuda_graphs;

  server::ServerOptions so;
  so.host = a.get_or("--host", "127.0.0.1");
  MX_CLI_TRY(port, a.get_int("--port", 8000));
  if (port < 0 || port > 65535) return fail(invalid_argument("--port must be in [0, 65535]"));
  so.port = static_cast<int>(port);
  so.served_model_name = a.get_or("--served-model-name", sc.model_path);
  so.model_root = sc.model_path;
  so.api_key = a.get_or("--api-key", "");
  MX_CLI_TRY(body_bytes, positive(a, "--max-request-body-bytes", 8 << 20));
  so.http.max_body_bytes = static_cast<size_t>(body_bytes);
  MX_CLI_TRY(threads, positive(a, "--http-threads", 2048));
  so.http.max_handler_threads = static_cast<int>(std::min<int64_t>(threads, 65536));
  so.http.max_queued_handlers = static_cast<size_t>(so.http.max_handler_threads);
  MX_CLI_TRY(max_connections, positive(a, "--max-connections", 8192));
  so.http.max_connections = static_cast<size_t>(max_connections);
  MX_CLI_TRY(header_bytes, positive(a, "--max-header-bytes", 32 << 10));
  so.http.max_header_bytes = static_cast<size_t>(header_bytes);
  so.http.max_request_line_bytes = std::min(so.http.max_request_line_bytes, so.http.max_header_bytes);
  MX_CLI_TRY(header_count, positive(a, "--max-header-count", 100));
  so.http.max_header_count = static_cast<size_t>(header_count);
  MX_CLI_TRY(header_timeout, positive_seconds(a, "--http-header-timeout", 10));
  so.http.header_timeout_s = header_timeout;
  MX_CLI_TRY(body_timeout, positive_seconds(a, "--http-body-timeout", 60));
  so.http.body_timeout_s = body_timeout;
  MX_CLI_TRY(keepalive_timeout, positive_seconds(a, "--http-keepalive-timeout", 30));
  so.http.keepalive_timeout_s = keepalive_timeout;
  MX_CLI_TRY(write_timeout, positive_seconds(a, "--http-write-timeout", 30));
  so.http.write_timeout_s = write_timeout;
  MX_CLI_TRY(max_logprobs, a.get_int("--max-logprobs", 20));
  if (max_logprobs < 0 || max_logprobs > 1024) return fail(invalid_argument("--max-logprobs must be in [0, 1024]"));
  so.max_logprobs = static_cast<int>(max_logprobs);
  sc.max_logprobs = so.max_logprobs;
  MX_CLI_TRY(max_logprob_entries, positive(a, "--max-logprob-entries", 1 << 18));
  so.max_logprob_entries = max_logprob_entries;
  MX_CLI_TRY(stats_interval, a.get_double("--stats-interval", 10));
  MX_CLI_TRY(shutdown_timeout, a.get_double("--shutdown-timeout", 10));
  so.stats_interval_s = std::max(0.0, stats_interval);
  if (a.has("--allowed-origins")) {
    MX_CLI_TRY(origins, server::parse_allowed_origins(a.get_or("--allowed-origins", "")));
    so.allowed_origins = origins;
  }
  MX_CLI_TRY(alarm_bound, a.get_double("--spec-acceptance-alarm", 0.2));
  if (!(alarm_bound >= 0 && alarm_bound <= 1))
    return fail(invalid_argument("--spec-acceptance-alarm must be in [0, 1] (0 = off)"));
  so.spec_alarm.bound = sc.spec.num_steps > 0 ? alarm_bound : 0;  // nothing to watch without speculation
  MX_CLI_TRY(alarm_window, positive(a, "--spec-acceptance-window", 256));
  so.spec_alarm.window = alarm_window;

  // A handler (not sigwait): threads started before main (BLAS pools) may receive the signal too, and
  // a background job inherits SIGINT ignored. The handler only sets a flag; a second signal exits.
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  server::HttpServer http(so);
  if (Status s = http.bind(); !s.is_ok()) return fail(s);
  http.start();
  MX_LOG(kInfo) << "listening on http://" << so.host << ":" << http.port() << " (/health is 503 until the model is loaded)";

  auto model = server::ServingModel::load(sc);
  if (!model.is_ok()) {
    std::fprintf(stderr, "error: %s\n", model.status().to_string().c_str());
    http.stop();
    return 1;
  }
  http.set_ready((*model)->services());
  MX_LOG(kInfo) << "mxserve is ready: serving '" << so.served_model_name << "' on http://" << so.host << ":" << http.port()
                << " -- POST /v1/chat/completions, POST /v1/completions, POST /v1/messages, GET /v1/models[/{id}], POST /tokenize, POST /detokenize, GET /version, GET /health, GET /metrics";
  std::fflush(stderr);

  while (g_stop_signals.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  MX_LOG(kInfo) << "received a stop signal: draining (up to " << shutdown_timeout << " s; signal again to force)";
  http.begin_drain();
  http.wait_idle(std::max(0.0, shutdown_timeout));
  http.stop();
  (*model)->engine().stop();
  MX_LOG(kInfo) << "stopped";
  return 0;
}

}  // namespace mxserve::cli
