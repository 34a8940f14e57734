// Console table, metric blocks, cost and JSON (see report.h).
#include "bench/report.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>

namespace mxserve::bench {
namespace {

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}
std::string rate_str(double r) { return std::isinf(r) ? std::string("inf") : fmt("%.3g", r); }

void row(std::ostream& os, const std::string& name, const std::string& value) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%-44s %s\n", name.c_str(), value.c_str());
  os << buf;
}
void dist_rows(std::ostream& os, const char* title, const Dist& d, double scale, const char* unit) {
  os << "---" << title << "---\n";
  row(os, std::string("Mean ") + unit + ":", fmt("%.2f", d.mean * scale));
  row(os, std::string("P50 ") + unit + ":", fmt("%.2f", d.p50 * scale));
  row(os, std::string("P90 ") + unit + ":", fmt("%.2f", d.p90 * scale));
  row(os, std::string("P95 ") + unit + ":", fmt("%.2f", d.p95 * scale));
  row(os, std::string("P99 ") + unit + ":", fmt("%.2f", d.p99 * scale));
}

std::string iso_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace

nlohmann::json requests_to_json(const std::vector<RequestRecord>& records) {
  nlohmann::json arr = nlohmann::json::array();
  for (const RequestRecord& r : records) {
    arr.push_back({{"index", r.index},
                   {"warmup", r.warmup},
                   {"group", r.group},
                   {"scheduled_s", r.scheduled_s},
                   {"sent_s", r.sent_s},
                   {"ttft_s", r.first_token_s >= 0 ? r.ttft() : -1.0},
                   {"e2e_s", r.last_token_s >= 0 ? r.e2e() : -1.0},
                   {"end_s", r.end_s},
                   {"content_chunks", r.token_chunks},
                   {"output_tokens", r.output_tokens},
                   {"prompt_tokens", r.prompt_tokens},
                   {"intended_input_tokens", r.intended_input},
                   {"cached_tokens", r.cached_tokens},
                   {"http_status", r.http_status},
                   {"ok", r.ok},
                   {"error", r.error}});
  }
  return arr;
}

CostFigures compute_cost(const RateMetrics& m, int gpus, const CostConfig& c) {
  CostFigures f;
  if (c.gpu_hour_price <= 0 || gpus <= 0 || m.total_tps <= 0) return f;
  f.valid = true;
  const double usd_per_hour = c.gpu_hour_price * gpus;
  f.usd_per_mtok_total = usd_per_hour * 1e6 / (m.total_tps * 3600);
  f.usd_per_mtok_output = m.output_tps > 0 ? usd_per_hour * 1e6 / (m.output_tps * 3600) : 0;
  f.tokens_per_usd = m.total_tps * 3600 / usd_per_hour;
  if (c.compare_price > 0) {
    f.has_compare = true;
    const double cmp_per_hour = c.compare_price * (c.compare_gpus > 0 ? c.compare_gpus : gpus);
    f.breakeven_tps = m.total_tps * cmp_per_hour / usd_per_hour;
    if (c.compare_throughput > 0) {
      f.compare_usd_per_mtok_total = cmp_per_hour * 1e6 / (c.compare_throughput * 3600);
      f.perf_per_dollar_ratio = f.tokens_per_usd / (c.compare_throughput * 3600 / cmp_per_hour);
    }
  }
  return f;
}

void print_metrics_block(std::ostream& os, const RateMetrics& m, int gpus, const SpecDecodeFigures* server) {
  os << "============ Serving Benchmark Result (rate " << rate_str(m.offered_rate) << " req/s"
     << (m.max_concurrency > 0 ? ", max concurrency " + std::to_string(m.max_concurrency) : std::string()) << ") ============\n";
  row(os, "Requests sent / completed / failed:", std::to_string(m.sent) + " / " + std::to_string(m.completed) + " / " + std::to_string(m.failed));
  row(os, "Warm-up requests (excluded):", std::to_string(m.warmup));
  row(os, "Success rate (%):", fmt("%.2f", m.success_rate * 100));
  row(os, "Benchmark duration (s):", fmt("%.2f", m.duration_s));
  row(os, "Total input tokens:", std::to_string(m.input_tokens));
  row(os, "Total generated tokens:", std::to_string(m.output_tokens));
  row(os, "Request throughput (req/s):", fmt("%.3f", m.request_throughput));
  if (std::isfinite(m.offered_rate))
    row(os, "Realized arrival rate (req/s):", fmt("%.3f", m.realized_arrival_rate));
  row(os, "Input token throughput (tok/s):", fmt("%.2f", m.input_tps));
  row(os, "Output token throughput (tok/s):", fmt("%.2f", m.output_tps));
  row(os, "Peak output token throughput (tok/s):", fmt("%.2f", m.peak_output_tps));
  row(os, "Total token throughput (tok/s):", fmt("%.2f", m.total_tps));
  row(os, "Prefill-computed throughput (tok/s):", fmt("%.2f", m.prefill_computed_tps));
  if (gpus > 0) {
    row(os, "Total token throughput per GPU (tok/s):", fmt("%.2f", m.total_tps / gpus));
    row(os, "Output token throughput per GPU (tok/s):", fmt("%.2f", m.output_tps / gpus));
  }
  row(os, "Cached prompt fraction (server-reported):",
      m.cached_fraction < 0 ? std::string("n/a (no usage.prompt_tokens_details.cached_tokens)") : fmt("%.4f", m.cached_fraction));
  row(os, "Output tokens per content chunk:", fmt("%.3f", m.tokens_per_chunk));
  row(os, "Average concurrency (Little):", fmt("%.2f", m.avg_concurrency));
  dist_rows(os, "Time to First Token", m.ttft, 1e3, "TTFT (ms)");
  dist_rows(os, "Time per Output Token (excl. 1st token)", m.tpot, 1e3, "TPOT (ms)");
  dist_rows(os, "Inter-token Latency (chunk gaps)", m.itl, 1e3, "ITL (ms)");
  dist_rows(os, "End-to-end Latency", m.e2e, 1e3, "E2EL (ms)");
  if (m.max_concurrency > 0) row(os, "Client queue time P95 (ms):", fmt("%.2f", m.client_queue.p95 * 1e3));
  if (m.output_speed.count > 0)
    row(os, "Output speed after first token P50 (tok/s):", fmt("%.2f", m.output_speed.p50));
  if (server && server->acceptance_rate) row(os, "Spec decode acceptance rate (server):", fmt("%.4f", *server->acceptance_rate));
  if (server && server->acceptance_length) row(os, "Spec decode acceptance length (server):", fmt("%.3f", *server->acceptance_length));
  if (server && server->prefix_cache_hit_rate)
    row(os, "Prefix cache hit rate (server /metrics):", fmt("%.4f", *server->prefix_cache_hit_rate));
  for (const auto& [kind, n] : m.errors) row(os, "Errors '" + kind + "':", std::to_string(n));
  for (const std::string& e : m.error_samples) os << "  e.g. " << e << "\n";
  os << "==================================================\n";
}

void print_summary_table(std::ostream& os, const std::vector<PointResult>& points, const BenchConfig& c,
                         const KneeResult* knee) {
  const bool cost = c.cost.gpu_hour_price > 0;
  const bool judged = c.find_knee;
  os << "\n| Offered RPS | Sustained RPS | Total tok/s/node | TTFT p50 / p95 | Success | Cached |";
  if (cost) os << " $/Mtok total | $/Mtok output |";
  if (judged) os << " SLO |";
  os << "\n|---|---|---|---|---|---|";
  if (cost) os << "---|---|";
  if (judged) os << "---|";
  os << "\n";
  for (const PointResult& p : points) {
    const RateMetrics& m = p.metrics;
    os << "| " << rate_str(m.offered_rate) << (m.max_concurrency > 0 && std::isinf(m.offered_rate) ? " (C=" + std::to_string(m.max_concurrency) + ")" : "")
       << " | " << fmt("%.3f", m.request_throughput) << " | " << fmt("%.0f", m.total_tps) << " | "
       << fmt("%.2f", m.ttft.p50) << " / " << fmt("%.2f", m.ttft.p95) << " s | " << fmt("%.1f", m.success_rate * 100)
       << "% | " << (m.cached_fraction < 0 ? std::string("n/a") : fmt("%.1f%%", m.cached_fraction * 100)) << " |";
    if (cost) {
      const CostFigures f = compute_cost(m, c.gpus, c.cost);
      os << " " << fmt("%.3f", f.usd_per_mtok_total) << " | " << fmt("%.3f", f.usd_per_mtok_output) << " |";
    }
    if (judged) os << " " << (p.verdict.pass ? "pass" : "FAIL: " + p.verdict.reason) << " |";
    os << "\n";
  }
  if (c.workload.kind == WorkloadKind::kSingleStream && !points.empty()) {
    const RateMetrics& m = points.back().metrics;
    os << "Single stream (Artificial Analysis method, " << m.completed << " runs, " << c.workload.input_len << " in / "
       << c.workload.output_len << " out): output speed P50 " << fmt("%.1f", m.output_speed.p50)
       << " tok/s (first to last token), TTFT P50 " << fmt("%.3f", m.ttft.p50) << " s\n";
  }
  if (cost) {
    os << "Cost: " << fmt("%.2f", c.cost.gpu_hour_price) << " USD/GPU-hour x " << c.gpus
       << " GPUs; $/Mtok total counts input (cached included) + output tokens, output counts generated tokens only.\n";
    if (c.cost.compare_price > 0 && !points.empty()) {
      const PointResult* best = &points[0];
      for (const PointResult& p : points)
        if ((!judged || p.verdict.pass) && p.metrics.total_tps > best->metrics.total_tps) best = &p;
      const CostFigures f = compute_cost(best->metrics, c.gpus, c.cost);
      os << "Compared with " << fmt("%.2f", c.cost.compare_price) << " USD/GPU-hour x " << c.cost.compare_gpus
         << " GPUs: it must sustain " << fmt("%.0f", f.breakeven_tps) << " total tok/s/node to match "
         << fmt("%.3f", f.usd_per_mtok_total) << " $/Mtok (at " << rate_str(best->metrics.offered_rate) << " req/s)";
      if (f.perf_per_dollar_ratio > 0)
        os << "; at its " << fmt("%.0f", c.cost.compare_throughput) << " tok/s it costs " << fmt("%.3f", f.compare_usd_per_mtok_total)
           << " $/Mtok: perf per dollar ratio " << fmt("%.2fx", f.perf_per_dollar_ratio);
      os << ".\n";
    }
  }
  if (knee) {
    if (knee->found)
      os << "Knee (TTFT p95 <= " << fmt("%.2f", c.knee.slo_ttft_p95_s) << " s, success >= "
         << fmt("%.0f", c.knee.min_success * 100) << "%, stationary): " << fmt("%.3f", knee->knee_rate) << " req/s"
         << (knee->bracketed ? " (first failing rate " + fmt("%.3f", knee->first_fail) + ")" : "") << "\n";
    else
      os << "Knee: none found\n";
    if (!knee->note.empty()) os << "Note: " << knee->note << "\n";
  }
}

nlohmann::json result_json(const BenchConfig& c, const std::string& model, const nlohmann::json& workload,
                           const std::string& codec, const std::vector<PointResult>& points, const KneeResult* knee) {
  nlohmann::json j;
  j["tool"] = "mxserve bench";
  j["date"] = iso_now();
  j["base_url"] = c.base_url;
  j["model"] = model;
  j["endpoint"] = c.endpoint == Endpoint::kChat ? "chat" : "completions";
  j["tokenizer"] = codec;
  j["workload"] = workload;
  j["arrival"] = {{"process", arrival_kind_name(c.arrival.kind)}, {"burstiness", c.arrival.burstiness},
                  {"closed_loop", c.closed_loop()}, {"max_concurrency", c.max_concurrency},
                  {"num_requests", c.num_requests}, {"duration_s", c.duration_s}, {"seed", c.arrival.seed}};
  j["ignore_eos"] = c.ignore_eos;
  j["http_client"] = c.http_client == HttpClientKind::kCurl     ? "curl"
                     : c.http_client == HttpClientKind::kNative ? "native"
                                                                : "auto";
  j["gpus"] = c.gpus;
  nlohmann::json arr = nlohmann::json::array();
  for (const PointResult& p : points) {
    nlohmann::json pj = rate_metrics_to_json(p.metrics, c.gpus);
    pj["phase"] = p.phase;
    pj["server_metrics"] = spec_figures_to_json(p.server);
    if (!p.requests.is_null()) pj["requests"] = p.requests;
    if (c.find_knee) pj["slo"] = {{"pass", p.verdict.pass}, {"reason", p.verdict.reason}};
    const CostFigures f = compute_cost(p.metrics, c.gpus, c.cost);
    if (f.valid) {
      pj["cost"] = {{"gpu_hour_price_usd", c.cost.gpu_hour_price}, {"usd_per_mtok_total", f.usd_per_mtok_total},
                    {"usd_per_mtok_output", f.usd_per_mtok_output}, {"total_tokens_per_usd", f.tokens_per_usd}};
      if (f.has_compare) {
        pj["cost"]["compare"] = {{"gpu_hour_price_usd", c.cost.compare_price}, {"gpus", c.cost.compare_gpus},
                                 {"breakeven_total_tok_s", f.breakeven_tps}};
        if (f.perf_per_dollar_ratio > 0) {
          pj["cost"]["compare"]["total_tok_s"] = c.cost.compare_throughput;
          pj["cost"]["compare"]["usd_per_mtok_total"] = f.compare_usd_per_mtok_total;
          pj["cost"]["compare"]["perf_per_dollar_ratio"] = f.perf_per_dollar_ratio;
        }
      }
    }
    arr.push_back(std::move(pj));
  }
  j["points"] = std::move(arr);
  if (knee) j["knee"] = knee_to_json(*knee, c.knee);
  return j;
}

}  // namespace mxserve::bench
