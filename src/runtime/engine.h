// Engine: the serving loop. Requests arrive through a thread-safe queue; each step the scheduler builds
// one batch (decodes + prefill chunks), the executor runs it, the sampler picks tokens, and events go
// back through each request's callback (called on the engine thread). Finished or aborted requests
// release their blocks. step() can be driven directly (deterministic tests) or by start()'s thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kvcache/block_pool.h"
#include "runtime/executor.h"
#include "runtime/scheduler.h"
#include "runtime/spec/speculative.h"

namespace mxserve::runtime {

struct EngineConfig {
  SchedulerConfig scheduler;
  int64_t n_blocks = 0;             // KV pool size
  int64_t max_model_len = 4096;     // prompt + max_tokens limit
  int64_t max_waiting = 1024;       // bounded waiting queue: beyond it submit() returns kUnavailable
  std::vector<int64_t> eos_token_ids;
  SpecConfig spec;                  // MTP speculative decoding (num_steps 0 = off)
};

struct SpecStats {  // names after vLLM's spec_decode_* metrics
  int64_t num_drafts = 0;           // verify steps that carried drafts
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> accepted_per_pos;  // [N]: drafts accepted at position i + 1 (tree mode: at depth i + 1)
  double acceptance_rate = 0;       // the adaptive policy's current estimate (accepted / drafted EMA)
  int32_t current_steps = 0;        // N chosen for the latest step
  double expected_accepted = 0;     // the policy's E[accepted drafts per step | current N]
  double estimated_gain = 1;        // estimated decode throughput at current N over N = 0 (1: unmeasured)
};

struct EngineStats {
  int64_t waiting = 0;
  int64_t running = 0;
  int64_t blocks_total = 0;
  int64_t blocks_free = 0;
  int64_t blocks_cached = 0;  // held only by the prefix cache (evictable)
  int64_t steps = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t finished = 0;
  int64_t aborted = 0;
  SchedulerCounters scheduler;
  SpecStats spec;
  // Structured output: token masks computed, their summed compute time, and the part of it the engine
  // thread waited for after the forward (not hidden behind it).
  int64_t grammar_masks = 0;
  double grammar_mask_seconds = 0;
  double grammar_wait_seconds = 0;
};

// The usage block of a request's final event.
Usage usage_of(const Sequence& seq);

class Engine {
 public:
  Engine(const EngineConfig& config, std::unique_ptr<ModelExecutor> executor);
  ~Engine();

  // Validates and queues a request. Errors: kInvalidArgument (too long, bad ids/params, can never fit
  // in the KV cache), kUnavailable (waiting queue full). Thread-safe.
  Result<RequestId> submit(RequestSpec spec, EventCallback on_event);
  // Aborts a request at any stage; it gets a final event with FinishReason::kAbort. Thread-safe.
  void abort(RequestId id);

  // Runs one scheduling step. Returns false when there was nothing to do.
  bool step();
  void start();  // background loop thread
  void stop();
  bool idle() const;

  EngineStats stats() const;
  // Engine-thread only (tests): every block's reference count equals the number of sequences holding it
  // plus one if the prefix cache holds it; running sequences' tables cover their computed tokens.
  Status check_invariants() const;
  const EngineConfig& config() const { return config_; }

 private:
  void drain_inbox();
  void finish(Sequence* seq, FinishReason reason, const std::string& error = "");
  Status run_plan(const SchedulePlan& plan);
  // Emits one generated token; returns true when the request is finished by it.
  bool emit_token(Sequence* seq, int32_t token, float logprob, std::vector<TopLogprob> top);
  bool end_unconstrainable(Sequence* seq);  // structured output: nothing allowed next (engine_step.cpp)
  // Speculative decoding: MTP over the rows the target just computed, then N-1 draft steps.
  struct MtpRows {
    Sequence* seq;
    int32_t first_pos;   // positions [first_pos, last_pos] (target rows just computed)
    int32_t last_pos;
    int32_t first_row;   // row of first_pos in the target batch (hidden states)
    std::vector<int32_t> rows;  // tree verify: explicit hidden row per position (the accepted path)
  };
  Status extend_and_draft(const std::vector<MtpRows>& all_rows, const Tensor& target_hidden);
  // Tree mode (engine_spec.cpp): the MTP steps 2..n_steps expanding the best topk frontier nodes of each
  // sequence; root_rows[i] is sequence i's logit row in `out` (the extend) proposing the depth-1 children,
  // root_hidden[i] its row in out.hidden.
  Status draft_tree(const std::vector<Sequence*>& seqs, const std::vector<int32_t>& root_rows,
                    const std::vector<int32_t>& root_hidden, const ExecOutput& out, int32_t n_steps);
  bool spec_enabled() const { return config_.spec.num_steps > 0; }

  EngineConfig config_;
  std::unique_ptr<ModelExecutor> executor_;
  kvcache::BlockPool pool_;
  Scheduler scheduler_;
  std::unordered_map<RequestId, std::unique_ptr<Sequence>> seqs_;  // engine thread only

  mutable std::mutex inbox_mutex_;
  std::condition_variable inbox_cv_;
  std::vector<std::unique_ptr<Sequence>> inbox_;
  std::vector<RequestId> abort_inbox_;
  std::atomic<int64_t> n_pending_{0};  // submitted, not yet finished (for the waiting-queue bound)
  RequestId next_id_ = 1;
  uint64_t next_order_ = 0;

  mutable std::mutex stats_mutex_;
  EngineStats stats_;

  SpecPolicy spec_policy_;
  int32_t spec_last_n_ = -1;
  double spec_extend_seconds_ = 0;  // this step's timed MTP extend at N = 0 (see SpecPolicy::record_step)  // N the latest draft stage chose (verified by the next step)

  std::thread loop_;
  std::atomic<bool> stop_{false};
};

}  // namespace mxserve::runtime
