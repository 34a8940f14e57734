// SVG line chart rendering (see svg_plot.h).
#include "bench/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

namespace mxserve::bench {
namespace {

constexpr double kW = 760, kH = 460, kLeft = 80, kRight = 180, kTop = 50, kBottom = 60;

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

double nice_step(double span, int target_ticks) {
  if (!(span > 0)) return 1;
  const double raw = span / target_ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

std::string num(double v) {
  char b[32];
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) std::snprintf(b, sizeof b, "%.2g", v);
  else std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

}  // namespace

std::string SvgChart::render() const {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y1 = 0;
  for (const SvgSeries& s : series)
    for (auto [x, y] : s.xy) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y1 = std::max(y1, y);
    }
  for (const SvgLine& l : hlines) y1 = std::max(y1, l.value);
  for (const SvgLine& l : vlines) { x0 = std::min(x0, l.value); x1 = std::max(x1, l.value); }
  if (!std::isfinite(x0)) { x0 = 0; x1 = 1; }
  x0 = std::min(x0, 0.0);
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= 0) y1 = 1;
  const double xs = nice_step(x1 - x0, 8), ys = nice_step(y1, 6);
  x1 = std::ceil(x1 / xs) * xs;
  y1 = std::ceil(y1 * 1.05 / ys) * ys;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return kTop + ph - y / y1 * ph; };
  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << kH << "\" viewBox=\"0 0 " << kW
    << " " << kH << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << kW / 2 - kRight / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" << esc(title) << "</text>\n";
  for (double t = x0; t <= x1 + xs * 1e-6; t += xs) {
    o << "<line x1=\"" << px(t) << "\" y1=\"" << kTop << "\" x2=\"" << px(t) << "\" y2=\"" << kTop + ph
      << "\" stroke=\"#eee\"/><text x=\"" << px(t) << "\" y=\"" << kTop + ph + 16 << "\" text-anchor=\"middle\">" << num(t) << "</text>\n";
  }
  for (double t = 0; t <= y1 + ys * 1e-6; t += ys) {
    o << "<line x1=\"" << kLeft << "\" y1=\"" << py(t) << "\" x2=\"" << kLeft + pw << "\" y2=\"" << py(t)
      << "\" stroke=\"#eee\"/><text x=\"" << kLeft - 6 << "\" y=\"" << py(t) + 4 << "\" text-anchor=\"end\">" << num(t) << "</text>\n";
  }
  o << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << pw << "\" height=\"" << ph << "\" fill=\"none\" stroke=\"#333\"/>\n"
    << "<text x=\"" << kLeft + pw / 2 << "\" y=\"" << kH - 18 << "\" text-anchor=\"middle\">" << esc(x_label) << "</text>\n"
    << "<text transform=\"translate(18," << kTop + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">" << esc(y_label) << "</text>\n";
  for (const SvgLine& l : hlines)
    o << "<line x1=\"" << kLeft << "\" y1=\"" << py(l.value) << "\" x2=\"" << kLeft + pw << "\" y2=\"" << py(l.value)
      << "\" stroke=\"" << l.color << "\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/><text x=\"" << kLeft + pw - 4
      << "\" y=\"" << py(l.value) - 5 << "\" text-anchor=\"end\" fill=\"" << l.color << "\">" << esc(l.label) << "</text>\n";
  for (const SvgLine& l : vlines)
    o << "<line x1=\"" << px(l.value) << "\" y1=\"" << kTop << "\" x2=\"" << px(l.value) << "\" y2=\"" << kTop + ph
      << "\" stroke=\"" << l.color << "\" stroke-width=\"1.5\" stroke-dasharray=\"2,3\"/><text x=\"" << px(l.value) + 4
      << "\" y=\"" << kTop + 14 << "\" fill=\"" << l.color << "\">" << esc(l.label) << "</text>\n";
  double ly = kTop + 10;
  for (const SvgSeries& s : series) {
    std::vector<std::pair<double, double>> pts;
    for (auto p : s.xy)
      if (std::isfinite(p.first) && std::isfinite(p.second)) pts.push_back(p);
    std::sort(pts.begin(), pts.end());
    o << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2\""
      << (s.dashed ? " stroke-dasharray=\"5,3\"" : "") << " points=\"";
    for (auto [x, y] : pts) o << px(x) << "," << py(y) << " ";
    o << "\"/>\n";
    for (auto [x, y] : pts)
      o << "<circle cx=\"" << px(x) << "\" cy=\"" << py(y) << "\" r=\"3.5\" fill=\"" << s.color << "\"><title>"
        << esc(s.name) << ": x=" << num(x) << " y=" << num(y) << "</title></circle>\n";
    o << "<line x1=\"" << kW - kRight + 14 << "\" y1=\"" << ly << "\" x2=\"" << kW - kRight + 38 << "\" y2=\"" << ly
      << "\" stroke=\"" << s.color << "\" stroke-width=\"2\"" << (s.dashed ? " stroke-dasharray=\"5,3\"" : "")
      << "/><text x=\"" << kW - kRight + 44 << "\" y=\"" << ly + 4 << "\">" << esc(s.name) << "</text>\n";
    ly += 20;
  }
  o << "</svg>\n";
  return o.str();
}

Status write_text_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return not_found("cannot write " + path);
  f << text;
  if (!f) return internal_error("write failed: " + path);
  return Status::ok();
}

}  // namespace mxserve::bench
