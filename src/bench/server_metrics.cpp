// Prometheus scraping and spec-decode figures (see server_metrics.h).
#include "bench/server_metrics.h"

#include "bench/http_get.h"

#include <cstdlib>

namespace mxserve::bench {
namespace {

std::optional<double> get(const MetricSample& m, const std::string& name) {
  auto it = m.find(name);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

std::optional<double> delta(const MetricSample& a, const MetricSample& b, const std::string& name) {
  auto x = get(a, name), y = get(b, name);
  if (!x || !y) return std::nullopt;
  return *y - *x;
}

}  // namespace

MetricSample parse_prometheus_text(std::string_view text) {
  MetricSample out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.empty() || line[0] == '#') continue;
    size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    std::string name(line.substr(0, name_end));
    size_t value_start = name_end;
    if (line[name_end] == '{') {
      const size_t close = line.find('}', name_end);
      if (close == std::string_view::npos) continue;
      value_start = close + 1;
    }
    std::string rest(line.substr(value_start));
    char* end = nullptr;
    const double v = std::strtod(rest.c_str(), &end);
    if (end == rest.c_str()) continue;
    if (name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0) name.resize(name.size() - 6);
    out[name] += v;
  }
  return out;
}

Result<MetricSample> scrape_metrics(const std::string& base_url, const std::string& api_key) {
  const std::string url = base_url + "/metrics";
  MX_ASSIGN_OR_RETURN(HttpGetResult got, http_get(url, api_key, 5000L));
  if (got.status != 200) return not_found("GET " + url + ": http " + std::to_string(got.status));
  const std::string& body = got.body;
  return parse_prometheus_text(body);
}

SpecDecodeFigures diff_server_metrics(const MetricSample& a, const MetricSample& b) {
  SpecDecodeFigures f;
  const auto drafts = delta(a, b, "vllm:spec_decode_num_drafts");
  const auto draft_tokens = delta(a, b, "vllm:spec_decode_num_draft_tokens");
  const auto accepted = delta(a, b, "vllm:spec_decode_num_accepted_tokens");
  if (accepted && draft_tokens && *draft_tokens > 0) f.acceptance_rate = *accepted / *draft_tokens;
  if (accepted && drafts && *drafts > 0) f.acceptance_length = 1 + *accepted / *drafts;
  if (!f.acceptance_length) f.acceptance_length = get(b, "sglang:spec_accept_length");
  const auto queries = delta(a, b, "vllm:prefix_cache_queries");
  const auto hits = delta(a, b, "vllm:prefix_cache_hits");
  if (queries && hits && *queries > 0) f.prefix_cache_hit_rate = *hits / *queries;
  if (!f.prefix_cache_hit_rate) f.prefix_cache_hit_rate = get(b, "sglang:cache_hit_rate");
  return f;
}

nlohmann::json spec_figures_to_json(const SpecDecodeFigures& f) {
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  return {{"spec_acceptance_rate", opt(f.acceptance_rate)}, {"spec_acceptance_length", opt(f.acceptance_length)},
          {"server_prefix_cache_hit_rate", opt(f.prefix_cache_hit_rate)}};
}

}  // namespace mxserve::bench
