// ServingSim: the serving engine's scheduling in virtual time -- the real Scheduler (budgets, ITL bound, TTFT
// target, prefix cache, preemption) fed a workload's arrivals, each step taking what a fixed step-cost model
// predicts for its shape (runtime/step_cost_model.h). It answers "where is the knee, and what limits it" for a
// measured cost model before a GPU run: `mxserve simulate` (docs/scheduling.md "Simulating the knee").
// Not a speed: its times are the cost model's. Its oracle: tests/unit/runtime/test_serving_sim.cpp (closed
// forms for one request and for back-to-back decodes, and the queue growing past the service rate).
// Workload: the shared-prefix shape of `mxserve bench --workload shared-prefix`: request i belongs to prefix
// group i % groups, its prompt is that group's prefix (cache_hit_rate x input_len tokens) then its own tokens;
// constant arrivals at `rate` req/s; every request generates output_len tokens (no EOS).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/scheduler.h"
#include "runtime/step_cost_model.h"

namespace mxserve::runtime {

struct SimWorkload {
  int64_t input_len = 20000;
  int64_t output_len = 1000;
  double cache_hit_rate = 0.6;  // the shared prefix's share of each prompt
  int64_t prefix_groups = 4;
  double rate = 0.2;            // requests per second, constant arrivals
  int64_t num_requests = 30;    // measured (after the warm-up)
  int64_t warmup = 4;           // requests sent first and left out of the statistics (one per group fills its prefix)
};

struct SimConfig {
  SchedulerConfig scheduler;
  int64_t kv_blocks = 20000;    // the KV pool
  StepCostCoefficients cost;    // seconds a step takes: base + per feature (the fixed model)
};

struct SimRequestRecord {
  double arrival = 0, first_token = 0, finish = 0;  // virtual seconds
  int64_t cached_tokens = 0;
  int32_t preemptions = 0;
};

struct SimResult {
  std::vector<SimRequestRecord> requests;  // measured ones only, in arrival order (percentiles: the caller's rule)
  double tpot_mean = 0;         // (finish - first token) / (output_len - 1), mean over requests
  double itl_max = 0;           // longest step a running decode waited through
  double sustained_rate = 0;    // measured requests / (last finish - first measured arrival), as the bench's throughput
  double prefill_share = 0;     // of all step time, the share predicted for prefill tokens and pairs
  int64_t max_running = 0, max_waiting = 0, preemptions = 0, steps = 0;
  int64_t past_itl_chunks = 0;  // TTFT over ITL: prefill chunks that took a step past the ITL bound
  double max_step = 0;          // longest step (seconds)
  double cached_share = 0;      // prompt tokens served from the prefix cache (measured requests)
  bool completed = false;       // every request finished within the step limit
};

// Runs the workload to completion (at most max_steps steps). Refuses shapes the pool cannot hold, naming them.
Result<SimResult> simulate_serving(const SimConfig& config, const SimWorkload& workload, int64_t max_steps = 5000000);

}  // namespace mxserve::runtime
