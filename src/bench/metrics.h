// RateMetrics: the statistics of one rate point, computed from RequestRecords (pure; no I/O).
// Owns: metric definitions (docs/bench.md restates them):
//  - statistics cover measured requests only (warm-up excluded); latency distributions cover the
//    successful ones; percentiles interpolate linearly between order statistics (numpy's default,
//    as vLLM and sglang);
//  - duration = last measured completion - first measured send (drain tail included, like vLLM);
//  - TTFT = first content chunk - send; E2E = last content chunk - send (vLLM);
//    TPOT = (E2E - TTFT)/(output tokens - 1) per request with > 1 output token;
//    ITL = gaps between consecutive content chunks, pooled over requests (vLLM/sglang OpenAI path);
//  - throughputs = token sums / duration; total = input + output (cached prefix tokens count as
//    input, as in vLLM/sglang); prefill-computed = input - cached;
//  - cached fraction = sum(cached_tokens)/sum(prompt_tokens) over requests whose usage reported it;
//  - peak output tok/s = the most tokens received in one 1-second bin (vLLM/sglang bin the same way;
//    a chunk counts output tokens / content chunks of its request);
//  - tokens per chunk = output tokens / content chunks (> 1 when the server streams several tokens
//    per step, e.g. accepted speculative tokens).
// Invariant: every field is a deterministic function of the records and the run parameters.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/request_record.h"

namespace mxserve::bench {

struct Dist {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p95 = 0, p99 = 0, max = 0;  // seconds (or the metric's unit)
};

// q in [0, 100]; `sorted` ascending and non-empty. Linear interpolation (numpy "linear").
double percentile_sorted(const std::vector<double>& sorted, double q);
Dist summarize(std::vector<double> values);

// The queue after the ramp (the knee's stationarity check, bench/knee.h). At each measured arrival, the
// requests in flight (sent, not yet ended: warm-ups and failures included). A request lives ~ramp_s once the
// server is full (the first quarter's median E2E), so in-flight counts settle only after the first arrival +
// ramp_s: the window is the arrivals after it. Stationary queue: the window's later half holds as many
// requests in flight as its earlier half; an overloaded server's grows by (offered - served) req/s, which a
// TTFT check misses when the scheduler admits prefills first and lets the decodes pile up.
struct InflightTrend {
  bool judged = false;               // the window holds >= max(4, n / 4) of the n measured arrivals
  double ramp_s = 0;                 // first quarter's median E2E
  int64_t window_requests = 0;       // measured arrivals after the first one + ramp_s
  double early_mean = 0, late_mean = 0;  // mean in flight at the window's earlier / later half of arrivals
  double span_s = 0;                 // between the two halves' mean arrival times
  double growth_per_s = 0;           // (late_mean - early_mean) / span_s
  int64_t requests_to_judge = 0;     // measured requests a run at this rate needs: max(2 rate ramp, rate ramp + 4)
};

// records: one rate point's, warm-ups included (they occupy the server); rate: the offered req/s (finite).
InflightTrend inflight_trend(const std::vector<RequestRecord>& records, double rate);

struct RateMetrics {
  double offered_rate = 0;            // req/s asked of the arrival process (+inf: closed loop)
  int64_t max_concurrency = 0;        // client gate (0: none)
  int64_t warmup = 0;                 // warm-up requests excluded
  int64_t sent = 0, completed = 0, failed = 0;
  double success_rate = 0;            // completed / sent
  double duration_s = 0;
  double request_throughput = 0;      // completed / duration
  double realized_arrival_rate = 0;   // (measured requests - 1) / span of their scheduled times
  int64_t input_tokens = 0, output_tokens = 0, cached_tokens = 0;
  int64_t usage_reports = 0, cached_reports = 0;
  double input_tps = 0, output_tps = 0, total_tps = 0, prefill_computed_tps = 0;
  double cached_fraction = -1;        // -1: server reported no cached_tokens
  double tokens_per_chunk = 0;
  double peak_output_tps = 0;         // most output tokens in any 1 s bin of the run clock
  double avg_concurrency = 0;         // Little's law: sum E2E / duration
  int64_t max_in_flight = 0;
  Dist ttft, tpot, itl, e2e, client_queue, output_speed;  // output_speed in tok/s
  double ttft_first_quarter_p50 = 0, ttft_last_quarter_p50 = 0;  // stationarity check inputs
  InflightTrend inflight;             // open loop only (offered rate finite); judged = false otherwise
  double input_token_error = 0;       // max |server prompt_tokens / intended - 1| (chat template incl.)
  std::map<std::string, int64_t> errors;  // error kind -> count
  std::vector<std::string> error_samples; // up to 5 full messages
};

RateMetrics compute_rate_metrics(const std::vector<RequestRecord>& records, double offered_rate,
                                 int64_t max_concurrency);

nlohmann::json dist_to_json(const Dist& d, double scale);
nlohmann::json rate_metrics_to_json(const RateMetrics& m, int gpus);

}  // namespace mxserve::bench
