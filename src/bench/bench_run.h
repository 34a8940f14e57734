// BenchRun: one `mxserve bench` invocation after flag parsing: resolves the model, builds the
// workload, runs every rate point (a single rate, a sweep, a closed loop, or the knee search),
// and writes the table, JSON and plots. Owns the request body format (chat / completions,
// stream + include_usage, max_tokens + ignore_eos) and the live progress line.
// Invariant: every rate point uses a distinct workload stream, so no two points repeat a prompt
// (shared-prefix points share only the group prefixes, by design).
#pragma once

#include <atomic>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_config.h"
#include "bench/corpus.h"
#include "bench/load_runner.h"
#include "bench/report.h"
#include "bench/token_codec.h"
#include "bench/trace_file.h"
#include "bench/trace_report.h"
#include "bench/workload.h"
#include "core/status.h"

namespace mxserve::bench {

class BenchRun {
 public:
  BenchRun(BenchConfig config, std::ostream& out, std::ostream& err)
      : c_(std::move(config)), out_(out), err_(err) {}
  // A flag that, once true, ends the run early: the current point drains, no further point
  // starts, and the table, JSON and plots cover what finished. (cmd_bench wires it to SIGINT.)
  void set_stop_flag(const std::atomic<bool>* stop) { stop_ = stop; }
  bool interrupted() const { return interrupted_; }
  Status run();
  // Results, for tests.
  const std::vector<PointResult>& points() const { return points_; }
  const KneeResult* knee() const { return has_knee_ ? &knee_ : nullptr; }
  const nlohmann::json& result() const { return result_; }
  // --workload trace: the replay's job metrics (null before a trace run).
  const TraceMetrics* trace_metrics() const { return trace_metrics_.get(); }

 private:
  Status prepare();
  // num_requests: measured requests of this point (-1: --num-requests).
  Result<PointResult> run_point(double rate, const std::string& phase, int64_t num_requests = -1);
  Result<RequestSpec> build_request(uint64_t stream, int64_t index) const;
  Status write_outputs();
  Status run_trace();  // --workload trace (bench_run_trace.cpp)

  BenchConfig c_;
  std::ostream& out_;
  std::ostream& err_;
  std::string model_;
  std::unique_ptr<TokenCodec> codec_;
  std::unique_ptr<TokenCorpus> corpus_;
  std::unique_ptr<Workload> workload_;
  nlohmann::json extra_body_;
  uint64_t next_stream_ = 0;
  std::vector<PointResult> points_;
  KneeResult knee_;
  bool has_knee_ = false;
  nlohmann::json result_;
  bool metrics_endpoint_missing_ = false;
  const std::atomic<bool>* stop_ = nullptr;
  bool interrupted_ = false;
  std::unique_ptr<Trace> trace_;
  std::unique_ptr<TraceMetrics> trace_metrics_;
};

// GET {base_url}/v1/models and return data[0].id.
Result<std::string> fetch_first_model(const std::string& base_url, const std::string& api_key);

}  // namespace mxserve::bench
