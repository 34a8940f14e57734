// ServerMetrics: counters scraped from the server's Prometheus endpoint (GET /metrics) before and
// after a rate point, for what the OpenAI stream does not carry: speculative-decoding acceptance
// and the server-side prefix-cache hit rate. Owns the text-format parsing (sums a metric over all
// label sets) and the before/after difference. Names: vLLM's (`vllm:spec_decode_num_drafts`,
// `..._num_draft_tokens`, `..._num_accepted_tokens`, `vllm:prefix_cache_queries`, `..._hits`) and
// sglang's gauges (`sglang:spec_accept_length`, `sglang:cache_hit_rate`); mxserve exports the vLLM
// names. Invariant: a figure is reported only when the server exported the counters it needs.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mxserve::bench {

// metric name (without labels; `_total` suffix folded) -> sum over label sets.
using MetricSample = std::map<std::string, double>;

MetricSample parse_prometheus_text(std::string_view text);
// GET {base_url}/metrics; not_found when the server has no such endpoint.
Result<MetricSample> scrape_metrics(const std::string& base_url, const std::string& api_key);

struct SpecDecodeFigures {
  std::optional<double> acceptance_rate;    // accepted / draft tokens over the point
  std::optional<double> acceptance_length;  // 1 + accepted / drafts (vLLM) or sglang's gauge
  std::optional<double> prefix_cache_hit_rate;  // server-side hits / queries over the point
};

SpecDecodeFigures diff_server_metrics(const MetricSample& before, const MetricSample& after);
nlohmann::json spec_figures_to_json(const SpecDecodeFigures& f);

}  // namespace mxserve::bench
