// BenchRun::run_trace: the `--workload trace` run (one point: every session of the trace, replayed
// by a TraceSchedule through run_load), its report block and JSON. See trace_workload.h.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <optional>

#include "bench/arrivals.h"
#include "bench/bench_run.h"
#include "bench/metrics.h"
#include "bench/server_metrics.h"
#include "bench/svg_plot.h"
#include "bench/trace_workload.h"

namespace mxserve::bench {

Status BenchRun::run_trace() {
  if (!trace_) {
    MX_ASSIGN_OR_RETURN(Trace t, read_trace_file(c_.trace_file));
    trace_ = std::make_unique<Trace>(std::move(t));
  }
  TraceReplayConfig rc;
  rc.chat = c_.endpoint == Endpoint::kChat;
  rc.model = model_;
  rc.ignore_eos = c_.ignore_eos;
  rc.temperature = c_.temperature;
  rc.extra_body = extra_body_;
  rc.num_sessions = c_.num_sessions > 0 ? c_.num_sessions : static_cast<int64_t>(trace_->sessions.size());
  rc.max_active = c_.max_concurrency;
  rc.duration_s = c_.duration_s;
  rc.seed = c_.workload.seed;
  if (c_.session_rate > 0) {
    MX_ASSIGN_OR_RETURN(rc.session_offsets,
                        make_arrival_schedule(c_.arrival, c_.session_rate, rc.num_sessions, c_.duration_s, 0));
    if (rc.session_offsets.empty()) return invalid_argument("--duration too short: no session arrives inside it");
    rc.num_sessions = static_cast<int64_t>(rc.session_offsets.size());
  }
  if (trace_->needs_tokenizer() && rc.num_sessions >= 250)
    err_ << "mxserve bench: building the new inputs of " << rc.num_sessions << " sessions before the clock starts\n";
  MX_ASSIGN_OR_RETURN(std::unique_ptr<TraceSchedule> sched,
                      TraceSchedule::make(*trace_, rc, codec_.get(), corpus_.get()));
  if (sched->lazy())
    err_ << "mxserve bench: NOTE: the sessions' new inputs pass " << rc.prebuild_token_cap
         << " tokens: each session's are built when it starts, so a due turn of another session may wait "
            "for that (client queue time shows it); use fewer --num-sessions to build all up front\n";
  const nlohmann::json describe = sched->describe(c_.trace_file);
  err_ << "mxserve bench: " << model_ << " at " << c_.base_url
       << (rc.chat ? "/v1/chat/completions" : "/v1/completions") << ", trace " << c_.trace_file << ": "
       << sched->instances() << " session(s), "
       << (c_.session_rate > 0 ? "arriving at " + std::to_string(c_.session_rate).substr(0, 6) + "/s" : std::string("all at start"))
       << (c_.max_concurrency > 0 ? ", at most " + std::to_string(c_.max_concurrency) + " at once" : std::string()) << "\n";

  LoadPlan plan;
  plan.dynamic = sched.get();
  HttpTarget target;
  target.url = c_.base_url + (rc.chat ? "/v1/chat/completions" : "/v1/completions");
  if (!c_.api_key.empty()) target.headers.push_back("Authorization: Bearer " + c_.api_key);
  target.request_timeout_s = c_.request_timeout_s;
  const bool tty = isatty(STDERR_FILENO);
  RunOptions opt;
  opt.http_client = c_.http_client;
  opt.stop = stop_;
  opt.progress_interval_s = tty ? 1.0 : 10.0;
  if (c_.progress) {
    opt.progress = [&](const Progress& p) {
      char buf[200];
      char ttft[32] = "-";
      if (p.ttft_p95_s >= 0) std::snprintf(ttft, sizeof ttft, "%.3fs", p.ttft_p95_s);
      std::snprintf(buf, sizeof buf, "[trace] %6.1fs turns sent %lld done %lld failed %lld in-flight %lld TTFT p95 %s",
                    p.elapsed_s, static_cast<long long>(p.sent), static_cast<long long>(p.done),
                    static_cast<long long>(p.failed), static_cast<long long>(p.in_flight), ttft);
      if (tty) err_ << "\r\033[K" << buf << std::flush;
      else err_ << buf << "\n";
    };
  }
  std::optional<MetricSample> before;
  if (c_.scrape_server_metrics) {
    auto s = scrape_metrics(c_.base_url, c_.api_key);
    if (s.is_ok()) before = std::move(s).value();
  }
  MX_ASSIGN_OR_RETURN(RunResult rr, run_load(target, plan, BodySource(), opt));
  if (rr.stopped) interrupted_ = true;
  if (c_.progress && tty) err_ << "\n";
  PointResult pr;
  if (before) {
    auto after = scrape_metrics(c_.base_url, c_.api_key);
    if (after.is_ok()) pr.server = diff_server_metrics(*before, *after);
  }
  pr.metrics = compute_rate_metrics(rr.records, INFINITY, c_.max_concurrency);
  pr.metrics.max_in_flight = rr.max_in_flight;
  pr.phase = "trace";
  if (c_.save_requests) {
    pr.requests = requests_to_json(rr.records);
    for (size_t i = 0; i < rr.records.size(); ++i) {
      pr.requests[i]["session"] = rr.records[i].session;
      pr.requests[i]["turn"] = rr.records[i].turn;
    }
  }
  trace_metrics_ = std::make_unique<TraceMetrics>(compute_trace_metrics(rr.records, sched->turns_per_instance()));
  print_metrics_block(out_, pr.metrics, c_.gpus, &pr.server);
  print_trace_block(out_, *trace_metrics_);
  if (pr.metrics.input_token_error > 0.01)
    err_ << "mxserve bench: WARNING: the server counted prompt tokens up to "
         << std::to_string(pr.metrics.input_token_error * 100).substr(0, 5)
         << "% away from the client's count (a different tokenizer?)\n";
  points_.push_back(std::move(pr));
  if (interrupted_ || (stop_ && stop_->load())) {
    interrupted_ = true;
    err_ << "mxserve bench: interrupted: results cover the turns that ran\n";
  }
  result_ = result_json(c_, model_, describe, codec_ ? codec_->describe() : std::string("none"), points_, nullptr);
  result_["arrival"]["session_rate"] = c_.session_rate;
  result_["arrival"]["num_sessions"] = sched->instances();
  result_["trace"] = trace_metrics_to_json(*trace_metrics_);
  if (!c_.output_json.empty()) {
    MX_RETURN_IF_ERROR(write_text_file(c_.output_json, result_.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"));
    out_ << "Wrote " << c_.output_json << "\n";
  }
  return Status::ok();
}

}  // namespace mxserve::bench
