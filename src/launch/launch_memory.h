// The device-memory budget of a launched model at start-up, before its KV pool exists (vLLM's profile run):
// a dry run of the largest step the scheduler can make measures every rank's activation peak (its caching
// allocator's high-water mark above the weights), then the KV budget is what is left of
// device total x --gpu-memory-utilization, split among the ranks that share the device (the one-GPU stand-in:
// eight ranks on one card). The split is logged per device; a layout whose weights + peak (+ the requested
// KV) do not fit is refused here, naming the flag to change, instead of failing a forward later.
// CPU ranks have no device memory: nothing is measured and the requested KV bytes are returned unchanged.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "launch/launch.h"
#include "runtime/spec/speculative.h"

namespace mxserve::launch {

struct KvBudgetRequest {
  int64_t block_size = 16;
  int64_t max_num_batched_tokens = 2048;  // the dry run's step: min(this, chunked_prefill_size) per DP group
  int64_t chunked_prefill_size = 2048;
  int64_t max_model_len = 0;              // 0: no cap on the dry run's prompt beyond the model's
  runtime::SpecConfig spec;               // the dry run drafts as serving will (MTP forwards measured too)
  uint64_t kv_bytes_per_rank = 0;         // --kv-cache-memory (per rank)
  bool kv_bytes_given = false;            // the user named --kv-cache-memory: check it, never resize it
  double gpu_memory_utilization = 0.9;    // the share of each device for weights + activations + KV
  bool utilization_given = false;         // --gpu-memory-utilization named (without --kv-cache-memory: size the KV from it)
};

struct KvBudget {
  uint64_t kv_bytes_per_rank = 0;      // what the KV pool of each rank gets
  uint64_t peak_activation_bytes = 0;  // the largest rank's measured forward peak (0: not measured, CPU)
  int64_t profiled_tokens = 0;         // tokens per DP group in the dry run
};

Result<KvBudget> plan_kv_budget(LaunchedModel& lm, const KvBudgetRequest& request);

}  // namespace mxserve::launch
