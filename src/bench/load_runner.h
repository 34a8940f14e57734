// LoadRunner: drives one rate point: sends requests on schedule over HTTP and records timings.
// Owns: the single-threaded scheduling loop (arrivals or the closed loop, the client-side
// concurrency gate, the progress callback) over an HttpEngine (http_engine.h: a native epoll
// HTTP/1.1 client, or libcurl multi), whose waits use epoll_pwait2's nanosecond timeout for both
// the engine's timers and the next arrival.
// Does not own: what is sent (BodySource) or what the numbers mean (metrics.h).
// Invariant: a request is stamped sent_s immediately before the engine starts it; response bytes
// are stamped with the kernel's receive time (native engine) or when the engine reads them (curl).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/request_record.h"
#include "core/status.h"

namespace mxserve::bench {

struct HttpTarget {
  std::string url;                    // full endpoint URL
  std::vector<std::string> headers;   // extra "Name: value" headers (Authorization, ...)
  double request_timeout_s = 600;     // per request, from send; expiry counts as a failure
};

struct RequestSpec {
  std::string body;                   // JSON request body
  int64_t intended_input = -1;
  int64_t intended_output = 0;
  int group = -1;
  int64_t session = -1;               // trace workload: session instance
  int turn = -1;                      // trace workload: turn depth
  bool capture_text = false;          // keep the streamed text in the record (RequestRecord::output_text)
};

// A schedule whose requests depend on earlier completions (the trace workload's sessions: turn k+1
// is sent a think time after turn k finished, and carries its output). run_load() asks it for work
// and reports every finished request back to it.
class DynamicSchedule {
 public:
  virtual ~DynamicSchedule() = default;
  // Earliest run-clock time at which next() has a request; +inf: none until a request finishes.
  virtual double next_ready_s() const = 0;
  // True once no request will ever be issued again.
  virtual bool exhausted() const = 0;
  // The due request (only called when next_ready_s() <= now_s); *scheduled_s gets its due time.
  virtual Result<RequestSpec> next(double now_s, double* scheduled_s) = 0;
  // A request ended (ok or not); it may take the streamed text out of `rec`.
  virtual void on_finish(RequestRecord& rec) = 0;
};

struct LoadPlan {
  // Open loop: due offsets (seconds), one per request. Empty: closed loop.
  std::vector<double> offsets;
  // Open loop: 0 = no gate (pure open loop); >0 caps requests in flight (client queue time appears
  // as sent_s - scheduled_s). Closed loop: required, the number of requests kept in flight.
  int64_t max_concurrency = 0;
  int64_t num_requests = -1;          // closed loop: stop after this many (-1: only --duration)
  double duration_s = 0;              // closed loop: stop issuing after this (0: only num_requests)
  int64_t warmup = 0;                 // requests [0, warmup) are flagged warm-up
  // Set: requests come from this schedule (offsets, num_requests, duration_s and max_concurrency
  // are then unused; the schedule owns admission and stopping). Not owned.
  DynamicSchedule* dynamic = nullptr;
};

struct Progress {
  double elapsed_s = 0;
  int64_t sent = 0, done = 0, failed = 0, in_flight = 0;
  double ttft_p95_s = -1;             // over measured successful requests so far (-1: none yet)
};

struct RunResult {
  std::vector<RequestRecord> records; // ordered by index
  double wall_s = 0;                  // loop start to last completion
  std::vector<double> send_lag_s;     // open loop without a gate: sent_s - scheduled_s
  std::vector<double> probe_error_s;  // timing probe: client stamp - server send stamp
  std::vector<float> probe_time_s;    // timing probe: the client stamp of each sample
  std::vector<double> read_lag_s;     // timing probe, native engine: read time - kernel receive time
  int64_t max_in_flight = 0;
  bool stopped = false;               // RunOptions::stop ended the schedule early
};

using BodySource = std::function<Result<RequestSpec>(int64_t index)>;
using ProgressFn = std::function<void(const Progress&)>;

enum class HttpClientKind { kAuto, kNative, kCurl };  // auto: native for http://, curl for https://
Result<HttpClientKind> parse_http_client_kind(const std::string& name);

struct RunOptions {
  HttpClientKind http_client = HttpClientKind::kAuto;
  double progress_interval_s = 1.0;
  ProgressFn progress;                // may be empty
  bool timing_probe = false;          // read "mx_t" stamps from events (fake servers only)
  // When it turns true (e.g. from a SIGINT handler): issue nothing more, drain what is in flight.
  const std::atomic<bool>* stop = nullptr;
};

Result<RunResult> run_load(const HttpTarget& target, const LoadPlan& plan, const BodySource& source,
                           const RunOptions& options);

// Monotonic clock in ns (CLOCK_MONOTONIC; the fake servers stamp with the same clock).
int64_t monotonic_ns();

}  // namespace mxserve::bench
