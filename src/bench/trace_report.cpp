// Agent trace metrics and their report (see trace_report.h).
#include "bench/trace_report.h"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace mxserve::bench {
namespace {

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

void row(std::ostream& os, const std::string& name, const std::string& value) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%-54s %s\n", name.c_str(), value.c_str());
  os << buf;
}

}  // namespace

TraceMetrics compute_trace_metrics(const std::vector<RequestRecord>& records,
                                   const std::vector<int64_t>& turns_per_instance) {
  TraceMetrics m;
  const size_t n = turns_per_instance.size();
  m.sessions_planned = static_cast<int64_t>(n);
  std::vector<int64_t> ok_turns(n, 0), sent_turns(n, 0);
  std::vector<bool> failed(n, false);
  std::vector<double> first_send(n, std::numeric_limits<double>::infinity()), last_end(n, 0);
  double t0 = std::numeric_limits<double>::infinity(), t1 = -std::numeric_limits<double>::infinity();
  int64_t cached_prompt = 0;
  struct Acc {
    std::vector<double> ttft;
    int64_t sent = 0, prompt = 0, cached = 0, cached_reports = 0;
  };
  std::vector<Acc> acc;
  for (const RequestRecord& r : records) {
    if (r.session < 0 || static_cast<size_t>(r.session) >= n || r.turn < 0) continue;
    const size_t s = static_cast<size_t>(r.session);
    if (acc.size() <= static_cast<size_t>(r.turn)) acc.resize(static_cast<size_t>(r.turn) + 1);
    Acc& a = acc[static_cast<size_t>(r.turn)];
    ++a.sent;
    ++sent_turns[s];
    if (r.sent_s >= 0) {
      t0 = std::min(t0, r.sent_s);
      first_send[s] = std::min(first_send[s], r.sent_s);
    }
    if (r.end_s >= 0) t1 = std::max(t1, r.end_s);
    if (!r.ok) {
      failed[s] = true;
      continue;
    }
    ++ok_turns[s];
    last_end[s] = std::max(last_end[s], r.end_s);
    const int64_t in = std::max<int64_t>(0, r.input_tokens_effective());
    const int64_t out = r.output_tokens_effective();
    m.prompt_tokens += in;
    m.output_tokens += out;
    a.ttft.push_back(r.ttft());
    a.prompt += in;
    if (r.cached_tokens >= 0) {
      m.cached_tokens += r.cached_tokens;
      cached_prompt += in;
      a.cached += r.cached_tokens;
      ++a.cached_reports;
    }
  }
  std::vector<double> durations;
  for (size_t s = 0; s < n; ++s) {
    if (sent_turns[s] == 0) continue;
    ++m.sessions_started;
    if (failed[s]) ++m.sessions_failed;
    else if (ok_turns[s] == turns_per_instance[s]) {
      ++m.sessions_completed;
      durations.push_back(last_end[s] - first_send[s]);
    } else {
      ++m.sessions_unfinished;
    }
  }
  m.session_duration = summarize(durations);
  if (t1 > t0) m.duration_s = t1 - t0;
  if (m.duration_s > 0) {
    m.jobs_per_hour = static_cast<double>(m.sessions_completed) * 3600.0 / m.duration_s;
    m.total_tps = static_cast<double>(m.prompt_tokens + m.output_tokens) / m.duration_s;
    m.prefill_computed_tps = static_cast<double>(m.prompt_tokens - m.cached_tokens) / m.duration_s;
    m.computed_tps = static_cast<double>(m.prompt_tokens - m.cached_tokens + m.output_tokens) / m.duration_s;
  }
  if (cached_prompt > 0) m.cached_fraction = static_cast<double>(m.cached_tokens) / static_cast<double>(cached_prompt);
  for (size_t d = 0; d < acc.size(); ++d) {
    DepthMetrics dm;
    dm.depth = static_cast<int>(d);
    dm.sent = acc[d].sent;
    dm.completed = static_cast<int64_t>(acc[d].ttft.size());
    dm.ttft = summarize(acc[d].ttft);
    if (dm.completed > 0) dm.mean_prompt_tokens = static_cast<double>(acc[d].prompt) / static_cast<double>(dm.completed);
    if (acc[d].cached_reports > 0)
      dm.mean_cached_tokens = static_cast<double>(acc[d].cached) / static_cast<double>(acc[d].cached_reports);
    m.depths.push_back(dm);
  }
  return m;
}

void print_trace_block(std::ostream& os, const TraceMetrics& m) {
  os << "============ Agent Trace Result ============\n";
  row(os, "Jobs (sessions) planned / started:", std::to_string(m.sessions_planned) + " / " + std::to_string(m.sessions_started));
  row(os, "Jobs completed / failed / unfinished:", std::to_string(m.sessions_completed) + " / " +
                                                      std::to_string(m.sessions_failed) + " / " +
                                                      std::to_string(m.sessions_unfinished));
  row(os, "Job success (completed / started):",
      m.sessions_started > 0 ? fmt("%.1f%%", 100.0 * static_cast<double>(m.sessions_completed) / static_cast<double>(m.sessions_started))
                             : std::string("n/a"));
  row(os, "Duration (s):", fmt("%.2f", m.duration_s));
  row(os, "Jobs per hour:", fmt("%.1f", m.jobs_per_hour));
  row(os, "Job duration P50 / P95 (s):", fmt("%.2f", m.session_duration.p50) + " / " + fmt("%.2f", m.session_duration.p95));
  row(os, "Total token throughput (prompt + output, tok/s):", fmt("%.1f", m.total_tps));
  row(os, "Computed token throughput (uncached + output, tok/s):", fmt("%.1f", m.computed_tps));
  row(os, "Computed prefill throughput (uncached prompt, tok/s):", fmt("%.1f", m.prefill_computed_tps));
  row(os, "Prompt / cached / output tokens:", std::to_string(m.prompt_tokens) + " / " + std::to_string(m.cached_tokens) +
                                                 " / " + std::to_string(m.output_tokens));
  row(os, "Cached prompt fraction:", m.cached_fraction < 0 ? std::string("n/a (server reports no cached_tokens)")
                                                           : fmt("%.1f%%", m.cached_fraction * 100));
  os << "\n| Turn | Requests ok / sent | TTFT p50 / p95 (s) | Prompt tokens (mean) | Cached tokens (mean) |\n"
        "|---|---|---|---|---|\n";
  for (const DepthMetrics& d : m.depths) {
    os << "| " << d.depth + 1 << " | " << d.completed << " / " << d.sent << " | "
       << (d.completed > 0 ? fmt("%.3f", d.ttft.p50) + " / " + fmt("%.3f", d.ttft.p95) : std::string("-")) << " | "
       << fmt("%.0f", d.mean_prompt_tokens) << " | "
       << (d.mean_cached_tokens < 0 ? std::string("n/a") : fmt("%.0f", d.mean_cached_tokens)) << " |\n";
  }
}

nlohmann::json trace_metrics_to_json(const TraceMetrics& m) {
  nlohmann::json depths = nlohmann::json::array();
  for (const DepthMetrics& d : m.depths) {
    depths.push_back({{"turn", d.depth + 1},
                      {"depth", d.depth},
                      {"sent", d.sent},
                      {"completed", d.completed},
                      {"ttft_ms", dist_to_json(d.ttft, 1000)},
                      {"mean_prompt_tokens", d.mean_prompt_tokens},
                      {"mean_cached_tokens", d.mean_cached_tokens < 0 ? nlohmann::json(nullptr) : nlohmann::json(d.mean_cached_tokens)}});
  }
  return {{"jobs_planned", m.sessions_planned},
          {"jobs_started", m.sessions_started},
          {"jobs_completed", m.sessions_completed},
          {"jobs_failed", m.sessions_failed},
          {"jobs_unfinished", m.sessions_unfinished},
          {"job_success_rate", m.sessions_started > 0 ? static_cast<double>(m.sessions_completed) / static_cast<double>(m.sessions_started) : 0.0},
          {"duration_s", m.duration_s},
          {"jobs_per_hour", m.jobs_per_hour},
          {"job_duration_s", dist_to_json(m.session_duration, 1)},
          {"prompt_tokens", m.prompt_tokens},
          {"cached_tokens", m.cached_tokens},
          {"output_tokens", m.output_tokens},
          {"total_token_throughput", m.total_tps},
          {"computed_token_throughput", m.computed_tps},
          {"computed_prefill_throughput", m.prefill_computed_tps},
          {"cached_fraction", m.cached_fraction < 0 ? nlohmann::json(nullptr) : nlohmann::json(m.cached_fraction)},
          {"by_turn", std::move(depths)}};
}

}  // namespace mxserve::bench
