// RunTracker and Transfer: the bookkeeping one rate point shares between HTTP engines.
// Owns: the run clock, per-request Transfer state (record, body, SSE reader, error body), the
// success/failure classification of a finished request, counters for the progress line, and
// the timing-probe samples. Does not own sockets (see http_engine.h).
// Invariant: every started Transfer is finished exactly once, and its record then moves into the
// result; failures always carry a non-empty error string.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/load_runner.h"
#include "bench/openai_stream.h"

namespace mxserve::bench {

struct Transfer {
  RequestRecord rec;
  std::string body;
  std::string error_body;             // first bytes of a non-200 response
  std::unique_ptr<OpenAiStreamReader> reader;
  void* engine_state = nullptr;       // owned by the engine (curl handle, connection)
  // Response bytes arrived at `now_s`: 200 -> SSE reader, else kept for the error message.
  void on_body(const char* p, size_t n, double now_s);
};

// "timeout after 600 s": the error text of a request that ran out of --request-timeout.
std::string timeout_message(double timeout_s);

class RunTracker {
 public:
  RunTracker(const HttpTarget& target, const LoadPlan& plan, const RunOptions& options);
  double now_s() const;
  int64_t start_ns() const { return start_ns_; }
  std::unique_ptr<Transfer> make_transfer(int64_t index, double scheduled_s, RequestSpec spec);
  // Stamps sent_s; call immediately before the engine starts the request.
  void mark_sent(Transfer& t);
  // transport_error: "" when the HTTP exchange completed; else "timeout ..." / "transport: ...".
  void finish(std::unique_ptr<Transfer> t, const std::string& transport_error);
  void report_progress(double now, int64_t in_flight);
  // Engines with kernel receive timestamps: how long received bytes waited for the loop.
  void note_read_lag(double lag_s) {
    if (opt_.timing_probe) result_.read_lag_s.push_back(lag_s);
  }
  void note_in_flight(int64_t n) { result_.max_in_flight = std::max(result_.max_in_flight, n); }
  double last_completion_s() const { return last_completion_s_; }
  RunResult take_result();
  const HttpTarget& target() const { return target_; }

 private:
  static void probe_cb(void* ctx, int64_t server_ns, double client_now_s);
  const HttpTarget& target_;
  const LoadPlan& plan_;
  const RunOptions& opt_;
  int64_t start_ns_ = 0;
  RunResult result_;
  int64_t sent_ = 0, done_ = 0, failed_ = 0;
  std::vector<double> ttfts_;
  double last_completion_s_ = 0;
};

}  // namespace mxserve::bench
