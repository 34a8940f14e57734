// Knee search: the highest sustainable request rate under a TTFT SLO.
// Owns: the pass rule and the search (coarse grid ascending until the first failure, then bisection
// between the last passing and first failing rate down to a tolerance). Pure: the rate point is
// evaluated through a callback, so the search is tested without a server.
// Pass(rate) <=> TTFT p95 <= SLO  and  success >= min_success (99%)  and the queue is stationary:
//   median TTFT of the last quarter of requests <= max_growth (1.5) x that of the first quarter, and
//   (open loop) the requests in flight stop growing once the server is full (metrics.h InflightTrend):
//   after the ramp, the later half of arrivals sees at most inflight_slack more requests in flight than
//   the earlier half, or they grow by at most max_inflight_growth x the offered rate. A run whose arrivals
//   end before the ramp does cannot show that, and fails naming the --num-requests it needs.
// Invariant: knee_rate is a rate that was evaluated and passed (or 0 with found = false).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/metrics.h"
#include "core/status.h"

namespace mxserve::bench {

struct KneeCriteria {
  double slo_ttft_p95_s = 5.0;
  double min_success = 0.99;
  double max_growth = 1.5;
  double max_inflight_growth = 0.1;  // of the offered rate (req/s): the part of it a growing queue may leave unserved
  double inflight_slack = 1.0;       // requests: growth tolerated whatever the rate (counts are small at low rates)
};

struct Verdict {
  bool pass = false;
  bool ttft_ok = false, success_ok = false, stationary_ok = false;
  std::string reason;  // "ok" or the failed conditions, e.g. "ttft_p95 6.1s > 5s"
  int64_t requests_to_judge = 0;  // > 0: the run ended before its queue could be judged; a rerun needs this many
};

Verdict judge(const RateMetrics& m, const KneeCriteria& c);

struct KneeSearchConfig {
  std::vector<double> grid;       // ascending coarse grid
  double tolerance = 0.05;        // stop bisecting when (first fail - last pass) <= tolerance
  int max_bisections = 8;
};

struct KneeTrial {
  double rate = 0;
  bool pass = false;
  std::string phase;  // "grid" or "bisect"
  std::string reason;
};

struct KneeResult {
  bool found = false;         // some rate passed
  bool bracketed = false;     // a failing rate was seen above the knee
  double knee_rate = 0;       // highest passing rate
  double first_fail = 0;      // lowest failing rate (when bracketed)
  std::vector<KneeTrial> trials;
  std::string note;
};

// eval(rate) runs (or simulates) one rate point and returns its verdict.
using RateEval = std::function<Result<Verdict>(double rate)>;

Result<KneeResult> find_knee(const KneeSearchConfig& config, const RateEval& eval);

nlohmann::json knee_to_json(const KneeResult& k, const KneeCriteria& c);

}  // namespace mxserve::bench
