// Scheduler: decides what runs each step, and keeps the KV bookkeeping (blocks, prefix cache) exact.
// Policy (one step):
//   1. every running sequence with exactly one token left to compute (a decode) gets it -- decodes first,
//      so a stream of long prefills can never starve them;
//   2. running sequences mid-prefill continue with a chunk;
//   3. waiting sequences are admitted FCFS (prefix-cache lookup first) while the budgets allow.
// Every running sequence holds a block-table row (taken at admission, given back in release()).
//   Budgets per step: at most max_num_batched_tokens tokens in all, at most chunked_prefill_size of them
//   prefill tokens, at most max_running sequences running (hard caps). With an ITL target
//   (max_step_seconds) and a ready step cost model (step_cost_model.h), a step that carries decodes also
//   takes only the prefill tokens that keep its predicted time within the target -- but at least
//   min_prefill_chunk of them, so prefill always progresses (docs/scheduling.md).
// TTFT target (ttft_target_seconds > 0, --slo-ttft-ms; off by default = the FCFS policy above, unchanged):
//   waiting prefills, and running ones mid-prefill, are ordered each step by class, then deadline (arrival +
//   target), then fewest prompt tokens left: class 0 preempted (they keep the front), class 1 those that can
//   still make their deadline (the cost model's best case: chunks up to max_num_batched_tokens, the ITL bound
//   applied), class 2 those that cannot (late). Late requests go after every other one, FCFS, so one lost
//   request does not make the others miss too; a late request that has waited 2x the target rejoins class 1
//   (its deadline is then the earliest), so none starves. A class-1 chunk that would miss its deadline at
//   chunked_prefill_size-token chunks but can make it with bigger ones is "urgent": its chunk may go past
//   chunked_prefill_size up to the step's token budget -- still through the ITL bound (PrefillBudget).
//   Until the cost model is ready nothing is late or urgent (deadline order only).
// Starvation bound: a running decode is scheduled in every step until it finishes or is preempted; a step
// carries at most chunked_prefill_size prefill tokens (max_num_batched_tokens with an urgent TTFT chunk; the
// ITL target still applies), so a decode waits at most one step that holds (n_decodes + that many) tokens
// between two of its tokens.
// Out of blocks: evict unreferenced prefix-cache leaves (LRU), then preempt the newest running sequence
// (its computed full blocks go to the prefix cache; it is re-queued at the front to recompute).
// Data parallelism (dp_ranks > 1, docs/parallel.md): the pool's block ids split into one range per DP rank;
// each admission places the sequence on a rank (runtime/dp_placement.h) and it takes blocks from that
// range only; each rank has its own prefix cache; eviction and preemption free blocks of the rank in need.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "kvcache/block_pool.h"
#include "kvcache/block_table_store.h"
#include "kvcache/radix_cache.h"
#include "model/forward_batch.h"
#include "runtime/sequence.h"
#include "runtime/step_cost_model.h"

namespace mxserve::runtime {

struct SchedulerConfig {
  int64_t block_size = 16;
  int64_t max_num_batched_tokens = 8192;
  int64_t chunked_prefill_size = 2048;
  int64_t max_running = 256;
  bool enable_prefix_cache = true;
  bool track_draft_kv = false;  // speculative decoding: only cache blocks whose MTP-layer KV is complete
  double max_step_seconds = 0;     // ITL target for steps with decodes (--max-itl-ms); 0 = hard caps only
  int64_t min_prefill_chunk = 256; // prefill tokens a step with decodes always gets (when any is waiting)
  int dp_ranks = 1;                // data-parallel ranks; the pool must have as many block ranges
  double ttft_target_seconds = 0;  // TTFT target (--slo-ttft-ms / 1000): deadline-ordered prefills; 0 = FCFS
  // With the TTFT target: a prefill that would miss its deadline under the ITL bound but makes it without the
  // bound takes its chunk past the bound (--slo-ttft-over-itl; off: the ITL bound always holds).
  bool ttft_over_itl = false;
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t start = 0;       // first token index of this chunk (== seq->n_computed at schedule time)
  int32_t n_tokens = 0;    // tokens [start, start + n_tokens) are computed this step
  int32_t n_drafts = 0;    // the last n_drafts rows are the sequence's drafts (speculative verify)
  bool needs_sample = false;  // the chunk ends at the sequence's last token: sample the next one
};

// A prefill chunk of a request whose prompt logprobs are still pending: every row of it is a logit row.
bool wants_prompt_logprobs(const ScheduledChunk& c);
// Logit rows of a chunk in ForwardBatch::logit_rows order: every row of a verify chunk or a prompt-logprobs
// chunk, else one when it samples. Its sampled row (needs_sample) is the last of them.
int32_t logit_rows_of(const ScheduledChunk& c);

struct SchedulePlan {
  std::vector<ScheduledChunk> chunks;  // plain decode rows (is_plain_decode_row) first, then speculative
                                       // verify chunks, then prefill chunks
  std::vector<Sequence*> preempted;    // sequences preempted while planning (now waiting)
  int64_t n_tokens = 0;
  int64_t n_prefill_tokens = 0;
  bool itl_limited = false;          // the ITL target bounded this step's prefill (PrefillBudget::limited)
  bool decodes_over_target = false;  // ... and the decodes alone were predicted over it
  double predicted_seconds = 0;      // the cost model's prediction for the step (when itl_limited)
  int32_t ttft_urgent_chunks = 0;    // TTFT target: chunks allowed past chunked_prefill_size (deadline near)
  int32_t ttft_late = 0;             // TTFT target: prefills (waiting or running) predicted to miss it
  int32_t ttft_past_itl_chunks = 0;  // TTFT target over ITL: chunks that took the step past the ITL bound
  bool empty() const { return chunks.empty(); }
};

// One row, no drafts: a plain decode row (or a one-token prefill chunk), the rows schedule() puts first.
bool is_plain_decode_row(const ScheduledChunk& c);

// The step's shape in the cost model's features (decodes and prefill chunks alike).
StepShape shape_of(const SchedulePlan& plan);

struct SchedulerCounters {
  int64_t prefix_queries_tokens = 0;  // prompt tokens looked up in the prefix cache
  int64_t prefix_hit_tokens = 0;      // of which found (either tier)
  int64_t prefix_host_hit_tokens = 0; // of which loaded back from the host tier (kvcache/host_tier.h)
  int64_t preemptions = 0;
  int64_t evicted_blocks = 0;
};

// The forward batch for a plan: chunks in order; a logit row for each chunk that needs a sample.
model::ForwardBatch build_forward_batch(const SchedulePlan& plan);
// A span over seq's block table by reference: its store row, lease and host table (no copy of the table).
model::SequenceSpan table_span(const Sequence& seq);

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, kvcache::BlockPool& pool);

  void add_waiting(Sequence* seq);  // at the back (new) -- FCFS
  SchedulePlan schedule();
  // After the step ran: advance n_computed for every chunk and record finished prefill blocks.
  void commit(const SchedulePlan& plan);
  // Releases a finished/aborted sequence's blocks (full computed blocks go to the prefix cache first).
  void release(Sequence* seq);
  // Removes a sequence from the waiting or running list (abort); does not release blocks.
  void remove(Sequence* seq);

  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  const SchedulerCounters& counters() const { return counters_; }
  // DP rank dp_rank's prefix cache (null when disabled).
  kvcache::RadixCache* prefix_cache(int dp_rank = 0) { return caches_.empty() ? nullptr : caches_[dp_rank].get(); }
  int dp_ranks() const { return config_.dp_ranks; }
  // The model behind the ITL target (owned by the engine; null: hard caps only).
  void set_cost_model(const StepCostModel* model) { cost_model_ = model; }
  // The host-memory tier below the prefix cache (null: none): evicted cache blocks are offloaded to it and
  // admissions continue their device match into it. One DP rank only (the engine refuses more).
  void set_host_tier(kvcache::HostTier* tier);
  kvcache::HostTier* host_tier() { return host_tier_; }
  // The clock of the TTFT target (tests: a fake one); default Clock::now.
  void set_clock(std::function<Clock::time_point()> now) { now_ = std::move(now); }
  // Makes room for seq to hold n_tokens (evicting cache leaves if needed); false when the pool is dry.
  bool reserve(Sequence* seq, int64_t n_tokens);
  int64_t blocks_needed(int64_t n_tokens) const { return (n_tokens + config_.block_size - 1) / config_.block_size; }

 private:
  void preempt(Sequence* seq);
  void cache_blocks(Sequence* seq);
  // Continues seq's device prefix match (chain key `key`) into the host tier: allocates device blocks for
  // the host entries found, copies them back and appends them. Returns the tokens loaded.
  int64_t load_from_host(Sequence* seq, uint64_t key, int64_t limit);
  int place(const Sequence& seq) const;  // the DP rank for an admission (dp_placement.h)
  // TTFT target: a prefill's place in the order (see the header comment) and whether its chunk may be urgent.
  struct TtftKey {
    int cls = 1;          // 0 preempted, 1 can make it (or aged), 2 late
    double slack = 0;     // seconds left to the deadline (negative: past it)
    int64_t work = 0;     // prompt tokens left to compute
    bool urgent = false;  // misses at chunked_prefill_size chunks, makes it with bigger ones
    bool past_itl = false;  // ttft_over_itl: misses under the ITL bound, makes it without it (urgent too)
  };
  bool ttft_on() const { return config_.ttft_target_seconds > 0; }
  TtftKey ttft_key(const Sequence& seq, int64_t start, const StepShape& decodes, Clock::time_point now) const;
  // Predicted seconds to finish seq's prefill from `start` in chunks of at most `chunk` tokens, each step
  // also carrying `decodes` (the ITL bound shrinks the chunks as the scheduler would).
  double prefill_finish_seconds(const StepShape& decodes, int64_t start, int64_t len, int64_t chunk,
                                bool itl_bound = true) const;
  int64_t cached_prefix(const Sequence& seq) const;  // prefix-cache hit a waiting sequence would get
  Clock::time_point now() const { return now_ ? now_() : Clock::now(); }

  SchedulerConfig config_;
  kvcache::BlockPool& pool_;
  std::vector<std::unique_ptr<kvcache::RadixCache>> caches_;  // one per DP rank; empty: no prefix cache
  const StepCostModel* cost_model_ = nullptr;
  kvcache::HostTier* host_tier_ = nullptr;
  std::function<Clock::time_point()> now_;  // null: Clock::now
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // in admission order
  kvcache::TableRows table_rows_;   // a device block-table row per running sequence (max_running rows)
  SchedulerCounters counters_;
};

}  // namespace mxserve::runtime
