// Knee search (see knee.h).
#include "bench/knee.h"

#include <cmath>
#include <cstdio>

namespace mxserve::bench {

Verdict judge(const RateMetrics& m, const KneeCriteria& c) {
  Verdict v;
  char buf[320];
  std::string why;
  v.ttft_ok = m.ttft.count > 0 && m.ttft.p95 <= c.slo_ttft_p95_s;
  if (!v.ttft_ok) {
    std::snprintf(buf, sizeof buf, "ttft_p95 %.3fs > %.3fs; ", m.ttft.p95, c.slo_ttft_p95_s);
    why += m.ttft.count > 0 ? buf : "no successful requests; ";
  }
  v.success_ok = m.success_rate >= c.min_success;
  if (!v.success_ok) {
    std::snprintf(buf, sizeof buf, "success %.2f%% < %.2f%%; ", m.success_rate * 100, c.min_success * 100);
    why += buf;
  }
  v.stationary_ok = m.ttft_last_quarter_p50 <= c.max_growth * m.ttft_first_quarter_p50;
  if (!v.stationary_ok) {
    std::snprintf(buf, sizeof buf, "queue growing: last-quarter TTFT p50 %.3fs > %.2fx first-quarter %.3fs; ",
                  m.ttft_last_quarter_p50, c.max_growth, m.ttft_first_quarter_p50);
    why += buf;
  }
  const InflightTrend& q = m.inflight;
  if (std::isfinite(m.offered_rate) && m.offered_rate > 0 && m.ttft.count > 0) {
    if (!q.judged) {
      v.stationary_ok = false;
      v.requests_to_judge = q.requests_to_judge;
      std::snprintf(buf, sizeof buf,
                    "too short to judge the queue: %lld arrival(s) after the %.1fs ramp (a request's E2E p50 once "
                    "the server is full); run >= %lld requests (--num-requests); ",
                    static_cast<long long>(q.window_requests), q.ramp_s, static_cast<long long>(q.requests_to_judge));
      why += buf;
    } else if (q.late_mean - q.early_mean > c.inflight_slack &&
               q.growth_per_s > c.max_inflight_growth * m.offered_rate) {
      v.stationary_ok = false;
      std::snprintf(buf, sizeof buf,
                    "queue growing: %.1f -> %.1f requests in flight over %.0fs after the ramp (+%.3f req/s > "
                    "%.0f%% of the offered %.3g req/s); ",
                    q.early_mean, q.late_mean, q.span_s, q.growth_per_s, c.max_inflight_growth * 100,
                    m.offered_rate);
      why += buf;
    }
  }
  v.pass = v.ttft_ok && v.success_ok && v.stationary_ok;
  v.reason = v.pass ? "ok" : why.substr(0, why.size() - 2);
  return v;
}

Result<KneeResult> find_knee(const KneeSearchConfig& config, const RateEval& eval) {
  if (config.grid.empty()) return invalid_argument("--find-knee needs a non-empty --sweep grid");
  for (size_t i = 1; i < config.grid.size(); ++i)
    if (!(config.grid[i] > config.grid[i - 1])) return invalid_argument("--sweep: the knee grid must be ascending");
  if (!(config.tolerance > 0)) return invalid_argument("--knee-tolerance must be > 0");
  KneeResult k;
  double lo = 0, hi = 0;
  for (double rate : config.grid) {
    MX_ASSIGN_OR_RETURN(Verdict v, eval(rate));
    k.trials.push_back({rate, v.pass, "grid", v.reason});
    if (!v.pass) {
      hi = rate;
      k.bracketed = true;
      break;
    }
    lo = rate;
    k.found = true;
  }
  if (!k.bracketed) {
    k.knee_rate = lo;
    k.note = "every grid rate passed: the knee is above the grid; extend --sweep";
    return k;
  }
  for (int i = 0; i < config.max_bisections && hi - lo > config.tolerance; ++i) {
    const double mid = 0.5 * (lo + hi);
    MX_ASSIGN_OR_RETURN(Verdict v, eval(mid));
    k.trials.push_back({mid, v.pass, "bisect", v.reason});
    if (v.pass) {
      lo = mid;
      k.found = true;
    } else {
      hi = mid;
    }
  }
  k.knee_rate = k.found ? lo : 0;
  k.first_fail = hi;
  if (!k.found) k.note = "no rate passed, down to " + std::to_string(hi) + " req/s";
  return k;
}

nlohmann::json knee_to_json(const KneeResult& k, const KneeCriteria& c) {
  nlohmann::json trials = nlohmann::json::array();
  for (const KneeTrial& t : k.trials)
    trials.push_back({{"rate", t.rate}, {"pass", t.pass}, {"phase", t.phase}, {"reason", t.reason}});
  return {{"found", k.found}, {"bracketed", k.bracketed}, {"knee_rate", k.knee_rate}, {"first_fail", k.first_fail},
          {"slo_ttft_p95_s", c.slo_ttft_p95_s}, {"min_success", c.min_success},
          {"max_ttft_growth", c.max_growth}, {"trials", trials}, {"note", k.note}};
}

}  // namespace mxserve::bench
