// Metric computation (definitions in metrics.h).
#include "bench/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mxserve::bench {

double percentile_sorted(const std::vector<double>& s, double q) {
  if (s.empty()) return 0;
  const double pos = q / 100.0 * static_cast<double>(s.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, s.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return s[lo] + (s[hi] - s[lo]) * frac;
}

Dist summarize(std::vector<double> v) {
  Dist d;
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  d.count = static_cast<int64_t>(v.size());
  double sum = 0;
  for (double x : v) sum += x;
  d.mean = sum / static_cast<double>(v.size());
  d.p50 = percentile_sorted(v, 50);
  d.p90 = percentile_sorted(v, 90);
  d.p95 = percentile_sorted(v, 95);
  d.p99 = percentile_sorted(v, 99);
  d.max = v.back();
  return d;
}

namespace {
std::string error_kind(const std::string& e) {
  if (e.rfind("timeout", 0) == 0) return "timeout";
  if (e.rfind("http ", 0) == 0) return e.substr(0, std::min<size_t>(e.size(), 8));  // "http 503"
  const size_t colon = e.find(':');
  return colon == std::string::npos ? e : e.substr(0, colon);
}
}  // namespace

InflightTrend inflight_trend(const std::vector<RequestRecord>& records, double rate) {
  InflightTrend t;
  std::vector<const RequestRecord*> measured;
  for (const RequestRecord& r : records)
    if (!r.warmup) measured.push_back(&r);
  std::stable_sort(measured.begin(), measured.end(),
                   [](const RequestRecord* a, const RequestRecord* b) { return a->scheduled_s < b->scheduled_s; });
  std::vector<double> first_e2e;
  for (size_t i = 0; i < measured.size() && first_e2e.size() < std::max<size_t>(1, measured.size() / 4); ++i)
    if (measured[i]->ok) first_e2e.push_back(measured[i]->e2e());
  if (measured.empty() || first_e2e.empty() || !(rate > 0) || !std::isfinite(rate)) return t;
  t.ramp_s = summarize(first_e2e).p50;
  t.requests_to_judge = static_cast<int64_t>(
      std::ceil(std::max(2 * rate * t.ramp_s, rate * t.ramp_s + 4)));
  const double window_start = measured.front()->scheduled_s + t.ramp_s;
  std::vector<std::pair<double, int64_t>> window;  // (arrival, requests in flight then)
  for (const RequestRecord* a : measured) {
    if (a->scheduled_s < window_start) continue;
    int64_t in_flight = 0;
    for (const RequestRecord& r : records) {
      const double end = r.end_s >= 0 ? r.end_s : r.sent_s;  // a request that never finished: not in flight
      if (r.sent_s >= 0 && r.sent_s <= a->scheduled_s && a->scheduled_s < end) ++in_flight;
    }
    window.emplace_back(a->scheduled_s, in_flight);
  }
  t.window_requests = static_cast<int64_t>(window.size());
  t.judged = window.size() >= std::max<size_t>(4, measured.size() / 4);
  if (!t.judged) return t;
  const size_t half = window.size() / 2;
  double early_t = 0, late_t = 0;
  for (size_t i = 0; i < window.size(); ++i) {
    (i < half ? t.early_mean : t.late_mean) += static_cast<double>(window[i].second);
    (i < half ? early_t : late_t) += window[i].first;
  }
  t.early_mean /= static_cast<double>(half), early_t /= static_cast<double>(half);
  t.late_mean /= static_cast<double>(window.size() - half), late_t /= static_cast<double>(window.size() - half);
  t.span_s = late_t - early_t;
  if (t.span_s > 0) t.growth_per_s = (t.late_mean - t.early_mean) / t.span_s;
  return t;
}

RateMetrics compute_rate_metrics(const std::vector<RequestRecord>& records, double offered_rate,
                                 int64_t max_concurrency) {
  RateMetrics m;
  m.offered_rate = offered_rate;
  m.max_concurrency = max_concurrency;
  double first_sched = std::numeric_limits<double>::infinity(), last_sched = -first_sched;
  double first_send = std::numeric_limits<double>::infinity();
  double last_end = -std::numeric_limits<double>::infinity();
  std::vector<double> ttft, tpot, itl, e2e, queue, speed;
  std::vector<const RequestRecord*> ok_in_order;
  int64_t chunks = 0;
  double e2e_sum = 0;
  int64_t cached_prompt_tokens = 0;
  std::map<int64_t, double> bins;  // output tokens per 1 s bin
  for (const RequestRecord& r : records) {
    if (r.warmup) {
      ++m.warmup;
      continue;
    }
    ++m.sent;
    first_sched = std::min(first_sched, r.scheduled_s);
    last_sched = std::max(last_sched, r.scheduled_s);
    if (r.sent_s >= 0) first_send = std::min(first_send, r.sent_s);
    if (r.end_s >= 0) last_end = std::max(last_end, r.end_s);
    if (r.sent_s >= 0) queue.push_back(r.sent_s - r.scheduled_s);
    if (!r.ok) {
      ++m.failed;
      ++m.errors[error_kind(r.error)];
      if (m.error_samples.size() < 5) m.error_samples.push_back(r.error);
      continue;
    }
    ++m.completed;
    ok_in_order.push_back(&r);
    const int64_t out = r.output_tokens_effective();
    const int64_t in = r.input_tokens_effective();
    m.output_tokens += out;
    if (in > 0) m.input_tokens += in;
    if (r.output_tokens >= 0 || r.prompt_tokens >= 0) ++m.usage_reports;
    if (r.cached_tokens >= 0) {
      ++m.cached_reports;
      m.cached_tokens += r.cached_tokens;
      cached_prompt_tokens += std::max<int64_t>(in, 0);
    }
    if (r.prompt_tokens > 0 && r.intended_input > 0)
      m.input_token_error = std::max(m.input_token_error,
                                     std::fabs(static_cast<double>(r.prompt_tokens) / static_cast<double>(r.intended_input) - 1));
    chunks += r.token_chunks;
    ttft.push_back(r.ttft());
    e2e.push_back(r.e2e());
    e2e_sum += r.e2e();
    if (out > 1) {
      tpot.push_back((r.e2e() - r.ttft()) / static_cast<double>(out - 1));
      if (r.last_token_s > r.first_token_s)
        speed.push_back(static_cast<double>(out - 1) / (r.last_token_s - r.first_token_s));
    }
    for (float g : r.itl_s) itl.push_back(g);
    if (r.token_chunks > 0) {
      const double per_chunk = static_cast<double>(out) / static_cast<double>(r.token_chunks);
      double t = r.first_token_s;
      bins[static_cast<int64_t>(std::floor(t))] += per_chunk;
      for (float g : r.itl_s) {
        t += g;
        bins[static_cast<int64_t>(std::floor(t))] += per_chunk;
      }
    }
  }
  for (const auto& [second, tokens] : bins) m.peak_output_tps = std::max(m.peak_output_tps, tokens);
  if (m.sent > 1 && last_sched > first_sched)
    m.realized_arrival_rate = static_cast<double>(m.sent - 1) / (last_sched - first_sched);
  if (m.sent > 0) m.success_rate = static_cast<double>(m.completed) / static_cast<double>(m.sent);
  if (last_end > first_send) m.duration_s = last_end - first_send;
  if (m.duration_s > 0) {
    m.request_throughput = static_cast<double>(m.completed) / m.duration_s;
    m.input_tps = static_cast<double>(m.input_tokens) / m.duration_s;
    m.output_tps = static_cast<double>(m.output_tokens) / m.duration_s;
    m.total_tps = m.input_tps + m.output_tps;
    m.prefill_computed_tps = static_cast<double>(m.input_tokens - m.cached_tokens) / m.duration_s;
    m.avg_concurrency = e2e_sum / m.duration_s;
  }
  if (m.cached_reports > 0 && cached_prompt_tokens > 0)
    m.cached_fraction = static_cast<double>(m.cached_tokens) / static_cast<double>(cached_prompt_tokens);
  if (chunks > 0) m.tokens_per_chunk = static_cast<double>(m.output_tokens) / static_cast<double>(chunks);
  m.ttft = summarize(ttft);
  m.tpot = summarize(tpot);
  m.itl = summarize(itl);
  m.e2e = summarize(e2e);
  m.client_queue = summarize(queue);
  m.output_speed = summarize(speed);
  // Stationarity: median TTFT of the first vs the last quarter of successful requests, in send order.
  const size_t n = ok_in_order.size();
  if (n >= 4) {
    const size_t q = n / 4;
    std::vector<double> first, last;
    for (size_t i = 0; i < q; ++i) first.push_back(ok_in_order[i]->ttft());
    for (size_t i = n - q; i < n; ++i) last.push_back(ok_in_order[i]->ttft());
    m.ttft_first_quarter_p50 = summarize(first).p50;
    m.ttft_last_quarter_p50 = summarize(last).p50;
  }
  m.inflight = inflight_trend(records, offered_rate);
  return m;
}

nlohmann::json dist_to_json(const Dist& d, double scale) {
  return {{"count", d.count}, {"mean", d.mean * scale}, {"p50", d.p50 * scale}, {"p90", d.p90 * scale},
          {"p95", d.p95 * scale}, {"p99", d.p99 * scale}, {"max", d.max * scale}};
}

nlohmann::json rate_metrics_to_json(const RateMetrics& m, int gpus) {
  nlohmann::json j;
  j["offered_rate"] = std::isinf(m.offered_rate) ? nlohmann::json("inf") : nlohmann::json(m.offered_rate);
  j["max_concurrency"] = m.max_concurrency;
  j["warmup_requests"] = m.warmup;
  j["sent"] = m.sent;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["success_rate"] = m.success_rate;
  j["duration_s"] = m.duration_s;
  j["request_throughput"] = m.request_throughput;
  j["realized_arrival_rate"] = m.realized_arrival_rate;
  j["total_input_tokens"] = m.input_tokens;
  j["total_output_tokens"] = m.output_tokens;
  j["total_cached_tokens"] = m.cached_tokens;
  j["input_throughput"] = m.input_tps;
  j["output_throughput"] = m.output_tps;
  j["total_token_throughput"] = m.total_tps;
  j["prefill_computed_throughput"] = m.prefill_computed_tps;
  j["gpus"] = gpus;
  if (gpus > 0) {
    j["total_token_throughput_per_gpu"] = m.total_tps / gpus;
    j["output_throughput_per_gpu"] = m.output_tps / gpus;
  }
  j["cached_fraction"] = m.cached_fraction < 0 ? nlohmann::json(nullptr) : nlohmann::json(m.cached_fraction);
  j["requests_reporting_cached_tokens"] = m.cached_reports;
  j["requests_reporting_usage"] = m.usage_reports;
  j["tokens_per_chunk"] = m.tokens_per_chunk;
  j["peak_output_throughput"] = m.peak_output_tps;
  j["avg_concurrency"] = m.avg_concurrency;
  j["max_in_flight"] = m.max_in_flight;
  j["ttft_ms"] = dist_to_json(m.ttft, 1e3);
  j["tpot_ms"] = dist_to_json(m.tpot, 1e3);
  j["itl_ms"] = dist_to_json(m.itl, 1e3);
  j["e2el_ms"] = dist_to_json(m.e2e, 1e3);
  j["client_queue_ms"] = dist_to_json(m.client_queue, 1e3);
  j["output_speed_tok_s"] = dist_to_json(m.output_speed, 1.0);
  j["ttft_first_quarter_p50_ms"] = m.ttft_first_quarter_p50 * 1e3;
  j["ttft_last_quarter_p50_ms"] = m.ttft_last_quarter_p50 * 1e3;
  if (m.inflight.ramp_s > 0)
    j["inflight_trend"] = {{"judged", m.inflight.judged},
                           {"ramp_s", m.inflight.ramp_s},
                           {"window_requests", m.inflight.window_requests},
                           {"early_mean", m.inflight.early_mean},
                           {"late_mean", m.inflight.late_mean},
                           {"span_s", m.inflight.span_s},
                           {"growth_per_s", m.inflight.growth_per_s},
                           {"requests_to_judge", m.inflight.requests_to_judge}};
  j["max_input_token_deviation"] = m.input_token_error;
  j["errors"] = m.errors;
  j["error_samples"] = m.error_samples;
  return j;
}

}  // namespace mxserve::bench
