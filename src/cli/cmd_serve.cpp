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
#include "cli/cascade_flags.h"
#include "cli/kv_pool_flags.h"
#include "cli/commands.h"
#include "cli/graph_flags.h"
#include "cli/spec_flags.h"
#include "cli/parallel_flags.h"
#include "core/logging.h"
#include "launch/launch.h"
#include "launch/model_path.h"
#include "launch/multinode.h"
#include "runtime/step_log.h"
#include "server/http_server.h"
#include "server/serving_model.h"

namespace mxserve::cli {
namespace {

std::atomic<int> g_stop_signals{0};

void on_stop_signal(int) {
  if (g_stop_signals.fetch_add(1) >= 1) std::_Exit(130);
}

// One line naming the problem (`mxserve serve --help` lists the flags; no usage dump).
int fail(const Status& s) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
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

// --node-rank R > 0: load this node's ranks, then run node 0's steps until it quits (launch/multinode.h).
int serve_follower_node(const server::ServingConfig& sc) {
  auto lm = launch::launch_model(sc.launch_config());
  if (!lm.is_ok()) {
    std::fprintf(stderr, "error: %s\n", lm.status().to_string().c_str());
    return 1;
  }
  if (Status s = launch::run_follower_node(**lm); !s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  std::set<std::string> value_flags = {"--model", "--config", "--num-layers", "--seed", "--quantization", "--tokenizer", "--backend", "--moe-tuning-dir", "--host", "--port",
       "--served-model-name", "--api-key", "--max-request-body-bytes", "--http-threads", "--stats-interval",
       "--max-connections", "--max-header-bytes", "--max-header-count", "--http-header-timeout", "--http-body-timeout",
       "--http-keepalive-timeout", "--http-write-timeout", "--max-logprobs", "--max-logprob-entries",
       "--shutdown-timeout", "--log-level", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens",
       "--chunked-prefill-size", "--block-size", "--kv-cache-memory", "--gpu-memory-utilization", "--num-kv-blocks", "--kv-cache-dtype",
       "--moe-activation-dtype", "--max-queued-requests", "--tool-call-parser", "--reasoning-parser", "--max-itl-ms", "--min-prefill-chunk"};
  value_flags.insert("--slo-ttft-ms");
  std::set<std::string> bool_flags = {"--synthetic-weights", "--disable-prefix-cache", "--disable-radix-cache",
                                      "--no-enable-prefix-caching", "--benchmark-mode", "--slo-ttft-over-itl"};
  value_flags.insert({"--allowed-origins", "--spec-acceptance-alarm", "--spec-acceptance-window"});
  value_flags.insert(kSpecValueFlags.begin(), kSpecValueFlags.end());
  value_flags.insert({"--kv-cache-host-memory", "--step-log"});
  bool_flags.insert(kSpecBoolFlags.begin(), kSpecBoolFlags.end());
  bool_flags.insert(kGraphBoolFlags.begin(), kGraphBoolFlags.end());
  bool_flags.insert(kCascadeBoolFlags.begin(), kCascadeBoolFlags.end());
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
  // What is wrong with --model, before the port is bound or the tokenizer looked for (launch/model_path.h).
  if (a.has("--model") && !synthetic)
    if (Status st = launch::check_model_path(sc.model_path); !st.is_ok()) return fail(st);
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
  sc.slo_ttft_over_itl = a.has("--slo-ttft-over-itl");
  if (sc.slo_ttft_over_itl && sc.slo_ttft_seconds <= 0)
    return fail(invalid_argument("--slo-ttft-over-itl needs --slo-ttft-ms (the deadline it lets a chunk pass "
                                 "--max-itl-ms for)"));
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
  // On by default where it pays (cli/cascade_flags.h); --disable-cascade-attention turns it off.
  MX_CLI_TRY(cascade, parse_cascade_attention_flags(a));
  sc.cascade_attention = cascade;
  if (sc.moe_activation_dtype != "bf16" && sc.moe_activation_dtype != "fp8_e4m3")
    return fail(invalid_argument("--moe-activation-dtype must be bf16 or fp8_e4m3, got '" + sc.moe_activation_dtype + "'"));
  if (sc.moe_activation_dtype == "fp8_e4m3" && sc.backend != "cuda")
    return fail(invalid_argument("--moe-activation-dtype fp8_e4m3 needs --backend cuda (FP8 wgmma MoE kernels)"));
  sc.max_queued_requests = max_queued;
  if (Status st = parse_kv_pool_flags(a, sc); !st.is_ok()) return fail(st);  // on CUDA the device sizes it by default
  if (a.has("--kv-cache-host-memory")) {
    const std::string text = a.get_or("--kv-cache-host-memory", "");
    if (text != "0") {  // 0 = off
      auto host_bytes = server::parse_byte_size(text);
      if (!host_bytes.is_ok())
        return fail(invalid_argument("--kv-cache-host-memory: " + host_bytes.status().message() + " (0 = off)"));
      sc.kv_cache_host_memory = *host_bytes;
    }
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

  // A follower node of a multi-node launch: no HTTP server; it runs node 0's steps on its ranks.
  const bool follower = launch::process_dist_init().node_rank > 0;
  if (a.has("--step-log")) {  // opened before the port and the model: a bad path fails start-up at once
    if (follower)
      return fail(invalid_argument("--step-log: node 0 runs the engine and writes the log; a follower node "
                                   "(--node-rank > 0) has no steps of its own to log"));
    auto writer = runtime::StepLogWriter::open(a.get_or("--step-log", ""));
    if (!writer.is_ok()) return fail(invalid_argument("--step-log " + writer.status().message()));
    sc.step_log = std::move(*writer);
  }
  if (follower) return serve_follower_node(sc);

  server::HttpServer http(so);
  if (Status s = http.bind(); !s.is_ok()) {
    if (s.message().find("Address already in use") != std::string::npos)
      std::fprintf(stderr, "error: port %d is in use on %s: stop the process holding it or pass --port N\n",
                   so.port, so.host.c_str());
    else
      std::fprintf(stderr, "error: --host %s --port %d: %s\n", so.host.c_str(), so.port, s.to_string().c_str());
    return 1;
  }
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
