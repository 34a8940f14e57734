// Plots of a sweep: <prefix>_throughput.svg (total and output tok/s vs rate) and <prefix>_ttft.svg
// (TTFT p50/p95 vs rate with the SLO line and the knee). Owns only the choice of series; the
// drawing is svg_plot.h. x is the offered rate; closed-loop points use the achieved rate.
#pragma once

#include <string>
#include <vector>

#include "bench/bench_config.h"
#include "bench/knee.h"
#include "bench/report.h"
#include "core/status.h"

namespace mxserve::bench {

Result<std::vector<std::string>> write_plots(const std::string& prefix, const std::vector<PointResult>& points,
                                             const BenchConfig& c, const KneeResult* knee);

}  // namespace mxserve::bench
