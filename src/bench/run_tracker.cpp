// RunTracker (see run_tracker.h).
#include "bench/run_tracker.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace mxserve::bench {

constexpr size_t kMaxErrorBody = 512;

std::string timeout_message(double timeout_s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "timeout after %g s", timeout_s);
  return buf;
}

void Transfer::on_body(const char* p, size_t n, double now_s) {
  if (rec.http_status == 200) {
    reader->feed(p, n, now_s);
  } else if (error_body.size() < kMaxErrorBody) {
    error_body.append(p, std::min(n, kMaxErrorBody - error_body.size()));
  }
}

RunTracker::RunTracker(const HttpTarget& target, const LoadPlan& plan, const RunOptions& options)
    : target_(target), plan_(plan), opt_(options), start_ns_(monotonic_ns()) {}

double RunTracker::now_s() const { return static_cast<double>(monotonic_ns() - start_ns_) * 1e-9; }

void RunTracker::probe_cb(void* ctx, int64_t server_ns, double client_now_s) {
  auto* self = static_cast<RunTracker*>(ctx);
  self->result_.probe_error_s.push_back(client_now_s - static_cast<double>(server_ns - self->start_ns_) * 1e-9);
  self->result_.probe_time_s.push_back(static_cast<float>(client_now_s));
}

std::unique_ptr<Transfer> RunTracker::make_transfer(int64_t index, double scheduled_s, RequestSpec spec) {
  auto t = std::make_unique<Transfer>();
  t->body = std::move(spec.body);
  t->rec.index = index;
  t->rec.warmup = index < plan_.warmup;
  t->rec.group = spec.group;
  t->rec.session = spec.session;
  t->rec.turn = spec.turn;
  t->rec.capture_text = spec.capture_text;
  t->rec.intended_input = spec.intended_input;
  t->rec.intended_output = spec.intended_output;
  t->rec.scheduled_s = scheduled_s;
  t->reader = std::make_unique<OpenAiStreamReader>(&t->rec);
  if (opt_.timing_probe) t->reader->set_probe(&RunTracker::probe_cb, this);
  return t;
}

void RunTracker::mark_sent(Transfer& t) {
  t.rec.sent_s = now_s();
  if (!plan_.offsets.empty() && plan_.max_concurrency == 0) result_.send_lag_s.push_back(t.rec.sent_s - t.rec.scheduled_s);
  ++sent_;
}

void RunTracker::finish(std::unique_ptr<Transfer> t, const std::string& transport_error) {
  RequestRecord& r = t->rec;
  r.end_s = now_s();
  if (!transport_error.empty()) {
    r.error = transport_error;
  } else if (r.http_status != 200) {
    r.error = "http " + std::to_string(r.http_status) + ": " + t->error_body.substr(0, 200);
  } else if (r.error.empty() && r.token_chunks == 0) {
    r.error = "no tokens in response";
  }
  r.ok = r.error.empty();
  ++done_;
  if (!r.ok) ++failed_;
  if (r.ok && !r.warmup) ttfts_.push_back(r.ttft());
  last_completion_s_ = r.end_s;
  if (plan_.dynamic) plan_.dynamic->on_finish(r);
  result_.records.push_back(std::move(r));
}

void RunTracker::report_progress(double now, int64_t in_flight) {
  if (!opt_.progress) return;
  Progress p;
  p.elapsed_s = now;
  p.sent = sent_;
  p.done = done_;
  p.failed = failed_;
  p.in_flight = in_flight;
  if (!ttfts_.empty()) {
    std::vector<double> v = ttfts_;
    const size_t k = static_cast<size_t>(std::ceil(0.95 * static_cast<double>(v.size()))) - 1;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    p.ttft_p95_s = v[k];
  }
  opt_.progress(p);
}

RunResult RunTracker::take_result() {
  result_.wall_s = last_completion_s_;
  std::sort(result_.records.begin(), result_.records.end(),
            [](const RequestRecord& a, const RequestRecord& b) { return a.index < b.index; });
  return std::move(result_);
}

}  // namespace mxserve::bench
