// TraceMetrics: what an agent trace replay measured, from its RequestRecords (pure; no I/O), and
// its text block and JSON. Definitions (docs/bench.md restates them):
//  - a job is a session instance; it completed when every one of its turns succeeded;
//  - duration = last completion - first send (as RateMetrics); jobs per hour = completed * 3600 / duration;
//  - total token throughput = (prompt + output tokens) / duration over successful turns;
//    computed token throughput = (prompt - cached + output) / duration, cached = the server's
//    usage.prompt_tokens_details.cached_tokens (a turn without it counts all its prompt as computed);
//  - turn depth d = the turn's index in its session, from 0; TTFT per depth covers successful turns;
//  - session duration = the last turn's end - the first turn's send, completed jobs only.
// Invariant: every field is a deterministic function of the records and the per-instance turn counts.
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/metrics.h"
#include "bench/request_record.h"

namespace mxserve::bench {

struct DepthMetrics {
  int depth = 0;
  int64_t sent = 0, completed = 0;
  Dist ttft;
  double mean_prompt_tokens = 0;      // usage.prompt_tokens (or the client count) over successful turns
  double mean_cached_tokens = -1;     // over turns that reported cached_tokens (-1: none did)
};

struct TraceMetrics {
  int64_t sessions_planned = 0, sessions_started = 0, sessions_completed = 0, sessions_failed = 0;
  int64_t sessions_unfinished = 0;    // started, no failed turn, not all turns sent (interrupted)
  double duration_s = 0;
  double jobs_per_hour = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, output_tokens = 0;
  double total_tps = 0, computed_tps = 0, prefill_computed_tps = 0;
  double cached_fraction = -1;        // cached / prompt over turns that reported it (-1: none)
  Dist session_duration;              // seconds, completed jobs
  std::vector<DepthMetrics> depths;   // index = depth
};

TraceMetrics compute_trace_metrics(const std::vector<RequestRecord>& records,
                                   const std::vector<int64_t>& turns_per_instance);

void print_trace_block(std::ostream& os, const TraceMetrics& m);
nlohmann::json trace_metrics_to_json(const TraceMetrics& m);

}  // namespace mxserve::bench
