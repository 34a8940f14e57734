// BenchConfig: every `mxserve bench` flag, parsed and validated once at the CLI boundary.
// Owns: flag spelling (vLLM/sglang-compatible where they exist), defaults, and the error messages
// that name the bad flag and value. Does not run anything.
// Invariant: a BenchConfig returned by parse_bench_args() is internally consistent (e.g. a closed
// loop has max_concurrency > 0; some stop condition is set).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/arrivals.h"
#include "bench/knee.h"
#include "bench/load_runner.h"
#include "bench/workload.h"
#include "core/status.h"

namespace mxserve::bench {

enum class Endpoint { kChat, kCompletions };

struct CostConfig {
  double gpu_hour_price = 0;      // USD per GPU-hour (0: no cost columns)
  double compare_price = 0;       // USD per GPU-hour of an alternative deployment (0: none)
  int compare_gpus = 0;           // GPUs of the alternative (default: --gpus)
  double compare_throughput = 0;  // its total tok/s per node, e.g. a published figure (0: unknown)
};

struct BenchConfig {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;              // empty: GET /v1/models, take data[0].id
  std::string tokenizer;          // --tokenizer PATH | builtin:words
  std::string corpus;             // --corpus FILE (empty: embedded extract)
  std::string api_key;            // --api-key or $OPENAI_API_KEY
  Endpoint endpoint = Endpoint::kChat;
  WorkloadConfig workload;
  bool ignore_eos = true;
  double temperature = -1;        // <0: not sent (server default)
  std::string extra_body;         // JSON object merged into every request body

  // --workload trace (trace_workload.h): sessions replayed from a JSONL trace.
  std::string trace_file;         // --trace FILE
  double session_rate = 0;        // --session-rate R: session arrivals per second (0: all at start)
  int64_t num_sessions = -1;      // --num-sessions N (-1: the file's sessions, once each)

  ArrivalConfig arrival;
  std::vector<double> rates;      // --request-rate R (one) or --sweep list; +inf: all at once
  int64_t max_concurrency = 0;    // with no rate: closed loop; with a rate: client gate
  int64_t num_requests = -1;      // per rate point, measured (warm-up added on top)
  double duration_s = 0;          // per rate point, measured window for arrivals
  double ready_timeout_s = 300;   // --ready-timeout: wait this long for /health 200 while the server loads
  int64_t warmup_requests = -1;   // -1: workload default (shared-prefix G, single-stream 1, else 0)
  double request_timeout_s = 600;
  HttpClientKind http_client = HttpClientKind::kAuto;

  bool find_knee = false;
  KneeCriteria knee;
  double knee_tolerance = 0.05;
  int knee_max_bisections = 8;

  int gpus = 0;                   // per-GPU columns when > 0
  CostConfig cost;

  std::string output_json;        // result file ("" : none)
  std::string plot_prefix;        // SVG files <prefix>_throughput.svg, <prefix>_ttft.svg
  bool progress = true;
  bool scrape_server_metrics = true;  // GET /metrics before/after each point
  bool save_requests = false;         // per-request records in the JSON
  bool closed_loop() const { return rates.empty(); }
};

// argv[0] is "bench". Returns the config, or an invalid_argument naming the flag; `help` is set and
// an ok config returned for --help.
Result<BenchConfig> parse_bench_args(int argc, char** argv, bool* help);
std::string bench_usage();
// --slo-ttft-p95 (a duration: "5s", "500ms") or --min-success (in [0, 1]) into c, as `bench` and `bench judge`
// take them; errors name the flag and the value.
Status parse_knee_flag(const std::string& flag, const std::string& value, KneeCriteria* c);

}  // namespace mxserve::bench
