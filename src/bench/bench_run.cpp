// BenchRun (see bench_run.h).
#include "bench/bench_run.h"

#include "bench/http_get.h"
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <thread>

#include "bench/arrivals.h"
#include "bench/metrics.h"
#include "bench/plots.h"
#include "bench/server_metrics.h"
#include "bench/svg_plot.h"

namespace mxserve::bench {
namespace {

std::string endpoint_url(const BenchConfig& c) {
  return c.base_url + (c.endpoint == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions");
}

}  // namespace

Result<std::string> fetch_first_model(const std::string& base_url, const std::string& api_key) {
  const std::string url = base_url + "/v1/models";
  auto got = http_get(url, api_key, 10000L);
  if (!got.is_ok()) return unavailable(got.status().message() + " (is the server up?)");
  if (got->status != 200) return unavailable("GET " + url + ": http " + std::to_string(got->status) + " (pass --model)");
  const std::string& body = got->body;
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
    return data_loss("GET " + url + ": no data[0].id in the response (pass --model)");
  return j["data"][0]["id"].get<std::string>();
}

// A server that answers /health with 503 is still loading (or draining): wait, up to the timeout, so the
// first measured point does not land on a cold server. No /health (404, other servers) or an
// unreachable server: go on, the next check reports it.
namespace {
Status wait_until_ready(const std::string& base_url, const std::string& api_key, double timeout_s, std::ostream& err) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool said = false;
  for (;;) {
    auto got = http_get(base_url + "/health", api_key, 5000L);
    if (!got.is_ok() || got->status != 503) return Status::ok();
    if (std::chrono::steady_clock::now() >= deadline)
      return unavailable(base_url + "/health still 503 after " + std::to_string(static_cast<int>(timeout_s)) +
                         " s (--ready-timeout)");
    if (!said) err << "mxserve bench: waiting for " << base_url << "/health (503: the server is loading)\n";
    said = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}
}  // namespace

Status BenchRun::prepare() {
  MX_RETURN_IF_ERROR(wait_until_ready(c_.base_url, c_.api_key, c_.ready_timeout_s, err_));
  if (c_.model.empty()) {
    MX_ASSIGN_OR_RETURN(model_, fetch_first_model(c_.base_url, c_.api_key));
  } else {
    model_ = c_.model;
    // Reachability check: a server without /v1/models is fine, one that refuses connections is not.
    auto probe = fetch_first_model(c_.base_url, c_.api_key);
    if (!probe.is_ok() && probe.status().code() == StatusCode::kUnavailable &&
        probe.status().message().find(": http ") == std::string::npos)
      return probe.status();
  }
  if (!c_.tokenizer.empty()) {
    MX_ASSIGN_OR_RETURN(codec_, make_token_codec(c_.tokenizer));
    if (!codec_->exact_for_model())
      err_ << "mxserve bench: WARNING: --tokenizer " << c_.tokenizer
           << " is not the model's tokenizer: token counts are approximate (test servers only)\n";
  }
  if (codec_ && c_.workload.kind != WorkloadKind::kFile) {
    MX_ASSIGN_OR_RETURN(TokenCorpus corpus, TokenCorpus::load(c_.corpus, *codec_));
    corpus_ = std::make_unique<TokenCorpus>(std::move(corpus));
  }
  if (!c_.extra_body.empty()) extra_body_ = nlohmann::json::parse(c_.extra_body);
  if (c_.workload.kind == WorkloadKind::kTrace) return Status::ok();  // run_trace() builds its schedule
  MX_ASSIGN_OR_RETURN(workload_, make_workload(c_.workload, codec_.get(), corpus_.get()));
  if (c_.warmup_requests < 0) c_.warmup_requests = workload_->default_warmup();
  return Status::ok();
}

Result<RequestSpec> BenchRun::build_request(uint64_t stream, int64_t index) const {
  MX_ASSIGN_OR_RETURN(Prompt p, workload_->prompt(stream, static_cast<uint64_t>(index)));
  nlohmann::json body;
  body["model"] = model_;
  if (c_.endpoint == Endpoint::kChat) {
    body["messages"] = p.messages.is_null() ? nlohmann::json::array({{{"role", "user"}, {"content", p.text}}}) : p.messages;
  } else {
    if (!p.messages.is_null())
      return invalid_argument("--endpoint completions cannot send a 'messages' row of --dataset " + c_.workload.file +
                              "; use --endpoint chat");
    body["prompt"] = p.text;
  }
  body["max_tokens"] = p.output_len;
  if (c_.ignore_eos) body["ignore_eos"] = true;
  if (c_.temperature >= 0) body["temperature"] = c_.temperature;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (extra_body_.is_object()) body.update(extra_body_);
  RequestSpec spec;
  // Invalid UTF-8 in a dataset row or a model's text must not abort the run: replaced by U+FFFD.
  spec.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  spec.intended_input = p.input_tokens;
  spec.intended_output = p.output_len;
  spec.group = p.group;
  return spec;
}

Result<PointResult> BenchRun::run_point(double rate, const std::string& phase, int64_t num_requests) {
  if (num_requests < 0) num_requests = c_.num_requests;
  const uint64_t stream = next_stream_++;
  const int64_t warmup = c_.warmup_requests;
  LoadPlan plan;
  plan.warmup = warmup;
  const bool closed = std::isnan(rate);
  if (closed) {
    plan.max_concurrency = c_.max_concurrency;
    plan.num_requests = c_.num_requests >= 0 ? c_.num_requests + warmup : -1;
    plan.duration_s = c_.duration_s;
  } else {
    plan.max_concurrency = c_.max_concurrency;
    const int64_t n = num_requests >= 0 ? num_requests + warmup : -1;
    const double d = c_.duration_s > 0 ? c_.duration_s + (std::isinf(rate) ? 0 : static_cast<double>(warmup) / rate) : 0;
    MX_ASSIGN_OR_RETURN(plan.offsets, make_arrival_schedule(c_.arrival, rate, n, d, stream));
    if (plan.offsets.empty()) return invalid_argument("--duration too short: no request falls inside it at this rate");
  }
  // Open loop: build every body before the clock starts so prompt building never delays a send.
  std::vector<RequestSpec> prebuilt;
  if (!closed) {
    if (plan.offsets.size() >= 200)
      err_ << "mxserve bench: building " << plan.offsets.size() << " prompts before the clock starts\n";
    prebuilt.reserve(plan.offsets.size());
    for (size_t i = 0; i < plan.offsets.size(); ++i) {
      MX_ASSIGN_OR_RETURN(RequestSpec s, build_request(stream, static_cast<int64_t>(i)));
      prebuilt.push_back(std::move(s));
    }
  }
  BodySource source = [&](int64_t i) -> Result<RequestSpec> {
    if (!closed) return std::move(prebuilt[static_cast<size_t>(i)]);
    return build_request(stream, i);
  };
  HttpTarget target;
  target.url = endpoint_url(c_);
  if (!c_.api_key.empty()) target.headers.push_back("Authorization: Bearer " + c_.api_key);
  target.request_timeout_s = c_.request_timeout_s;
  const bool tty = isatty(STDERR_FILENO);
  RunOptions opt;
  opt.http_client = c_.http_client;
  opt.stop = stop_;
  opt.progress_interval_s = tty ? 1.0 : 10.0;
  char rate_buf[32];
  std::snprintf(rate_buf, sizeof rate_buf, "%g", rate);
  const std::string label = closed ? "C=" + std::to_string(c_.max_concurrency) : std::string(rate_buf);
  if (c_.progress) {
    opt.progress = [&, label](const Progress& p) {
      char buf[200];
      char ttft[32] = "-";
      if (p.ttft_p95_s >= 0) std::snprintf(ttft, sizeof ttft, "%.3fs", p.ttft_p95_s);
      std::snprintf(buf, sizeof buf, "[rate %s] %6.1fs sent %lld done %lld failed %lld in-flight %lld TTFT p95 %s",
                    label.c_str(), p.elapsed_s, static_cast<long long>(p.sent), static_cast<long long>(p.done),
                    static_cast<long long>(p.failed), static_cast<long long>(p.in_flight), ttft);
      if (tty) err_ << "\r\033[K" << buf << std::flush;
      else err_ << buf << "\n";
    };
  }
  std::optional<MetricSample> before;
  if (c_.scrape_server_metrics && !metrics_endpoint_missing_) {
    auto s = scrape_metrics(c_.base_url, c_.api_key);
    if (s.is_ok()) before = std::move(s).value();
    else metrics_endpoint_missing_ = true;  // the server exports no /metrics: nothing to report
  }
  MX_ASSIGN_OR_RETURN(RunResult rr, run_load(target, plan, source, opt));
  if (rr.stopped) interrupted_ = true;
  SpecDecodeFigures server_figures;
  if (before) {
    auto after = scrape_metrics(c_.base_url, c_.api_key);
    if (after.is_ok()) server_figures = diff_server_metrics(*before, *after);
  }
  if (c_.progress && tty) err_ << "\n";
  PointResult pr;
  pr.metrics = compute_rate_metrics(rr.records, closed ? INFINITY : rate, c_.max_concurrency);
  pr.metrics.max_in_flight = rr.max_in_flight;
  pr.verdict = judge(pr.metrics, c_.knee);
  pr.phase = phase;
  pr.server = server_figures;
  if (c_.save_requests) pr.requests = requests_to_json(rr.records);
  print_metrics_block(out_, pr.metrics, c_.gpus, &pr.server);
  if (pr.metrics.input_token_error > 0.01)
    err_ << "mxserve bench: WARNING: the server counted prompt tokens up to "
         << std::to_string(pr.metrics.input_token_error * 100).substr(0, 5)
         << "% away from the intended count (chat template overhead or a different tokenizer?)\n";
  points_.push_back(pr);
  return pr;
}

Status BenchRun::write_outputs() {
  print_summary_table(out_, points_, c_, knee());
  result_ = result_json(c_, model_, workload_->describe(), codec_ ? codec_->describe() : std::string("none"), points_, knee());
  if (!c_.output_json.empty()) {
    MX_RETURN_IF_ERROR(write_text_file(c_.output_json, result_.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"));
    out_ << "Wrote " << c_.output_json << "\n";
  }
  if (!c_.plot_prefix.empty()) {
    MX_ASSIGN_OR_RETURN(std::vector<std::string> files, write_plots(c_.plot_prefix, points_, c_, knee()));
    for (const std::string& f : files) out_ << "Wrote " << f << "\n";
  }
  return Status::ok();
}

Status BenchRun::run() {
  if (c_.workload.kind == WorkloadKind::kTrace) {  // a malformed trace fails before the server is asked
    MX_ASSIGN_OR_RETURN(Trace t, read_trace_file(c_.trace_file));
    trace_ = std::make_unique<Trace>(std::move(t));
    if (trace_->needs_tokenizer() && c_.tokenizer.empty())
      return invalid_argument("--trace " + c_.trace_file + ": turns with input_tokens are cut from the corpus: give "
                              "--tokenizer (the model's tokenizer.json or directory)");
  }
  MX_RETURN_IF_ERROR(prepare());
  if (c_.workload.kind == WorkloadKind::kTrace) return run_trace();
  const Status kInterrupted = unavailable("interrupted");
  auto stopping = [&] { return interrupted_ || (stop_ && stop_->load()); };
  err_ << "mxserve bench: " << model_ << " at " << endpoint_url(c_) << ", workload " << workload_->describe().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
       << ", arrivals " << (c_.closed_loop() ? "closed loop" : arrival_kind_name(c_.arrival.kind))
       << ", warm-up " << c_.warmup_requests << " request(s) per point\n";
  if (c_.closed_loop()) {
    MX_RETURN_IF_ERROR(run_point(NAN, c_.workload.kind == WorkloadKind::kSingleStream ? "single" : "closed").status());
  } else if (c_.find_knee) {
    KneeSearchConfig kc;
    kc.grid = c_.rates;
    kc.tolerance = c_.knee_tolerance;
    kc.max_bisections = c_.knee_max_bisections;
    std::string phase = "grid";
    size_t grid_seen = 0;
    auto eval = [&](double rate) -> Result<Verdict> {
      if (stopping()) return kInterrupted;
      if (++grid_seen > c_.rates.size() || rate != c_.rates[grid_seen - 1]) phase = "bisect";
      MX_ASSIGN_OR_RETURN(PointResult p, run_point(rate, phase));
      // A point whose TTFT and success pass but whose run ended before its queue could be judged (a request's
      // life longer than the arrivals: long outputs at a high rate) runs once more, long enough, rather than
      // failing the search on a technicality; at most 4x --num-requests, said so. Not in --duration mode.
      const int64_t need = p.verdict.requests_to_judge;
      if (!p.verdict.pass && need > 0 && p.verdict.ttft_ok && p.verdict.success_ok && c_.num_requests > 0 &&
          c_.duration_s <= 0 && !stopping()) {
        const int64_t n = std::min(need, 4 * c_.num_requests);
        err_ << "mxserve bench: rate " << rate << ": " << c_.num_requests << " requests ended before the queue could "
             << "be judged (a request lives ~" << p.metrics.inflight.ramp_s << " s); running it again with " << n
             << " requests" << (n < need ? " (4x --num-requests; it needs " + std::to_string(need) + ")" : "")
             << "\n";
        MX_ASSIGN_OR_RETURN(p, run_point(rate, phase + "-extended", n));
      }
      return p.verdict;
    };
    Result<KneeResult> k = find_knee(kc, eval);
    if (k.is_ok()) {
      knee_ = std::move(k).value();
      has_knee_ = !interrupted_;
    } else if (!stopping()) {
      return k.status();
    }
  } else {
    for (double r : c_.rates) {
      if (stopping()) break;
      MX_RETURN_IF_ERROR(run_point(r, c_.rates.size() > 1 ? "sweep" : "single-rate").status());
    }
  }
  if (stopping()) {
    interrupted_ = true;
    err_ << "mxserve bench: interrupted: results cover the " << points_.size() << " point(s) that ran"
         << (c_.find_knee ? "; the knee search did not finish" : "") << "\n";
  }
  return write_outputs();
}

}  // namespace mxserve::bench
