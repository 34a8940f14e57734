// The device-memory budget of a launched model at start-up, before its KV pool exists (vLLM's profile run):
// a dry run of the largest step the scheduler can make measures every rank's activation peak (its caching
// allocator's high-water mark above the weights), then the KV budget is what is left of
// device total x --gpu-memory-utilization, split among the ranks that share the device (the one-GPU stand-in:
// eight ranks on one card). The split is logged per device; a layout whose weights + peak (+ the requested
// KV) do not fit is refused here, naming the flag to change, instead of failing a forward later.
// CPU ranks have no device memory: nothing is measured and the requested KV bytes are returned unchanged.
// The dry run's shape (dry_run_shape, a pure function): steps of the most rows a serving step can hold -- a
// full prefill chunk plus the decode / MTP-verify rows of every running sequence, within
// --max-num-batched-tokens -- and prompts of two such chunks per DP group, so that one measured chunk attends
// over the KV of an earlier one (the prefix-cache-hit shape); then --max-num-seqs short requests decoding together
// (min(max_num_seqs, step_rows / (1 + k)) sequences: verify steps whose every row has vocabulary-wide logits,
// gathered on every rank). Each measured run's peak is taken above what was in use before it, less its own KV pool
// (the other ranks' mirrors of it are freed after each run). Under DP attention every rank's MoE exchange
// gathers the step's rows of every DP group: the scheduler's budgets count all groups' rows together, so the
// dry run's steps reach that exchange at its largest. MTP draft and verify forwards run as serving runs them,
// and the MXFP4 prefill-dequant workspace (when switched on) is allocated inside the measured forward. On a GPU
// shared by several ranks (the one-GPU stand-in), each rank's caching allocator keeps exact-size blocks of the
// shapes it saw; an allocation that does not fit releases the cached blocks of every allocator on the device
// (kernels/cuda/common/caching_allocator.h), so the sum of the measured peaks is what the ranks need together.
// CUDA graphs are captured after the KV pool: their private pools (decode-sized temporaries) and the driver's
// instantiation memory come out of the device's share above --gpu-memory-utilization. Neither takes the cached
// blocks, which are the activation reserve measured here: a graph pool's allocation that does not fit fails
// (kernels/cuda/common/caching_allocator.h), and so does an instantiation that would leave the device under its
// floor (backend/graph_memory_floor.h); the graphs captured so far are kept, or the graphs are off and their pools
// freed (runtime/decode_graphs.h "Capture order"; backend/cuda_backend.cpp says what taking the reserve did).
#pragma once

#include <cstdint>
#include <vector>

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
  int64_t max_num_seqs = 0;               // --max-num-seqs: decode / verify rows riding along a chunk (0: none)
  uint64_t kv_bytes_per_rank = 0;         // --kv-cache-memory (per rank)
  bool kv_bytes_given = false;            // the user named --kv-cache-memory: check it, never resize it
  double gpu_memory_utilization = 0.9;    // the share of each device for weights + activations + KV
  bool utilization_given = false;         // size the KV from the utilization (without --kv-cache-memory): named, or the
                                          // serve default on CUDA (cli/kv_pool_flags.h)
};

struct KvBudget {
  uint64_t kv_bytes_per_rank = 0;      // what the KV pool of each rank gets
  uint64_t peak_activation_bytes = 0;  // the largest rank's measured forward peak (0: not measured, CPU)
  std::vector<uint64_t> peak_activation_per_rank;  // each rank's (empty: not measured); the serving steps'
                                                   // check against it: runtime/activation_watch.h
  int64_t profiled_tokens = 0;         // tokens per DP group in the dry run
};

// The dry run's step rows and prompt tokens per DP group (see the header comment).
struct DryRunShape {
  int64_t step_rows = 1;      // the largest step: min(max_num_batched_tokens, chunk + max_num_seqs x (1 + k))
  int64_t prompt_tokens = 1;  // per DP group: two steps' worth, within max_model_len
  int64_t extra_rows = 0;     // step_rows beyond the prefill chunk (the riding decode / verify rows)
};
DryRunShape dry_run_shape(const KvBudgetRequest& request);

Result<KvBudget> plan_kv_budget(LaunchedModel& lm, const KvBudgetRequest& request);

}  // namespace mxserve::launch
