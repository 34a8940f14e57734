#include "runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/check.h"
#include "core/device_oom.h"
#include "core/logging.h"
#include "runtime/sampler.h"

namespace mxserve::runtime {
namespace {

Status validate_sampling(const SamplingParams& p, int32_t max_logprobs, int64_t vocab) {
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    return invalid_argument("temperature " + std::to_string(p.temperature) + " must be a finite number >= 0");
  if (!(p.top_p > 0 && p.top_p <= 1)) return invalid_argument("top_p " + std::to_string(p.top_p) + " must be in (0, 1]");
  if (p.top_k < 0) return invalid_argument("top_k " + std::to_string(p.top_k) + " must be >= 0 (0 = off)");
  if (!(p.min_p >= 0 && p.min_p <= 1)) return invalid_argument("min_p " + std::to_string(p.min_p) + " must be in [0, 1]");
  if (p.max_tokens < 1) return invalid_argument("max_tokens " + std::to_string(p.max_tokens) + " must be >= 1");
  if (p.logprobs > max_logprobs)
    return invalid_argument("logprobs " + std::to_string(p.logprobs) + " exceeds the limit of " + std::to_string(max_logprobs));
  if (p.prompt_logprobs > max_logprobs)
    return invalid_argument("prompt_logprobs " + std::to_string(p.prompt_logprobs) + " exceeds the limit of " +
                            std::to_string(max_logprobs));
  if (!std::isfinite(p.presence_penalty) || std::fabs(p.presence_penalty) > 2)
    return invalid_argument("presence_penalty must be in [-2, 2]");
  if (!std::isfinite(p.frequency_penalty) || std::fabs(p.frequency_penalty) > 2)
    return invalid_argument("frequency_penalty must be in [-2, 2]");
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0)
    return invalid_argument("repetition_penalty " + std::to_string(p.repetition_penalty) + " must be > 0");
  for (const auto& [token, bias] : p.logit_bias) {
    if (token < 0 || token >= vocab)
      return invalid_argument("logit_bias token " + std::to_string(token) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
    if (!std::isfinite(bias) || std::fabs(bias) > 100)
      return invalid_argument("logit_bias of token " + std::to_string(token) + " must be in [-100, 100]");
  }
  return Status::ok();
}

}  // namespace

namespace {
SchedulerConfig with_spec(SchedulerConfig s, const SpecConfig& spec) {
  s.track_draft_kv = spec.num_steps > 0;
  return s;
}
}  // namespace

Usage usage_of(const Sequence& seq) {
  Usage u;
  u.prompt_tokens = seq.prompt_len;
  u.cached_tokens = std::max(seq.cached_tokens, 0);
  u.cached_host_tokens = seq.cached_host_tokens;
  u.completion_tokens = seq.n_generated();
  u.spec_draft_tokens = seq.spec_drafted;
  u.spec_accepted_tokens = seq.spec_accepted;
  u.spec_drafts = seq.spec_drafts;
  return u;
}

// Tokens a sequence's blocks may cover past max_model_len: draft rows of a verify step / draft tree.
constexpr int64_t kSpecSlackTokens = 256;

Engine::Engine(const EngineConfig& config, std::unique_ptr<ModelExecutor> executor)
    : config_(config),
      executor_(std::move(executor)),
      pool_(config.n_blocks, config.scheduler.dp_ranks),
      scheduler_(with_spec(config.scheduler, config.spec), pool_),
      drafter_(config.spec, config.scheduler.max_num_batched_tokens, *executor_, scheduler_) {
  MX_CHECK_GT(config_.n_blocks, 0);
  if (config_.spec.num_steps > 0 && !executor_->has_mtp())
    MX_CHECK_MSG(false, "speculative decoding needs a model with an MTP layer (checked by the caller)");
  if (config_.spec.num_steps > 0 && config_.spec.tree()) {
    const auto& sc = config_.spec;
    MX_CHECK_MSG(sc.num_draft_tokens >= 2 && sc.num_draft_tokens - 1 <= SpecConfig::kMaxTreeNodes &&
                     sc.num_draft_tokens - 1 <= sc.tree_capacity(sc.num_steps) &&
                     (sc.num_steps - 1) * sc.topk <= SpecConfig::kMaxTreeNodes,
                 "tree speculation: num_draft_tokens " << sc.num_draft_tokens << ", topk " << sc.topk << ", depth "
                                                       << sc.num_steps << " (checked by the flags)");
  }
  if (config_.spec.simulate_acceptance) {
    MX_LOG(kWarn) << "--speculative-simulate-acceptance " << *config_.spec.simulate_acceptance
                  << ": drafts are accepted at a fixed rate regardless of the model; the OUTPUT TEXT IS "
                     "MEANINGLESS (benchmark mode)";
  }
  scheduler_.set_cost_model(&cost_model_);
  stats_.step_cost.target_seconds = config_.scheduler.max_step_seconds;
  {  // a device block-table row per running sequence, wide enough for max_model_len plus speculative rows
    const int64_t bs = config_.scheduler.block_size;
    const int64_t width = std::min<int64_t>(config_.n_blocks, (config_.max_model_len + kSpecSlackTokens + bs - 1) / bs);
    const Status st = executor_->enable_block_tables(config_.scheduler.max_running, width);
    MX_CHECK_MSG(st.is_ok(), "engine: " << st.to_string());
  }
  if (config_.cuda_graphs) {
    // Speculation: verify steps (chain: 1 + N rows per sequence, N <= num_steps; tree: 1 + nodes for each depth
    // the policy may pick), the MTP extend (accepted + 1 rows per sequence) and the draft steps (chain
    // continuation / tree frontier rows) are captured too.
    ModelExecutor::SpecGraphShapes shapes;
    if (spec_enabled()) {
      const SpecConfig& sc = config_.spec;
      shapes.extend_rows = sc.num_steps + 1;
      if (sc.tree()) {
        for (int32_t n = 1; n <= sc.num_steps; ++n) shapes.tree_verify_rows.push_back(1 + sc.draft_rows(n));
        if (sc.num_steps >= 2) shapes.tree_draft_rows = sc.topk;
      } else {
        shapes.chain_drafts = sc.num_steps;
      }
    }
    const Status st = executor_->enable_decode_graphs(config_.scheduler.max_running, shapes);
    if (!st.is_ok()) MX_LOG(kWarn) << "CUDA graphs are OFF (every step runs eagerly): " << st.to_string();
  }
  if (config_.kv_cache_host_memory > 0) enable_host_tier();
  stats_.blocks_total = config_.n_blocks;
  stats_.blocks_free = config_.n_blocks;
}

Engine::~Engine() { stop(); }

void Engine::enable_host_tier() {
  // Start-up checks: the caller (serving_model.cpp) validated the flag; a refusal here is a CHECK naming it.
  MX_CHECK_MSG(config_.scheduler.enable_prefix_cache,
               "--kv-cache-host-memory needs the prefix cache (drop --no-enable-prefix-caching or the host tier)");
  MX_CHECK_MSG(config_.scheduler.dp_ranks == 1, "--kv-cache-host-memory supports one DP rank (got "
                                                    << config_.scheduler.dp_ranks << ")");
  const uint64_t per_block = executor_->kv_bytes_per_block();
  MX_CHECK_MSG(per_block > 0, "--kv-cache-host-memory: this executor has no KV cache layout");
  const int64_t n_slots = static_cast<int64_t>(config_.kv_cache_host_memory / per_block);
  MX_CHECK_MSG(n_slots > 0, "--kv-cache-host-memory " << config_.kv_cache_host_memory << " bytes holds no KV block of "
                                                      << per_block << " bytes");
  auto mover = executor_->enable_host_tier(n_slots);
  MX_CHECK_MSG(mover.is_ok(), mover.status().to_string());
  host_tier_ = std::make_unique<kvcache::HostTier>(n_slots, config_.scheduler.block_size, **mover);
  scheduler_.set_host_tier(host_tier_.get());
  stats_.host_blocks_total = n_slots;
  MX_LOG(kInfo) << "host KV tier: " << n_slots << " blocks (" << n_slots * config_.scheduler.block_size
                << " tokens) behind a device pool of " << config_.n_blocks
                << " blocks; evicted prefix blocks spill there and are loaded back on a hit, layer by layer, "
                   "overlapped with the step's forward";
}

int64_t Engine::vocab_size() const { return executor_->vocab_size(); }

Result<RequestId> Engine::submit(RequestSpec spec, EventCallback on_event) {
  const int64_t V = executor_->vocab_size();
  const int64_t n_prompt = static_cast<int64_t>(spec.prompt.size());
  if (n_prompt == 0) return invalid_argument("the prompt is empty");
  for (size_t i = 0; i < spec.prompt.size(); ++i)
    if (spec.prompt[i] < 0 || spec.prompt[i] >= V)
      return invalid_argument("prompt token " + std::to_string(i) + " = " + std::to_string(spec.prompt[i]) +
                              " is outside the vocabulary [0, " + std::to_string(V) + ")");
  MX_RETURN_IF_ERROR(validate_sampling(spec.sampling, config_.max_logprobs, V));
  const int64_t total = n_prompt + spec.sampling.max_tokens;
  if (total > config_.max_model_len)
    return invalid_argument("prompt (" + std::to_string(n_prompt) + " tokens) + max_tokens (" +
                            std::to_string(spec.sampling.max_tokens) + ") = " + std::to_string(total) +
                            " exceeds the model's context limit of " + std::to_string(config_.max_model_len));
  // With DP a sequence lives in one rank's block range: the smallest range bounds it.
  const int64_t range_blocks = config_.n_blocks / config_.scheduler.dp_ranks;
  if (scheduler_.blocks_needed(total) > range_blocks)
    return invalid_argument("prompt + max_tokens = " + std::to_string(total) + " tokens can never fit in the KV cache (" +
                            std::to_string(range_blocks * config_.scheduler.block_size) + " tokens" +
                            (config_.scheduler.dp_ranks > 1 ? " per DP rank" : "") + ")");
  auto seq = std::make_unique<Sequence>();
  seq->tokens = std::move(spec.prompt);
  seq->prompt_len = static_cast<int32_t>(n_prompt);
  seq->sampling = std::move(spec.sampling);
  seq->constraint = std::move(spec.constraint);
  seq->prompt_logprobs_pending = seq->sampling.prompt_logprobs >= 0;
  seq->times.arrival = Clock::now();
  seq->on_event = std::move(on_event);
  {
    std::lock_guard<std::mutex> lock(inbox_mutex_);
    if (!admits_one_more())
      return unavailable("the waiting queue is full (" + std::to_string(config_.max_waiting) +
                         " requests): the server is overloaded, retry later");
    seq->id = next_id_++;
    seq->admit_order = next_order_++;
    seq->seed = std::random_device{}() ^ (seq->id * 0x9e3779b97f4a7c15ull);
    const RequestId id = seq->id;
    admission_.emplace(id, Admission{});
    inbox_.push_back(std::move(seq));
    inbox_cv_.notify_one();
    return id;
  }
}

void Engine::drain_inbox() {
  std::vector<std::unique_ptr<Sequence>> fresh;
  std::vector<RequestId> aborts;
  {
    std::lock_guard<std::mutex> lock(inbox_mutex_);
    fresh.swap(inbox_);
    aborts.swap(abort_inbox_);
    count_drained(fresh);  // now in the scheduler: free slots first (engine_admission.cpp)
  }
  for (auto& s : fresh) {
    Sequence* seq = s.get();
    seqs_[seq->id] = std::move(s);
    scheduler_.add_waiting(seq);
  }
  for (RequestId id : aborts) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;  // already finished: nothing to do
    finish(it->second.get(), FinishReason::kAbort);
  }
}

void Engine::finish(Sequence* seq, FinishReason reason, const std::string& error) {
  scheduler_.remove(seq);
  scheduler_.release(seq);
  seq->state = SeqState::kFinished;
  seq->times.finished = Clock::now();
  {
    std::lock_guard<std::mutex> s(stats_mutex_);
    if (reason == FinishReason::kAbort) ++stats_.aborted;
    else ++stats_.finished;
  }
  if (reason == FinishReason::kAbort || reason == FinishReason::kError) {
    TokenEvent ev;
    ev.id = seq->id;
    ev.finish = reason;
    ev.error = error;
    ev.usage = usage_of(*seq);
    if (seq->on_event) seq->on_event(ev);
  }
  {
    std::lock_guard<std::mutex> lock(inbox_mutex_);
    admission_.erase(seq->id);  // its counts stay until the next publish_admission(), which drops them
  }
  seqs_.erase(seq->id);
}

bool Engine::step() {
  drain_inbox();
  const double t0 = now_seconds();
  SchedulePlan plan = scheduler_.schedule();
  // The counts submit() admits against (engine.h). Published after scheduling and again after the step's work, so
  // they are never older than the stats (/metrics) published with them: a client that saw the queue drain must
  // not be refused by counts from before the drain (a busy host can delay the next step by a while).
  publish_admission();
  bool worked = !plan.empty();
  const bool plan_had_prefill = plan.n_prefill_tokens > 0;
  if (worked) {
    std::vector<RequestId> in_plan;
    for (const auto& c : plan.chunks) in_plan.push_back(c.seq->id);
    const StepShape shape = shape_of(plan);  // before run_plan: finished sequences are freed in it
    const int64_t replays_before = config_.step_log ? executor_->graph_replays() : 0;
    Status s = Status::ok();
    try {
      s = run_plan(plan);
    } catch (const DeviceOutOfMemory& oom) {  // an allocation deep in the step (core/device_oom.h)
      s = out_of_memory(oom.what());
    }
    if (s.code() == StatusCode::kOutOfMemory)  // one rank's (lockstep) or this backend's: say what to change
      s = out_of_memory(s.message() + "; the step's " + std::to_string(in_plan.size()) +
                        " request(s) failed (lower --max-num-batched-tokens, --chunked-prefill-size or "
                        "--kv-cache-memory to leave the forward more room)");
    if (s.is_ok()) {
      const double seconds = now_seconds() - t0;
      if (config_.step_log) log_step(plan, shape, t0, seconds, executor_->graph_replays() > replays_before);
      record_step_cost(plan, shape, seconds);
    }
    if (!s.is_ok()) {
      // A failed forward (a bug, or the device out of memory), not the requests' fault: fail the batch's
      // requests, keep serving.
      MX_LOG(kError) << "forward failed: " << s.to_string();
      for (RequestId id : in_plan) {
        auto it = seqs_.find(id);
        if (it != seqs_.end()) finish(it->second.get(), FinishReason::kError, s.to_string());
      }
    }
  }
  publish_admission();
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.steps += worked ? 1 : 0;
  stats_.waiting = static_cast<int64_t>(scheduler_.waiting().size());
  stats_.running = static_cast<int64_t>(scheduler_.running().size());
  stats_.blocks_free = pool_.n_free();
  stats_.scheduler = scheduler_.counters();
  if (host_tier_) {
    stats_.host_blocks_used = host_tier_->n_used();
    stats_.host_tier = host_tier_->counters();
  }
  // The prefix cache's evictable count walks its whole tree (O(cached blocks): ~30% of the engine thread's
  // host time at 64 streams x 8k context when done every step). Refreshed only when it can have changed -- a
  // prefill, a finish or abort, a preemption or eviction -- and at least every second (an idle engine's loop
  // no longer walks it every 20 ms): a pure decode step only adds blocks its own sequence still holds.
  const int64_t finishes = stats_.finished + stats_.aborted;
  const int64_t evictions = stats_.scheduler.evicted_blocks + stats_.scheduler.preemptions;
  const double now = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();  // not step_clock_
  if (plan_had_prefill || finishes != cached_count_finishes_ || evictions != cached_count_evictions_ ||
      now - cached_count_at_ >= 1.0) {
    stats_.blocks_cached = 0;
    for (int r = 0; r < scheduler_.dp_ranks(); ++r)
      if (const kvcache::RadixCache* cache = scheduler_.prefix_cache(r)) stats_.blocks_cached += cache->n_evictable();
    cached_count_finishes_ = finishes;
    cached_count_evictions_ = evictions;
    cached_count_at_ = now;
  }
  return worked;
}

double Engine::now_seconds() const {
  if (step_clock_) return step_clock_();
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

void Engine::record_step_cost(const SchedulePlan& plan, const StepShape& shape, double seconds) {
  const bool was_ready = cost_model_.ready();
  cost_model_.observe(shape, seconds);
  const double now = now_seconds();
  const StepCostCoefficients& c = cost_model_.coefficients();
  if (cost_model_.ready() && (!was_ready || now - last_cost_log_ >= 60)) {
    last_cost_log_ = now;
    MX_LOG(kInfo) << "step cost model (" << cost_model_.n_observed() << " steps, mean error "
                  << 100 * cost_model_.mean_relative_error() << "%): " << 1e3 * c.base << " ms + "
                  << 1e6 * c.per_prefill_token << " us/prefill token + " << 1e9 * c.per_prefill_pair
                  << " ns/prefill attention pair + " << 1e6 * c.per_decode_row << " us/decode row + "
                  << 1e9 * c.per_decode_kv_token << " ns/decode KV token; --max-itl-ms "
                  << 1e3 * config_.scheduler.max_step_seconds << " (0 = off)";
  }
  if (plan.decodes_over_target && now - last_over_target_warning_ >= 60) {
    last_over_target_warning_ = now;
    StepShape decodes;
    decodes.decode_rows = shape.decode_rows;
    decodes.decode_kv_tokens = shape.decode_kv_tokens;
    MX_LOG(kWarn) << "ITL target " << 1e3 * config_.scheduler.max_step_seconds << " ms is out of reach: the "
                  << shape.decode_rows << " decode rows alone are predicted at " << 1e3 * cost_model_.predict(decodes)
                  << " ms; prefill gets only --min-prefill-chunk " << config_.scheduler.min_prefill_chunk
                  << " tokens per step. Raise --max-itl-ms or lower --max-num-seqs";
  }
  std::lock_guard<std::mutex> lock(stats_mutex_);
  StepCostStats& st = stats_.step_cost;
  st.ready = cost_model_.ready();
  st.samples = cost_model_.n_observed();
  st.coefficients = c;
  st.mean_relative_error = cost_model_.mean_relative_error();
  st.last_step_seconds = seconds;
  if (plan.itl_limited) {
    st.last_predicted_seconds = plan.predicted_seconds;
    ++st.itl_limited_steps;
  }
  st.over_target_steps += plan.decodes_over_target;
}

void Engine::log_step(const SchedulePlan& plan, const StepShape& shape, double t0, double seconds, bool graph) {
  if (std::isnan(step_log_t0_)) step_log_t0_ = t0;
  StepLogRecord r;
  r.t = t0 - step_log_t0_;
  r.seconds = seconds;
  r.shape = shape;
  for (const auto& c : plan.chunks) ++(StepShape::is_decode(c.n_tokens, c.n_drafts) ? r.decode_seqs : r.prefill_chunks);
  r.graph = graph;
  if (cost_model_.ready()) r.predicted = cost_model_.predict(shape);
  config_.step_log->write(r);
}

bool Engine::idle() const {
  std::lock_guard<std::mutex> lock(inbox_mutex_);
  std::lock_guard<std::mutex> s(stats_mutex_);
  return inbox_.empty() && abort_inbox_.empty() && stats_.waiting == 0 && stats_.running == 0;
}

void Engine::start() {
  stop_ = false;
  loop_ = std::thread([this] {
    while (!stop_) {
      if (!step()) {
        std::unique_lock<std::mutex> lock(inbox_mutex_);
        inbox_cv_.wait_for(lock, std::chrono::milliseconds(20),
                           [this] { return stop_ || !inbox_.empty() || !abort_inbox_.empty(); });
      }
    }
  });
}

void Engine::stop() {
  stop_ = true;
  inbox_cv_.notify_all();
  if (loop_.joinable()) loop_.join();
}

Status Engine::check_invariants() const {
  std::vector<int32_t> expected(config_.n_blocks, 0);
  for (const auto& [id, seq] : seqs_) {
    for (int32_t b : seq->block_table) {
      if (b < 0 || b >= config_.n_blocks) return internal_error("request " + std::to_string(id) + " holds bad block");
      ++expected[b];
    }
    if (seq->state == SeqState::kRunning &&
        static_cast<int64_t>(seq->block_table.size()) * config_.scheduler.block_size < seq->n_computed)
      return internal_error("request " + std::to_string(id) + ": block table shorter than its computed tokens");
    if (seq->state == SeqState::kWaiting && !seq->block_table.empty())
      return internal_error("waiting request " + std::to_string(id) + " holds blocks");
    if (seq->state == SeqState::kRunning) {
      if (seq->table_row < 0) return internal_error("running request " + std::to_string(id) + " has no table row");
      MX_RETURN_IF_ERROR(executor_->check_block_table(seq->table_row, seq->table_lease, seq->block_table));
    } else if (seq->table_row >= 0) {
      return internal_error("request " + std::to_string(id) + " holds table row " + std::to_string(seq->table_row) +
                            " while not running");
    }
  }
  for (int r = 0; r < scheduler_.dp_ranks(); ++r) {  // DP: every block in its holder's range
    for (const auto& [id, seq] : seqs_)
      for (int32_t b : seq->block_table)
        if (seq->dp_rank == r && pool_.range_of(b) != r)
          return internal_error("request " + std::to_string(id) + " on DP rank " + std::to_string(r) + " holds block " +
                                std::to_string(b) + " of DP rank " + std::to_string(pool_.range_of(b)));
    Status in_range = Status::ok();
    if (auto* cache = const_cast<Scheduler&>(scheduler_).prefix_cache(r))
      cache->for_each_block([&](int32_t b, int64_t) {
        ++expected[b];
        if (pool_.range_of(b) != r && in_range.is_ok())
          in_range =
              internal_error("DP rank " + std::to_string(r) + "'s prefix cache holds block " + std::to_string(b));
      });
    MX_RETURN_IF_ERROR(in_range);
  }
  int64_t free_count = 0;
  for (int64_t b = 0; b < config_.n_blocks; ++b) {
    if (pool_.ref_count(static_cast<int32_t>(b)) != expected[b])
      return internal_error("block " + std::to_string(b) + " has " + std::to_string(pool_.ref_count(b)) +
                            " references, holders account for " + std::to_string(expected[b]));
    free_count += expected[b] == 0;
  }
  if (free_count != pool_.n_free()) return internal_error("free-list size disagrees with reference counts");
  if (host_tier_) {
    MX_RETURN_IF_ERROR(host_tier_->check());
    if (host_tier_->n_pinned() != 0) return internal_error("host KV tier: entries left pinned between steps");
  }
  return Status::ok();
}

int64_t Engine::evict_prefix_cache() {
  int64_t n = 0;
  for (int r = 0; r < scheduler_.dp_ranks(); ++r)
    if (kvcache::RadixCache* cache = scheduler_.prefix_cache(r)) n += cache->evict(cache->n_cached_blocks());
  return n;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

}  // namespace mxserve::runtime
