// `mxserve bench judge` (see rejudge.h).
#include "bench/rejudge.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

#include "bench/bench_config.h"
#include "bench/knee.h"
#include "bench/metrics.h"

namespace mxserve::bench {
namespace {

const char kUsage[] = R"(usage: mxserve bench judge FILE.json [--slo-ttft-p95 5s] [--min-success 0.99]
Judges every rate point of a finished `mxserve bench` run again from its per-request records (the run
must have used --save-requests), by the knee rule of docs/bench.md "The knee": TTFT p95, success, and a
stationary queue (TTFT and requests in flight after the ramp). Prints one row a point and the knee of the
points' rates in ascending order.

  --slo-ttft-p95 D   the TTFT p95 target (5s)
  --min-success F    the least share of requests that must succeed (0.99)
)";

Result<double> number_or_inf(const nlohmann::json& v, const std::string& what) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string() && v.get<std::string>() == "inf") return std::numeric_limits<double>::infinity();
  return invalid_argument(what + " is not a number");
}

}  // namespace

Result<std::vector<RequestRecord>> records_from_json(const nlohmann::json& requests) {
  if (!requests.is_array()) return invalid_argument("\"requests\" is not an array");
  std::vector<RequestRecord> out;
  for (size_t i = 0; i < requests.size(); ++i) {
    const nlohmann::json& j = requests[i];
    const std::string where = "requests[" + std::to_string(i) + "]";
    for (const char* f : {"scheduled_s", "sent_s", "ttft_s", "e2e_s", "end_s", "ok"})
      if (!j.contains(f)) return invalid_argument(where + ": no \"" + std::string(f) + "\"");
    RequestRecord r;
    try {
      r.index = j.value("index", static_cast<int64_t>(i));
      r.warmup = j.value("warmup", false);
      r.scheduled_s = j.at("scheduled_s").get<double>();
      r.sent_s = j.at("sent_s").get<double>();
      const double ttft = j.at("ttft_s").get<double>(), e2e = j.at("e2e_s").get<double>();
      if (r.sent_s >= 0 && ttft >= 0) r.first_token_s = r.sent_s + ttft;
      if (r.sent_s >= 0 && e2e >= 0) r.last_token_s = r.sent_s + e2e;
      r.end_s = j.at("end_s").get<double>();
      r.token_chunks = j.value("content_chunks", int64_t{0});
      r.output_tokens = j.value("output_tokens", int64_t{-1});
      r.prompt_tokens = j.value("prompt_tokens", int64_t{-1});
      r.intended_input = j.value("intended_input_tokens", int64_t{-1});
      r.cached_tokens = j.value("cached_tokens", int64_t{-1});
      r.http_status = j.value("http_status", 0);
      r.ok = j.at("ok").get<bool>();
      r.error = j.value("error", std::string());
    } catch (const nlohmann::json::exception& e) {
      return invalid_argument(where + ": " + e.what());
    }
    if (r.ok && (r.first_token_s < 0 || r.last_token_s < r.first_token_s))
      return invalid_argument(where + ": ok, but its ttft_s / e2e_s are missing or out of order");
    out.push_back(std::move(r));
  }
  return out;
}

int cmd_bench_judge(int argc, char** argv) {
  std::string file;
  KneeCriteria criteria;
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "mxserve bench judge: %s\n", why.c_str());
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--slo-ttft-p95" || a == "--min-success") {
      if (i + 1 >= argc) return fail(a + ": missing value");
      if (Status st = parse_knee_flag(a, argv[++i], &criteria); !st.is_ok()) return fail(st.message());
    } else if (a.rfind("--", 0) == 0 || !file.empty()) {
      return fail("unexpected argument " + a + " (see mxserve bench judge --help)");
    } else {
      file = a;
    }
  }
  if (file.empty()) return fail("no FILE.json (see mxserve bench judge --help)");
  std::ifstream in(file);
  if (!in) return fail(file + ": cannot be read");
  nlohmann::json run;
  try {
    in >> run;
  } catch (const nlohmann::json::exception& e) {
    return fail(file + ": not JSON: " + e.what());
  }
  if (!run.contains("points") || !run["points"].is_array() || run["points"].empty())
    return fail(file + ": no \"points\" (not an `mxserve bench --output-json` file?)");
  struct Row {
    double rate;
    Verdict verdict;
  };
  std::vector<Row> rows;
  std::string table =
      "| offered req/s | requests | TTFT p50 / p95 (s) | success | in flight after the ramp (early -> late) | "
      "verdict |\n|---|---|---|---|---|---|\n";
  for (size_t p = 0; p < run["points"].size(); ++p) {
    const nlohmann::json& point = run["points"][p];
    const std::string where = file + ": points[" + std::to_string(p) + "]";
    if (!point.contains("requests"))
      return fail(where + " has no per-request records: rerun the bench with --save-requests");
    Result<double> rate = number_or_inf(point.value("offered_rate", nlohmann::json()), where + ".offered_rate");
    if (!rate.is_ok()) return fail(rate.status().message());
    Result<std::vector<RequestRecord>> records = records_from_json(point["requests"]);
    if (!records.is_ok()) return fail(where + "." + records.status().message());
    const RateMetrics m = compute_rate_metrics(*records, *rate, point.value("max_concurrency", int64_t{0}));
    const Verdict v = judge(m, criteria);
    char trend[96] = "-";
    if (m.inflight.judged)
      std::snprintf(trend, sizeof trend, "%.1f -> %.1f over %.0f s", m.inflight.early_mean, m.inflight.late_mean,
                    m.inflight.span_s);
    char row[128];
    std::snprintf(row, sizeof row, "| %.3g | %lld | %.2f / %.2f | %.1f%% | %s | ", *rate, static_cast<long long>(m.sent),
                  m.ttft.p50, m.ttft.p95, 100 * m.success_rate, trend);
    table += row + (v.pass ? std::string("pass") : v.reason) + " |\n";
    rows.push_back({*rate, v});
  }
  std::fputs(table.c_str(), stdout);  // after every point parsed: a bad file prints only its error
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.rate < b.rate; });
  double knee = 0;
  for (const Row& r : rows) {
    if (!r.verdict.pass) break;
    knee = r.rate;
  }
  if (knee > 0)
    std::printf("\nknee (TTFT p95 <= %.3g s, success >= %.0f%%, stationary queue; rates ascending): %.3g req/s%s\n",
                criteria.slo_ttft_p95_s, 100 * criteria.min_success, knee,
                knee == rows.back().rate ? " (every point passed: the knee is at or above it)" : "");
  else
    std::printf("\nknee: below the lowest rate judged (%.3g req/s)\n", rows.front().rate);
  return 0;
}

}  // namespace mxserve::bench
