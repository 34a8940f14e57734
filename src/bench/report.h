// Report: how results are shown and stored. Owns the final console table in the published layout
// (`Sustained RPS | Total tok/s/node | TTFT p50 / p95 | Success`), the full per-rate metric block,
// the cost arithmetic ($ per million tokens, perf per dollar) and the JSON result document.
// Invariant: the console and JSON show the same numbers (both read RateMetrics / CostFigures).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_config.h"
#include "bench/knee.h"
#include "bench/metrics.h"
#include "bench/server_metrics.h"

namespace mxserve::bench {

struct PointResult {
  RateMetrics metrics;
  Verdict verdict;        // meaningful when a SLO is judged
  std::string phase;      // "sweep", "grid", "bisect", "single"
  SpecDecodeFigures server;  // from the server's /metrics, when it exports them
  nlohmann::json requests;   // per-request records with --save-requests (null otherwise)
};

// One JSON object per request (times in seconds from the point's start; -1 = did not happen).
nlohmann::json requests_to_json(const std::vector<RequestRecord>& records);

// Cost of one rate point. $/Mtok = gpu_hour_price * gpus * 1e6 / (tok/s * 3600).
struct CostFigures {
  bool valid = false;
  double usd_per_mtok_total = 0;    // over input + output tokens (cached input included)
  double usd_per_mtok_output = 0;   // over output tokens only
  double tokens_per_usd = 0;        // total tokens per dollar
  bool has_compare = false;
  double compare_usd_per_mtok_total = 0;   // alternative, when its throughput is known
  double breakeven_tps = 0;         // total tok/s the alternative needs to cost the same per token
  double perf_per_dollar_ratio = 0; // ours / alternative tokens-per-dollar (when its throughput is known)
};
CostFigures compute_cost(const RateMetrics& m, int gpus, const CostConfig& c);

void print_metrics_block(std::ostream& os, const RateMetrics& m, int gpus, const SpecDecodeFigures* server = nullptr);
void print_summary_table(std::ostream& os, const std::vector<PointResult>& points, const BenchConfig& c,
                         const KneeResult* knee);
nlohmann::json result_json(const BenchConfig& c, const std::string& model, const nlohmann::json& workload,
                           const std::string& codec, const std::vector<PointResult>& points,
                           const KneeResult* knee);

}  // namespace mxserve::bench
