#include "server/metrics.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace mxserve::server {
namespace {

std::string num(double v) { return prometheus_number(v); }

std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void header(std::string* out, const std::string& name, const char* type, const char* help) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string* out, const std::string& name, const std::string& labels, double v) {
  *out += name + "{" + labels + "} " + num(v) + "\n";
}

// Bucket bounds as vLLM uses them (seconds), so dashboards' quantile panels line up.
std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
          20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}
std::vector<double> itl_buckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> e2e_buckets() {
  return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
          480.0, 960.0, 1920.0, 7680.0};
}
std::vector<double> token_buckets() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000};
}

std::vector<double> tpot_buckets() {  // vLLM's time_per_output_token buckets
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> ratio_buckets() {
  return {0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0};
}

}  // namespace

std::string prometheus_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Whole numbers (counters) in full ("100000", not the shorter "1e+05"); else the shortest round-trip form.
  auto r = v == std::floor(v) && std::fabs(v) < 1e15 ? std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed)
                                                     : std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string prometheus_bucket_label(double v) {
  if (!std::isfinite(v)) return prometheus_number(v);
  char buf[64];
  // Fixed notation for the range bucket bounds live in (Python prints 1e+16 and up in exponent form).
  auto r = std::fabs(v) < 1e16 && (v == 0 || std::fabs(v) >= 1e-4) ? std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed)
                                                                    : std::to_chars(buf, buf + sizeof(buf), v);
  std::string out(buf, r.ptr);
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  std::lock_guard<std::mutex> lock(mutex_);
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(const std::string& name, const std::string& labels, std::string* out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? prometheus_bucket_label(bounds_[i]) : "+Inf";
    *out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += name + "_sum{" + labels + "} " + num(sum_) + "\n";
  *out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
}

Metrics::Metrics(std::string model_name)
    : labels_("model_name=\"" + escape_label(model_name) + "\""),
      ttft_(ttft_buckets()),
      itl_(itl_buckets()),
      e2e_(e2e_buckets()),
      prompt_len_(token_buckets()),
      gen_len_(token_buckets()),
      queue_(e2e_buckets()),
      prefill_(e2e_buckets()),
      decode_(e2e_buckets()),
      inference_(e2e_buckets()),
      tpot_(tpot_buckets()),
      request_tpot_(tpot_buckets()),
      request_acceptance_(ratio_buckets()) {
  for (const char* r : {"stop", "length", "abort", "error"}) finished_[r] = 0;
  cached_by_tier_["gpu"] = 0;
}

void Metrics::add_cached_tokens(const std::string& tier, int64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  cached_by_tier_[tier] += n;
}

void Metrics::add_request_spec(int64_t drafts, int64_t draft_tokens, int64_t accepted_tokens) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    req_spec_drafts_ += drafts;
    req_spec_draft_tokens_ += draft_tokens;
    req_spec_accepted_ += accepted_tokens;
  }
  if (draft_tokens > 0)
    request_acceptance_.observe(static_cast<double>(accepted_tokens) / static_cast<double>(draft_tokens));
}

void Metrics::request_finished(const std::string& finished_reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++finished_[finished_reason];
}

void Metrics::http_response(int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++http_[status];
}

double kv_cache_usage(const runtime::EngineStats& s) {
  if (s.blocks_total <= 0) return 0;
  const int64_t used = s.blocks_total - s.blocks_free - s.blocks_cached;
  return static_cast<double>(used) / static_cast<double>(s.blocks_total);
}

std::string Metrics::render(const std::optional<runtime::EngineStats>& stats,
                            const std::vector<launch::MoeKernelConfigRow>& moe, double simulated_acceptance,
                            const SpecAlarmState* spec_window) const {
  std::string out;
  out.reserve(16384);
  const runtime::EngineStats s = stats.value_or(runtime::EngineStats{});
  header(&out, "vllm:num_requests_running", "gauge", "Requests in the running batch.");
  sample(&out, "vllm:num_requests_running", labels_, static_cast<double>(s.running));
  header(&out, "vllm:num_requests_waiting", "gauge", "Requests waiting to be admitted.");
  sample(&out, "vllm:num_requests_waiting", labels_, static_cast<double>(s.waiting));
  header(&out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage, 0..1 (blocks held by requests / all blocks).");
  sample(&out, "vllm:kv_cache_usage_perc", labels_, kv_cache_usage(s));
  header(&out, "vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.");
  sample(&out, "vllm:prefix_cache_queries_total", labels_, static_cast<double>(s.scheduler.prefix_queries_tokens));
  header(&out, "vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.");
  sample(&out, "vllm:prefix_cache_hits_total", labels_, static_cast<double>(s.scheduler.prefix_hit_tokens));
  // Prefix-cache hits per tier (host KV tier: --kv-cache-host-memory, docs/kv-cache.md).
  header(&out, "mxserve:prefix_cache_hits_tokens_total", "counter",
         "Prompt tokens served from the prefix cache, by tier (device pool / host-memory tier).");
  sample(&out, "mxserve:prefix_cache_hits_tokens_total", labels_ + ",tier=\"device\"",
         static_cast<double>(s.scheduler.prefix_hit_tokens - s.scheduler.prefix_host_hit_tokens));
  sample(&out, "mxserve:prefix_cache_hits_tokens_total", labels_ + ",tier=\"host\"",
         static_cast<double>(s.scheduler.prefix_host_hit_tokens));
  if (s.host_blocks_total > 0) {
    header(&out, "mxserve:kv_host_tier_blocks", "gauge", "Host KV tier blocks: total and in use.");
    sample(&out, "mxserve:kv_host_tier_blocks", labels_ + ",state=\"total\"", static_cast<double>(s.host_blocks_total));
    sample(&out, "mxserve:kv_host_tier_blocks", labels_ + ",state=\"used\"", static_cast<double>(s.host_blocks_used));
    header(&out, "mxserve:kv_host_tier_block_copies_total", "counter",
           "Host KV tier: blocks offloaded (device to host), loaded back (host to device), dropped (LRU / no slot).");
    sample(&out, "mxserve:kv_host_tier_block_copies_total", labels_ + ",op=\"offload\"",
           static_cast<double>(s.host_tier.offloaded_blocks));
    sample(&out, "mxserve:kv_host_tier_block_copies_total", labels_ + ",op=\"load\"",
           static_cast<double>(s.host_tier.loaded_blocks));
    sample(&out, "mxserve:kv_host_tier_block_copies_total", labels_ + ",op=\"drop\"",
           static_cast<double>(s.host_tier.dropped_blocks));
  }
  header(&out, "vllm:num_preemptions_total", "counter", "Requests preempted (KV cache full) and recomputed.");
  sample(&out, "vllm:num_preemptions_total", labels_, static_cast<double>(s.scheduler.preemptions));
  header(&out, "vllm:prompt_tokens_total", "counter", "Prompt tokens of admitted requests (each choice counts).");
  sample(&out, "vllm:prompt_tokens_total", labels_, static_cast<double>(prompt_tokens_.load()));
  header(&out, "vllm:generation_tokens_total", "counter", "Generated tokens.");
  sample(&out, "vllm:generation_tokens_total", labels_, static_cast<double>(generation_tokens_.load()));
  header(&out, "mxserve:tool_calls_total", "counter", "Tool calls parsed from model output and returned as tool_calls.");
  sample(&out, "mxserve:tool_calls_total", labels_, static_cast<double>(tool_calls_.load()));
  header(&out, "mxserve:tool_call_parse_failures_total", "counter",
         "Tool-call texts in model output that did not parse (returned as content).");
  sample(&out, "mxserve:tool_call_parse_failures_total", labels_, static_cast<double>(malformed_tool_calls_.load()));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    header(&out, "vllm:request_success_total", "counter", "Finished requests (choices) by finish reason.");
    for (const auto& [reason, n] : finished_)
      sample(&out, "vllm:request_success_total", labels_ + ",finished_reason=\"" + reason + "\"", static_cast<double>(n));
    header(&out, "mxserve:prompt_tokens_cached_total", "counter",
           "Prompt tokens served from a KV cache tier instead of computed (each choice counts), by tier.");
    for (const auto& [tier, n] : cached_by_tier_)
      sample(&out, "mxserve:prompt_tokens_cached_total", labels_ + ",tier=\"" + escape_label(tier) + "\"",
             static_cast<double>(n));
    header(&out, "mxserve:request_spec_decode_num_drafts_total", "counter",
           "Finished requests' verify steps that carried drafts (summed per request).");
    sample(&out, "mxserve:request_spec_decode_num_drafts_total", labels_, static_cast<double>(req_spec_drafts_));
    header(&out, "mxserve:request_spec_decode_num_draft_tokens_total", "counter",
           "Finished requests' drafted tokens (summed per request).");
    sample(&out, "mxserve:request_spec_decode_num_draft_tokens_total", labels_,
           static_cast<double>(req_spec_draft_tokens_));
    header(&out, "mxserve:request_spec_decode_num_accepted_tokens_total", "counter",
           "Finished requests' accepted drafted tokens (summed per request).");
    sample(&out, "mxserve:request_spec_decode_num_accepted_tokens_total", labels_,
           static_cast<double>(req_spec_accepted_));
    header(&out, "mxserve:http_responses_total", "counter", "HTTP responses by status code.");
    for (const auto& [code, n] : http_)
      sample(&out, "mxserve:http_responses_total", labels_ + ",code=\"" + std::to_string(code) + "\"",
             static_cast<double>(n));
  }
  const runtime::StepCostStats& sc = s.step_cost;
  header(&out, "mxserve:itl_target_seconds", "gauge", "--max-itl-ms: the ITL target of chunked prefill (0: off).");
  sample(&out, "mxserve:itl_target_seconds", labels_, sc.target_seconds);
  header(&out, "mxserve:step_cost_model_ready", "gauge", "1 once the step cost model has enough samples to be used.");
  sample(&out, "mxserve:step_cost_model_ready", labels_, sc.ready ? 1 : 0);
  header(&out, "mxserve:step_cost_samples_total", "counter", "Measured steps fed to the step cost model.");
  sample(&out, "mxserve:step_cost_samples_total", labels_, static_cast<double>(sc.samples));
  header(&out, "mxserve:step_cost_coefficient_seconds", "gauge",
         "Fitted step cost: seconds per unit of each term (docs/scheduling.md).");
  for (const auto& [term, v] : {std::pair<const char*, double>{"base", sc.coefficients.base},
                                {"prefill_token", sc.coefficients.per_prefill_token},
                                {"prefill_attention_pair", sc.coefficients.per_prefill_pair},
                                {"decode_row", sc.coefficients.per_decode_row},
                                {"decode_kv_token", sc.coefficients.per_decode_kv_token}})
    sample(&out, "mxserve:step_cost_coefficient_seconds", labels_ + ",term=\"" + term + "\"", v);
  header(&out, "mxserve:step_cost_mean_relative_error", "gauge", "Mean |measured - predicted| / measured of the fit.");
  sample(&out, "mxserve:step_cost_mean_relative_error", labels_, sc.mean_relative_error);
  header(&out, "mxserve:step_seconds_last", "gauge", "Measured time of the latest engine step.");
  sample(&out, "mxserve:step_seconds_last", labels_, sc.last_step_seconds);
  header(&out, "mxserve:step_seconds_predicted_last", "gauge", "Predicted time of the latest ITL-limited step.");
  sample(&out, "mxserve:step_seconds_predicted_last", labels_, sc.last_predicted_seconds);
  header(&out, "mxserve:itl_limited_steps_total", "counter", "Steps whose prefill the ITL target bounded.");
  sample(&out, "mxserve:itl_limited_steps_total", labels_, static_cast<double>(sc.itl_limited_steps));
  header(&out, "mxserve:itl_over_target_steps_total", "counter",
         "ITL-limited steps whose decodes alone were predicted over the target (prefill got --min-prefill-chunk).");
  sample(&out, "mxserve:itl_over_target_steps_total", labels_, static_cast<double>(sc.over_target_steps));
  header(&out, "vllm:time_to_first_token_seconds", "histogram", "Time from arrival to the first generated token.");
  ttft_.render("vllm:time_to_first_token_seconds", labels_, &out);
  header(&out, "vllm:inter_token_latency_seconds", "histogram", "Time between consecutive generated tokens.");
  itl_.render("vllm:inter_token_latency_seconds", labels_, &out);
  header(&out, "vllm:e2e_request_latency_seconds", "histogram", "Time from arrival to the last token.");
  e2e_.render("vllm:e2e_request_latency_seconds", labels_, &out);
  header(&out, "vllm:time_per_output_token_seconds", "histogram",
         "Time per output token: each gap between consecutive generated tokens of a request.");
  tpot_.render("vllm:time_per_output_token_seconds", labels_, &out);
  header(&out, "vllm:request_time_per_output_token_seconds", "histogram",
         "Per finished request: decode time / (generated tokens - 1).");
  request_tpot_.render("vllm:request_time_per_output_token_seconds", labels_, &out);
  header(&out, "vllm:request_queue_time_seconds", "histogram", "Per request: submitted to the engine -> first scheduled.");
  queue_.render("vllm:request_queue_time_seconds", labels_, &out);
  header(&out, "vllm:request_prefill_time_seconds", "histogram", "Per request: first scheduled -> first token.");
  prefill_.render("vllm:request_prefill_time_seconds", labels_, &out);
  header(&out, "vllm:request_decode_time_seconds", "histogram", "Per request: first token -> last token.");
  decode_.render("vllm:request_decode_time_seconds", labels_, &out);
  header(&out, "vllm:request_inference_time_seconds", "histogram", "Per request: first scheduled -> last token.");
  inference_.render("vllm:request_inference_time_seconds", labels_, &out);
  {
    const runtime::IterationTokens& it = s.iteration_tokens;
    header(&out, "vllm:iteration_tokens_total", "histogram", "Tokens per engine step (prompt tokens computed + generated).");
    int64_t cumulative = 0;
    for (size_t i = 0; i <= runtime::kNumIterationTokenBuckets; ++i) {
      cumulative += i < it.counts.size() ? it.counts[i] : 0;
      const std::string le = i < runtime::kNumIterationTokenBuckets
                                 ? prometheus_bucket_label(static_cast<double>(runtime::kIterationTokenBuckets[i]))
                                 : "+Inf";
      out += "vllm:iteration_tokens_total_bucket{" + labels_ + ",le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
    }
    out += "vllm:iteration_tokens_total_sum{" + labels_ + "} " + std::to_string(it.sum) + "\n";
    out += "vllm:iteration_tokens_total_count{" + labels_ + "} " + std::to_string(it.steps) + "\n";
  }
  header(&out, "vllm:request_prompt_tokens", "histogram", "Prompt length of finished requests.");
  prompt_len_.render("vllm:request_prompt_tokens", labels_, &out);
  header(&out, "vllm:request_generation_tokens", "histogram", "Generated length of finished requests.");
  gen_len_.render("vllm:request_generation_tokens", labels_, &out);
  header(&out, "mxserve:spec_decode_simulated_acceptance", "gauge",
         "Benchmark mode: the simulated mean accepted length per step (0: drafts are verified by the model; "
         "> 0: outputs are meaningless).");
  sample(&out, "mxserve:spec_decode_simulated_acceptance", labels_, simulated_acceptance);
  header(&out, "vllm:spec_decode_num_drafts_total", "counter", "Verify steps that carried MTP drafts.");
  sample(&out, "vllm:spec_decode_num_drafts_total", labels_, static_cast<double>(s.spec.num_drafts));
  header(&out, "vllm:spec_decode_num_draft_tokens_total", "counter", "Drafted tokens.");
  sample(&out, "vllm:spec_decode_num_draft_tokens_total", labels_, static_cast<double>(s.spec.num_draft_tokens));
  header(&out, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Accepted drafted tokens.");
  sample(&out, "vllm:spec_decode_num_accepted_tokens_total", labels_, static_cast<double>(s.spec.num_accepted_tokens));
  header(&out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted drafts by position.");
  for (size_t i = 0; i < s.spec.accepted_per_pos.size(); ++i)
    sample(&out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", labels_ + ",position=\"" + std::to_string(i) + "\"",
           static_cast<double>(s.spec.accepted_per_pos[i]));
  header(&out, "mxserve:request_spec_decode_acceptance", "histogram",
         "Per finished request with drafts: accepted / drafted tokens.");
  request_acceptance_.render("mxserve:request_spec_decode_acceptance", labels_, &out);
  if (spec_window && spec_window->enabled) {
    header(&out, "mxserve:spec_decode_window_acceptance_rate", "gauge",
           "Over the alarm's window of recent verify steps: drafts accepted at each position / verify steps.");
    for (size_t i = 0; i < spec_window->rate_per_pos.size(); ++i)
      sample(&out, "mxserve:spec_decode_window_acceptance_rate", labels_ + ",position=\"" + std::to_string(i) + "\"",
             spec_window->rate_per_pos[i]);
    header(&out, "mxserve:spec_decode_window_verify_steps", "gauge", "Verify steps in that window (0: no full window yet).");
    sample(&out, "mxserve:spec_decode_window_verify_steps", labels_, static_cast<double>(spec_window->window_drafts));
    header(&out, "mxserve:spec_decode_acceptance_alarm_bound", "gauge", "--spec-acceptance-alarm: the position-0 bound.");
    sample(&out, "mxserve:spec_decode_acceptance_alarm_bound", labels_, spec_window->bound);
    header(&out, "mxserve:spec_decode_acceptance_collapsed", "gauge",
           "1 while the window's position-0 acceptance is below the bound (a warning is logged on each change).");
    sample(&out, "mxserve:spec_decode_acceptance_collapsed", labels_, spec_window->collapsed ? 1 : 0);
    header(&out, "mxserve:spec_decode_acceptance_alarms_total", "counter", "Times acceptance collapsed below the bound.");
    sample(&out, "mxserve:spec_decode_acceptance_alarms_total", labels_, static_cast<double>(spec_window->alarms));
  }
  header(&out, "vllm:spec_decode_draft_acceptance_rate", "gauge", "Adaptive policy's EMA of accepted / drafted.");
  sample(&out, "vllm:spec_decode_draft_acceptance_rate", labels_, s.spec.acceptance_rate);
  header(&out, "mxserve:spec_decode_num_speculative_tokens", "gauge", "Draft length N the adaptive policy chose last.");
  sample(&out, "mxserve:spec_decode_num_speculative_tokens", labels_, static_cast<double>(s.spec.current_steps));
  header(&out, "mxserve:spec_decode_expected_accepted_tokens", "gauge", "Expected accepted drafts per step at the current N.");
  sample(&out, "mxserve:spec_decode_expected_accepted_tokens", labels_, s.spec.expected_accepted);
  header(&out, "mxserve:spec_decode_estimated_gain", "gauge",
         "Estimated decode throughput at the current N over plain decoding (1 while unmeasured).");
  sample(&out, "mxserve:spec_decode_estimated_gain", labels_, s.spec.estimated_gain);
  header(&out, "mxserve:grammar_masks_total", "counter", "Structured-output token masks computed (plain decode path).");
  sample(&out, "mxserve:grammar_masks_total", labels_, static_cast<double>(s.grammar_masks));
  header(&out, "mxserve:grammar_mask_seconds_total", "counter", "Summed compute time of those masks (worker threads).");
  sample(&out, "mxserve:grammar_mask_seconds_total", labels_, s.grammar_mask_seconds);
  header(&out, "mxserve:grammar_wait_seconds_total", "counter",
         "Engine-thread time waiting for masks after the forward (the mask cost the forward did not hide).");
  sample(&out, "mxserve:grammar_wait_seconds_total", labels_, s.grammar_wait_seconds);
  header(&out, "mxserve:kv_blocks_total", "gauge", "KV-cache blocks in the pool.");
  sample(&out, "mxserve:kv_blocks_total", labels_, static_cast<double>(s.blocks_total));
  header(&out, "mxserve:kv_blocks_free", "gauge", "KV-cache blocks on the free list.");
  sample(&out, "mxserve:kv_blocks_free", labels_, static_cast<double>(s.blocks_free));
  header(&out, "mxserve:kv_blocks_cached", "gauge", "KV-cache blocks held only by the prefix cache (evictable).");
  sample(&out, "mxserve:kv_blocks_cached", labels_, static_cast<double>(s.blocks_cached));
  header(&out, "mxserve:engine_steps_total", "counter", "Engine steps that ran a batch.");
  sample(&out, "mxserve:engine_steps_total", labels_, static_cast<double>(s.steps));
  header(&out, "mxserve:requests_aborted_total", "counter", "Requests aborted (client disconnects, stop strings).");
  sample(&out, "mxserve:requests_aborted_total", labels_, static_cast<double>(s.aborted));
  if (!moe.empty()) {
    header(&out, "mxserve:moe_kernel_config", "gauge",
           "MoE expert kernel variants chosen per shape and token-count bucket (source table|heuristic); always 1.");
    for (const auto& r : moe)
      sample(&out, "mxserve:moe_kernel_config",
             labels_ + ",shape=\"" + escape_label(r.shape) + "\",bucket=\"" + escape_label(r.bucket) +
                 "\",gate_up=\"" + escape_label(r.gate_up) + "\",down=\"" + escape_label(r.down) + "\",source=\"" +
                 escape_label(r.source) + "\"",
             1.0);
  }
  return out;
}

}  // namespace mxserve::server
