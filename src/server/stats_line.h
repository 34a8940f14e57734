// StatsLine: the periodic engine log line (vLLM-style): prompt and generation throughput since the last
// line, running / waiting requests, KV usage, prefix-cache hit rate. Silent while nothing happens.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "runtime/engine.h"
#include "server/metrics.h"

namespace mxserve::server {

class StatsLine {
 public:
  // The line to log now, or nullopt when the engine was idle since the last call.
  std::optional<std::string> update(const runtime::EngineStats& s, const Metrics& m);

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  int64_t prompt_ = 0, generated_ = 0, queries_ = 0, hits_ = 0, steps_ = 0, drafts_ = 0, accepted_ = 0;
};

}  // namespace mxserve::server
