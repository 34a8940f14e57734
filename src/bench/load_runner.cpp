// LoadRunner scheduling loop (see load_runner.h); transports live in http_engine.h.
// NOTE: one thread on purpose: with 2 cores shared with the server under test, a second client
// thread only adds wake-up jitter to the timestamps.
#include "bench/load_runner.h"

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "bench/http_engine.h"
#include "bench/run_tracker.h"

namespace mxserve::bench {

int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

Result<HttpClientKind> parse_http_client_kind(const std::string& name) {
  if (name == "auto") return HttpClientKind::kAuto;
  if (name == "native") return HttpClientKind::kNative;
  if (name == "curl") return HttpClientKind::kCurl;
  return invalid_argument("--http-client " + name + ": expected auto, native or curl");
}

namespace {

void raise_fd_limit() {
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

}  // namespace

Result<RunResult> run_load(const HttpTarget& target, const LoadPlan& plan, const BodySource& source,
                           const RunOptions& opt) {
  DynamicSchedule* const dynamic = plan.dynamic;
  const bool open_loop = !plan.offsets.empty() && !dynamic;
  if (!open_loop && !dynamic && plan.max_concurrency <= 0) return invalid_argument("closed loop needs --max-concurrency > 0");
  if (!open_loop && !dynamic && plan.num_requests < 0 && plan.duration_s <= 0)
    return invalid_argument("closed loop needs --num-requests or --duration");
  const bool https = target.url.rfind("https://", 0) == 0;
  if (https && opt.http_client == HttpClientKind::kNative)
    return invalid_argument("--http-client native speaks plain http only; use curl (or auto) for " + target.url);
  raise_fd_limit();
  RunTracker tracker(target, plan, opt);
  std::unique_ptr<HttpEngine> engine;
  if (https || opt.http_client == HttpClientKind::kCurl) {
    MX_ASSIGN_OR_RETURN(engine, make_curl_engine(tracker));
  } else {
    MX_ASSIGN_OR_RETURN(engine, make_native_engine(tracker));
  }
  const int64_t n_open = static_cast<int64_t>(plan.offsets.size());
  int64_t next = 0;
  double next_progress = opt.progress_interval_s;
  auto can_issue = [&] { return plan.max_concurrency == 0 || engine->in_flight() < plan.max_concurrency; };
  auto issue = [&](int64_t i, double scheduled) -> Status {
    RequestSpec spec;
    if (dynamic) {
      MX_ASSIGN_OR_RETURN(spec, dynamic->next(tracker.now_s(), &scheduled));
    } else {
      MX_ASSIGN_OR_RETURN(spec, source(i));
    }
    std::unique_ptr<Transfer> t = tracker.make_transfer(i, scheduled, std::move(spec));
    tracker.mark_sent(*t);
    MX_RETURN_IF_ERROR(engine->start(std::move(t)));
    tracker.note_in_flight(engine->in_flight());
    return Status::ok();
  };
  bool stopped = false;
  while (true) {
    double now = tracker.now_s();
    stopped = stopped || (opt.stop && opt.stop->load());
    if (stopped) {
      // issue nothing more; in-flight requests drain below
    } else if (dynamic) {
      while (dynamic->next_ready_s() <= now) {
        MX_RETURN_IF_ERROR(issue(next, 0));
        ++next;
      }
    } else if (open_loop) {
      while (next < n_open && plan.offsets[next] <= now && can_issue()) {
        MX_RETURN_IF_ERROR(issue(next, plan.offsets[next]));
        ++next;
      }
    } else {
      while (can_issue() && (plan.num_requests < 0 || next < plan.num_requests) &&
             (plan.duration_s <= 0 || now < plan.duration_s)) {
        MX_RETURN_IF_ERROR(issue(next, now));
        ++next;
      }
    }
    now = tracker.now_s();
    const bool all_issued = stopped || (dynamic ? dynamic->exhausted() : open_loop ? next >= n_open
                                                  : ((plan.num_requests >= 0 && next >= plan.num_requests) ||
                                                     (plan.duration_s > 0 && now >= plan.duration_s)));
    if (all_issued && engine->in_flight() == 0) break;
    if (dynamic && !all_issued && engine->in_flight() == 0 && std::isinf(dynamic->next_ready_s()))
      return internal_error("trace schedule stalled: nothing in flight and no request due");
    if (now >= next_progress) {
      tracker.report_progress(now, engine->in_flight());
      next_progress = now + opt.progress_interval_s;
    }
    double deadline = std::min(engine->next_deadline(), next_progress);
    if (open_loop && next < n_open && can_issue()) deadline = std::min(deadline, plan.offsets[next]);
    if (dynamic && !all_issued) deadline = std::min(deadline, dynamic->next_ready_s());
    if (!open_loop && !all_issued && plan.duration_s > 0) deadline = std::min(deadline, plan.duration_s);
    MX_RETURN_IF_ERROR(engine->wait(deadline - now));
  }
  tracker.report_progress(tracker.now_s(), 0);
  RunResult result = tracker.take_result();
  result.stopped = stopped;
  return result;
}

}  // namespace mxserve::bench
