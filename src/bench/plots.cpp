// Sweep plots (see plots.h).
#include "bench/plots.h"

#include <cmath>
#include <cstdio>

#include "bench/svg_plot.h"

namespace mxserve::bench {

Result<std::vector<std::string>> write_plots(const std::string& prefix, const std::vector<PointResult>& points,
                                             const BenchConfig& c, const KneeResult* knee) {
  auto x_of = [](const RateMetrics& m) { return std::isinf(m.offered_rate) ? m.request_throughput : m.offered_rate; };
  SvgChart tput;
  tput.title = "Throughput vs request rate";
  tput.x_label = "offered request rate (req/s)";
  tput.y_label = "tokens/s per node";
  SvgSeries total{"total tok/s", "#1f77b4", {}, false}, output{"output tok/s", "#ff7f0e", {}, false},
      sustained{"sustained RPS x1000", "#2ca02c", {}, true};
  SvgChart ttft;
  ttft.title = "TTFT vs request rate";
  ttft.x_label = "offered request rate (req/s)";
  ttft.y_label = "TTFT (s)";
  SvgSeries p50{"TTFT p50", "#1f77b4", {}, false}, p95{"TTFT p95", "#d62728", {}, false};
  for (const PointResult& p : points) {
    const double x = x_of(p.metrics);
    total.xy.push_back({x, p.metrics.total_tps});
    output.xy.push_back({x, p.metrics.output_tps});
    if (p.metrics.ttft.count > 0) {
      p50.xy.push_back({x, p.metrics.ttft.p50});
      p95.xy.push_back({x, p.metrics.ttft.p95});
    }
  }
  tput.series = {total, output};
  ttft.series = {p50, p95};
  if (c.find_knee) {
    char label[64];
    std::snprintf(label, sizeof label, "SLO p95 %.2f s", c.knee.slo_ttft_p95_s);
    ttft.hlines.push_back({label, "#d62728", c.knee.slo_ttft_p95_s});
  }
  if (knee && knee->found) {
    char label[64];
    std::snprintf(label, sizeof label, "knee %.3f req/s", knee->knee_rate);
    ttft.vlines.push_back({label, "#2ca02c", knee->knee_rate});
    tput.vlines.push_back({label, "#2ca02c", knee->knee_rate});
  }
  const std::string f1 = prefix + "_throughput.svg", f2 = prefix + "_ttft.svg";
  MX_RETURN_IF_ERROR(write_text_file(f1, tput.render()));
  MX_RETURN_IF_ERROR(write_text_file(f2, ttft.render()));
  return std::vector<std::string>{f1, f2};
}

}  // namespace mxserve::bench
