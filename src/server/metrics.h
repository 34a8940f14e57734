// Metrics: the Prometheus registry behind GET /metrics. Counters and histograms are fed by the HTTP
// threads as requests progress (token timestamps are taken on the engine thread, when each token is
// produced); gauges (running, waiting, KV usage, prefix-cache counters, preemptions) are read from the
// engine's stats at scrape time. Names follow vLLM's `vllm:` set (docs/metrics.md has the table), so
// existing dashboards work unchanged; mxserve-only series use the `mxserve:` prefix.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "launch/moe_kernel_report.h"
#include "runtime/engine.h"
#include "server/spec_alarm.h"

namespace mxserve::server {

// A sample value or bucket bound as Prometheus text: the shortest decimal that reads back as the same double
// ("0.3", not "0.29999999999999999"); +Inf / -Inf / NaN spelled as Prometheus spells them.
std::string prometheus_number(double v);
// A bucket bound as Python's client prints it (vLLM's labels): the shortest round-trip decimal, with ".0" on
// whole numbers ("0.3", "1.0", "2560.0"), so dashboards that select le="1.0" find it.
std::string prometheus_bucket_label(double v);

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends the _bucket/_sum/_count series (with `labels` inside {}) to out.
  void render(const std::string& name, const std::string& labels, std::string* out) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  explicit Metrics(std::string model_name);

  void add_prompt_tokens(int64_t n) { prompt_tokens_ += n; }
  void add_generation_tokens(int64_t n) { generation_tokens_ += n; }
  void request_finished(const std::string& finished_reason);  // stop | length | abort | error
  void http_response(int status);
  void observe_ttft(double s) { ttft_.observe(s); }
  void observe_itl(double s) { itl_.observe(s); }
  void observe_e2e(double s) { e2e_.observe(s); }
  void observe_prompt_len(double n) { prompt_len_.observe(n); }
  void observe_generation_len(double n) { gen_len_.observe(n); }
  // Per finished request (vLLM's request-phase histograms): queued (submit -> first scheduled), prefill (first
  // scheduled -> first token), decode (first -> last token), inference (prefill + decode), and the mean time
  // per output token after the first. observe_tpot: each gap between two tokens (vllm:time_per_output_token).
  void observe_queue(double s) { queue_.observe(s); }
  void observe_prefill(double s) { prefill_.observe(s); }
  void observe_decode(double s) { decode_.observe(s); }
  void observe_inference(double s) { inference_.observe(s); }
  void observe_tpot(double s) { tpot_.observe(s); }
  void observe_request_tpot(double s) { request_tpot_.observe(s); }
  // Prompt tokens served from a KV cache tier instead of computed, per choice (tier: "gpu"; a host tier adds its own).
  void add_cached_tokens(const std::string& tier, int64_t n);
  // Speculative decoding, summed over finished requests (choices): verify steps with drafts, drafted, accepted.
  void add_request_spec(int64_t drafts, int64_t draft_tokens, int64_t accepted_tokens);
  // Chat output parsing (server/chat_output.cpp): calls returned, and tool-call texts that did not parse
  // (returned as content instead).
  void add_tool_calls(int64_t n) { tool_calls_ += n; }
  void add_malformed_tool_calls(int64_t n) { malformed_tool_calls_ += n; }
  int64_t malformed_tool_calls() const { return malformed_tool_calls_; }

  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t generation_tokens() const { return generation_tokens_; }

  // Prometheus text format 0.0.4. stats is absent while the model is loading. moe: the backend's chosen MoE
  // kernel configs, one mxserve:moe_kernel_config{shape,bucket,gate_up,down,source} 1 sample each.
  // simulated_acceptance: the benchmark-mode setting (0 = drafts really verified), rendered as the gauge
  // mxserve:spec_decode_simulated_acceptance so a dashboard can tell benchmark output from real output.
  // spec_window: the acceptance collapse alarm's state (spec_alarm.h), rendered when given.
  std::string render(const std::optional<runtime::EngineStats>& stats,
                     const std::vector<launch::MoeKernelConfigRow>& moe = {}, double simulated_acceptance = 0,
                     const SpecAlarmState* spec_window = nullptr) const;

 private:
  std::string labels_;  // model_name="..."
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> generation_tokens_{0};
  std::atomic<int64_t> tool_calls_{0};
  std::atomic<int64_t> malformed_tool_calls_{0};
  mutable std::mutex mutex_;
  std::map<std::string, int64_t> finished_;  // by finished_reason
  std::map<int, int64_t> http_;              // by status code
  std::map<std::string, int64_t> cached_by_tier_;  // prompt tokens served from each cache tier
  int64_t req_spec_drafts_ = 0, req_spec_draft_tokens_ = 0, req_spec_accepted_ = 0;
  Histogram ttft_, itl_, e2e_, prompt_len_, gen_len_;
  Histogram queue_, prefill_, decode_, inference_, tpot_, request_tpot_;
  Histogram request_acceptance_;  // per finished request with drafts: accepted / drafted tokens
};

// KV usage as vLLM reports it: blocks held by requests / all blocks (prefix-cache-only blocks are free).
double kv_cache_usage(const runtime::EngineStats& s);

}  // namespace mxserve::server
