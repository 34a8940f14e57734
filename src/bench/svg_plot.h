// SvgChart: a dependency-free line chart written as SVG text (opens in any browser).
// Owns: axes with "nice" ticks, polyline series with point markers and a legend, horizontal
// reference lines (an SLO) and vertical markers (the knee). Does not own which data is plotted
// (plots.cpp). Invariant: output is a complete, standalone SVG 1.1 document.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace mxserve::bench {

struct SvgSeries {
  std::string name;
  std::string color;                           // CSS color
  std::vector<std::pair<double, double>> xy;   // plotted sorted by x
  bool dashed = false;
};

struct SvgLine {
  std::string label;
  std::string color;
  double value = 0;                            // y for horizontal lines, x for vertical markers
};

struct SvgChart {
  std::string title, x_label, y_label;
  std::vector<SvgSeries> series;
  std::vector<SvgLine> hlines;
  std::vector<SvgLine> vlines;
  std::string render() const;
};

Status write_text_file(const std::string& path, const std::string& text);

}  // namespace mxserve::bench
