// Engine: the serving loop. Requests arrive through a thread-safe queue; each step the scheduler builds
// one batch (decodes + prefill chunks), the executor runs it, the sampler picks tokens (or, with
// speculative decoding, the verifier judges the drafts and the drafter proposes the next ones: spec/), and
// events go back through each request's callback (called on the engine thread). Finished or aborted
// requests release their blocks. step() can be driven directly (deterministic tests) or by start()'s thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kvcache/block_pool.h"
#include "kvcache/host_tier.h"
#include "runtime/constrained_decoding.h"
#include "runtime/executor.h"
#include "runtime/scheduler.h"
#include "runtime/spec/drafter.h"
#include "runtime/spec/speculative.h"
#include "runtime/spec/verifier.h"
#include "runtime/step_log.h"

namespace mxserve::runtime {

struct EngineConfig {
  SchedulerConfig scheduler;
  int64_t n_blocks = 0;             // KV pool size
  int64_t max_model_len = 4096;     // prompt + max_tokens limit
  int64_t max_waiting = 1024;       // bounded waiting queue: beyond it submit() returns kUnavailable
  int32_t max_logprobs = 20;        // SamplingParams::logprobs above this: kInvalidArgument (--max-logprobs)
  std::vector<int64_t> eos_token_ids;
  SpecConfig spec;                  // MTP speculative decoding (num_steps 0 = off)
  bool cuda_graphs = false;         // replay CUDA graphs for pure-decode steps (on by default on CUDA; --disable-cuda-graph / --enforce-eager)
  // Sampled rows without a constraint or drafts are sampled on the device (ModelExecutor::sample); false:
  // every such row takes host logits and the host sampler (the reference path, for A/B tests).
  bool device_sampling = true;
  // Host-memory KV tier (--kv-cache-host-memory, kvcache/host_tier.h): bytes of host memory for prefix blocks
  // evicted from the device pool; 0 = off. Needs the prefix cache and one DP rank.
  uint64_t kv_cache_host_memory = 0;
  // --step-log: one record per successful step (runtime/step_log.h); null = off. Written on the engine thread.
  std::shared_ptr<StepLogWriter> step_log;
};

struct SpecStats {  // names after vLLM's spec_decode_* metrics
  int64_t num_drafts = 0;           // verify steps that carried drafts
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> accepted_per_pos;  // [N]: drafts accepted at position i + 1 (tree mode: at depth i + 1)
  double acceptance_rate = 0;       // the adaptive policy's current estimate (accepted / drafted EMA)
  int32_t current_steps = 0;        // N chosen for the latest step
  double expected_accepted = 0;     // the policy's E[accepted drafts per step | current N]
  double estimated_gain = 1;        // est. decode throughput, best measured N over N = 0 (1: unmeasured)
};

struct StepCostStats {  // the ITL policy's step cost model (step_cost_model.h, docs/scheduling.md)
  bool ready = false;
  int64_t samples = 0;                 // steps observed
  StepCostCoefficients coefficients;   // seconds per unit of each feature
  double mean_relative_error = 0;      // of the current fit over the samples it holds
  double target_seconds = 0;           // --max-itl-ms (0: off)
  double last_step_seconds = 0;        // measured (schedule + forward + sampling)
  double last_predicted_seconds = 0;   // the model's prediction for the latest ITL-limited step
  int64_t itl_limited_steps = 0;       // steps whose prefill the target bounded
  int64_t over_target_steps = 0;       // ... in which the decodes alone were predicted over the target
};

// Upper bounds of the tokens-per-step histogram (EngineStats::iteration_tokens, vllm:iteration_tokens_total).
inline constexpr int64_t kIterationTokenBuckets[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
inline constexpr size_t kNumIterationTokenBuckets = sizeof(kIterationTokenBuckets) / sizeof(int64_t);

struct IterationTokens {  // a histogram over steps of prompt + generated tokens per step
  std::vector<int64_t> counts = std::vector<int64_t>(kNumIterationTokenBuckets + 1, 0);  // per bucket; last: +Inf
  int64_t sum = 0;
  int64_t steps = 0;
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
  // Host KV tier (kv_cache_host_memory > 0): its slots, those in use, and its copy counters.
  int64_t host_blocks_total = 0;
  int64_t host_blocks_used = 0;
  kvcache::HostTierCounters host_tier;
  SpecStats spec;
  StepCostStats step_cost;
  // Structured output: token masks computed, their summed compute time, and the part of it the engine
  // thread waited for after the forward (not hidden behind it).
  int64_t grammar_masks = 0;
  double grammar_mask_seconds = 0;
  double grammar_wait_seconds = 0;
  IterationTokens iteration_tokens;  // prompt tokens computed + tokens generated, per step
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
  // Aborts a request at any stage; it gets a final event with FinishReason::kAbort (on the engine thread, at its
  // next step). It stops counting against the waiting-queue bound at once. Thread-safe.
  void abort(RequestId id);

  // Runs one scheduling step. Returns false when there was nothing to do.
  bool step();
  void start();  // background loop thread
  void stop();
  bool idle() const;

  EngineStats stats() const;
  // Tests: the clock (seconds) that times steps for the cost model; default: steady_clock.
  void set_step_clock(std::function<double()> now_seconds) { step_clock_ = std::move(now_seconds); }
  // Engine-thread only (tests): every block's reference count equals the number of sequences holding it
  // plus one if the prefix cache holds it; running sequences' tables cover their computed tokens.
  Status check_invariants() const;
  // Engine-thread only (self-test, tests): evicts every prefix-cache block no request holds -- to the host
  // KV tier when it is on. Returns the blocks evicted.
  int64_t evict_prefix_cache();
  const EngineConfig& config() const { return config_; }
  int64_t vocab_size() const;  // the model's (submit refuses prompt tokens outside [0, vocab_size))

 private:
  void drain_inbox();
  void enable_host_tier();  // kv_cache_host_memory > 0 (constructor)
  void finish(Sequence* seq, FinishReason reason, const std::string& error = "");
  // One step (engine_step.cpp): the target's forward, then per chunk a sampled token or a verification.
  Status run_plan(const SchedulePlan& plan);
  struct StepOutcome {
    int64_t generated = 0;
    int64_t n_decode = 0;  // chunks that produced tokens
    std::vector<Sequence*> finished;
    std::vector<std::pair<Sequence*, std::string>> failed;  // e.g. NaN logits: that request ends with an error
    std::vector<MtpRows> mtp_rows;                          // what the draft stage extends over
    std::vector<int32_t> compact_src, compact_dst;          // tree paths' KV slots to compact, in order
    SpecStats spec;
    MaskJobs* masks = nullptr;                 // structured output: this step's masks (constrained samples)
    std::vector<const Sequence*> masked_seqs;  // whose mask is masks->get(i)
    std::vector<const Sequence*> device_seqs;      // rows sampled on the device, in order
    std::vector<kernels::SampledRow> device_rows;  // their results (ModelExecutor::sample)
  };
  // Each returns whether the request finished (an error ends only that request).
  Result<bool> sample_chunk(const ScheduledChunk& c, ExecOutput& out, int64_t logit_row, StepOutcome* step);
  Result<bool> verify_chunk(const ScheduledChunk& c, const ExecOutput& out, int64_t logit_row, StepOutcome* step,
                            std::vector<int32_t>* path);
  Result<Verdict> verify_under_constraint(const ScheduledChunk& c, const TargetRows& target, int64_t logit_row);
  MtpRows mtp_rows_of(const ScheduledChunk& c, int32_t row, const std::vector<int32_t>& path) const;
  void publish_step_stats(const SchedulePlan& plan, const StepOutcome& step);
  // Feeds a measured step to the cost model; logs the fit periodically and an unreachable target loudly.
  void record_step_cost(const SchedulePlan& plan, const StepShape& shape, double seconds);
  // --step-log: the step's record, with the cost model's prediction from before record_step_cost observes it.
  void log_step(const SchedulePlan& plan, const StepShape& shape, double t0, double seconds, bool graph);
  double now_seconds() const;
  // Emits one generated token; returns true when the request is finished by it.
  bool emit_token(Sequence* seq, int32_t token, float logprob, std::vector<TopLogprob> top);
  bool end_unconstrainable(Sequence* seq);  // structured output: nothing allowed next (engine_step.cpp)
  // Prompt logprobs of a prefill chunk (wants_prompt_logprobs) from its logit rows, before any is processed.
  void collect_prompt_logprobs(const ScheduledChunk& c, const ExecOutput& out, int64_t logit_row);
  bool spec_enabled() const { return config_.spec.num_steps > 0; }

  EngineConfig config_;
  std::unique_ptr<ModelExecutor> executor_;
  kvcache::BlockPool pool_;
  Scheduler scheduler_;
  std::unique_ptr<kvcache::HostTier> host_tier_;  // --kv-cache-host-memory (null: off)
  std::unordered_map<RequestId, std::unique_ptr<Sequence>> seqs_;  // engine thread only

  mutable std::mutex inbox_mutex_;
  std::condition_variable inbox_cv_;
  std::vector<std::unique_ptr<Sequence>> inbox_;
  std::vector<RequestId> abort_inbox_;
  // The waiting-queue bound (engine_admission.cpp), exact under bursts and counting only live requests. The
  // engine thread publishes, after each schedule and after each step's work, the scheduler's waiting and
  // running counts and which phase each request is in; submit() admits while
  //   live inbox + live waiting < max_waiting + free slots,
  // free slots = max_running - live running, 0 while anything live waits. abort() marks its request dropped at
  // once (a client that hung up stops counting before the engine thread runs again: issue 31). Arrivals
  // leaving inbox_ take free slots first and count as waiting beyond them, so the counts are never stale in the
  // unsafe direction. Guarded by inbox_mutex_.
  struct Admission {
    enum class Phase : uint8_t { kInbox, kWaiting, kRunning } phase = Phase::kInbox;
    bool dropped = false;  // abort() was called: no longer counted
  };
  bool admits_one_more() const;  // submit(), inbox_mutex_ held
  void count_drained(const std::vector<std::unique_ptr<Sequence>>& fresh);  // drain_inbox, inbox_mutex_ held
  void publish_admission();  // engine thread (takes inbox_mutex_), after scheduling and after the step's work
  std::unordered_map<RequestId, Admission> admission_;  // every request not finished yet
  int64_t waiting_published_ = 0;   // scheduler waiting + arrivals counted as waiting since
  int64_t running_published_ = 0;   // scheduler running + arrivals that took a free slot since
  int64_t dropped_inbox_ = 0, dropped_waiting_ = 0, dropped_running_ = 0;  // of the above, aborted
  RequestId next_id_ = 1;
  uint64_t next_order_ = 0;

  mutable std::mutex stats_mutex_;
  EngineStats stats_;

  StepCostModel cost_model_;                // engine thread only; the scheduler reads it
  std::function<double()> step_clock_;      // null: steady_clock
  double last_cost_log_ = -1e300, last_over_target_warning_ = -1e300;
  double step_log_t0_ = std::numeric_limits<double>::quiet_NaN();  // start of the first logged step
  // When stats_.blocks_cached was last counted (Engine::step refreshes it only when it can have changed).
  double cached_count_at_ = -1e300;
  int64_t cached_count_finishes_ = -1, cached_count_evictions_ = -1;

  Drafter drafter_;  // speculative decoding's draft stage and adaptive policy (idle when spec is off)

  std::thread loop_;
  std::atomic<bool> stop_{false};
};

}  // namespace mxserve::runtime
