#include "runtime/scheduler.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"
#include "core/logging.h"
#include "runtime/dp_placement.h"

namespace mxserve::runtime {

Scheduler::Scheduler(const SchedulerConfig& config, kvcache::BlockPool& pool)
    : config_(config), pool_(pool), table_rows_(config.max_running) {
  MX_CHECK_MSG(pool_.n_ranges() == config_.dp_ranks,
               "scheduler: " << config_.dp_ranks << " DP ranks over a pool of " << pool_.n_ranges() << " ranges");
  if (config_.enable_prefix_cache)
    for (int r = 0; r < config_.dp_ranks; ++r)
      caches_.push_back(std::make_unique<kvcache::RadixCache>(pool_, config_.block_size));
}

int Scheduler::place(const Sequence& seq) const {
  if (config_.dp_ranks == 1) return 0;
  std::vector<DpRankLoad> loads(config_.dp_ranks);
  for (int r = 0; r < config_.dp_ranks; ++r) {
    if (!caches_.empty())
      loads[r].prefix_hit_tokens = caches_[r]->match_length(seq.tokens, static_cast<int64_t>(seq.tokens.size()) - 1);
    loads[r].free_blocks = pool_.n_free(r);
  }
  for (const Sequence* s : running_) ++loads[s->dp_rank].running;
  return place_on_dp_rank(loads);
}

void Scheduler::set_host_tier(kvcache::HostTier* tier) {
  MX_CHECK_MSG(tier == nullptr || (config_.dp_ranks == 1 && !caches_.empty()),
               "host KV tier: needs the prefix cache and one DP rank");
  host_tier_ = tier;
  if (caches_.empty()) return;
  if (tier == nullptr) {
    caches_[0]->set_evict_sink(nullptr);
  } else {
    caches_[0]->set_evict_sink([tier](const std::vector<kvcache::EvictedBlock>& b) { tier->offload(b); });
  }
}

int64_t Scheduler::load_from_host(Sequence* seq, uint64_t key, int64_t limit) {
  const std::vector<int32_t> slots = host_tier_->match_and_pin(seq->tokens, seq->n_computed, limit, key);
  if (slots.empty()) return 0;
  const int r = seq->dp_rank;
  const int64_t want = static_cast<int64_t>(slots.size());
  // Evicting device leaves offloads them into the tier: the pinned entries above are never its victims.
  if (pool_.n_free(r) < want) counters_.evicted_blocks += caches_[r]->evict(want - pool_.n_free(r));
  const int64_t n = std::min<int64_t>(want, pool_.n_free(r));
  std::vector<int32_t> fresh;
  if (n > 0) MX_CHECK(pool_.allocate(n, fresh, r).is_ok());
  const Status st = host_tier_->load(slots, fresh);
  if (!st.is_ok()) {
    MX_LOG(kError) << "host KV tier: loading " << n << " blocks for request " << seq->id
                   << " failed (the prefix is recomputed): " << st.to_string();
    pool_.unref_all(fresh);
    return 0;
  }
  seq->block_table.insert(seq->block_table.end(), fresh.begin(), fresh.end());
  seq->n_computed += static_cast<int32_t>(n * config_.block_size);
  // Back in the device cache at once, so a request admitted next finds them there.
  caches_[r]->insert(std::span<const int32_t>(seq->tokens.data(), seq->n_computed), seq->block_table);
  return n * config_.block_size;
}

void Scheduler::add_waiting(Sequence* seq) {
  seq->state = SeqState::kWaiting;
  waiting_.push_back(seq);
}

bool Scheduler::reserve(Sequence* seq, int64_t n_tokens) {
  const int64_t need = blocks_needed(n_tokens) - static_cast<int64_t>(seq->block_table.size());
  if (need <= 0) return true;
  const int r = seq->dp_rank;
  if (pool_.n_free(r) < need && !caches_.empty()) counters_.evicted_blocks += caches_[r]->evict(need - pool_.n_free(r));
  if (pool_.n_free(r) < need) return false;
  MX_CHECK(pool_.allocate(need, seq->block_table, r).is_ok());
  return true;
}

void Scheduler::cache_blocks(Sequence* seq) {
  const int32_t n = config_.track_draft_kv ? std::min(seq->n_computed, seq->n_draft_computed) : seq->n_computed;
  if (caches_.empty() || n < config_.block_size) return;
  caches_[seq->dp_rank]->insert(std::span<const int32_t>(seq->tokens.data(), n), seq->block_table);
}

void Scheduler::release(Sequence* seq) {
  cache_blocks(seq);
  pool_.unref_all(seq->block_table);
  seq->block_table.clear();
  if (seq->table_row >= 0) table_rows_.release(seq->table_row);
  seq->table_row = -1;
  seq->table_lease = 0;
  seq->n_computed = 0;
  seq->n_draft_computed = 0;
  seq->clear_drafts();
}

void Scheduler::preempt(Sequence* seq) {
  release(seq);
  ++seq->n_preemptions;
  ++counters_.preemptions;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  seq->state = SeqState::kWaiting;
  waiting_.push_front(seq);  // it keeps its place ahead of newer requests
}

void Scheduler::remove(Sequence* seq) {
  auto r = std::find(running_.begin(), running_.end(), seq);
  if (r != running_.end()) running_.erase(r);
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
}

SchedulePlan Scheduler::schedule() {
  SchedulePlan plan;
  int64_t budget = config_.max_num_batched_tokens;
  int64_t prefill_budget = config_.chunked_prefill_size;

  // 1. Decodes (one token left), oldest first. Out of blocks -> preempt the newest running sequence.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    if (seq->n_remaining() != 1) {
      ++i;
      continue;
    }
    if (static_cast<int64_t>(seq->drafts.size()) + 1 > budget) {  // no room to verify drafts this step
      seq->clear_drafts();
    }
    const int32_t n = 1 + static_cast<int32_t>(seq->drafts.size());
    if (!reserve(seq, seq->n_computed + n)) {
      // The newest running sequence on seq's DP rank (only its blocks are in seq's range).
      Sequence* victim = *std::find_if(running_.rbegin(), running_.rend(),
                                       [&](const Sequence* s) { return s->dp_rank == seq->dp_rank; });
      // Drop chunks already planned for the victim this step (it restarts from scratch).
      plan.chunks.erase(std::remove_if(plan.chunks.begin(), plan.chunks.end(),
                                       [&](const ScheduledChunk& c) {
                                         if (c.seq != victim) return false;
                                         plan.n_tokens -= c.n_tokens;
                                         budget += c.n_tokens;
                                         return true;
                                       }),
                        plan.chunks.end());
      preempt(victim);
      plan.preempted.push_back(victim);
      if (victim == seq) continue;  // running_[i] is now the next sequence
      continue;                     // retry seq with the freed blocks
    }
    plan.chunks.push_back({seq, seq->n_computed, n, n - 1, true});
    plan.n_tokens += n;
    budget -= n;
    ++i;
  }

  // The ITL target: prefill tokens that keep the step's predicted time within it (hard caps still apply).
  PrefillBudget itl(cost_model_, config_.max_step_seconds, config_.min_prefill_chunk, config_.block_size,
                    shape_of(plan));

  // TTFT target: the order of prefills and which chunks are urgent (off: running order, then FCFS).
  const StepShape decodes = shape_of(plan);
  const Clock::time_point t_now = ttft_on() ? now() : Clock::time_point{};
  auto by_key = [](const TtftKey& a, const TtftKey& b) {
    if (a.cls != b.cls) return a.cls < b.cls;
    if (a.slack != b.slack) return a.slack < b.slack;
    return a.work < b.work;
  };
  // One chunk for seq (its prefill at seq->n_computed) within the budgets; an urgent chunk may use the
  // step's whole token budget instead of the prefill cap.
  auto chunk_cap = [&](Sequence* seq, bool urgent) {
    const int64_t left = static_cast<int64_t>(seq->tokens.size()) - seq->n_computed;
    return std::min<int64_t>({left, budget, urgent ? budget : std::max<int64_t>(prefill_budget, 0)});
  };
  // The tokens the ITL budget grants seq's next chunk; a chunk whose deadline needs it goes past the target.
  auto grant = [&](Sequence* seq, const TtftKey& key) {
    return key.past_itl ? itl.grant_past_target(seq->n_computed, chunk_cap(seq, true))
                        : itl.grant(seq->n_computed, chunk_cap(seq, key.urgent));
  };
  auto add_prefill = [&](Sequence* seq, int64_t n, bool urgent) {
    plan.chunks.push_back({seq, seq->n_computed, static_cast<int32_t>(n), 0,
                           seq->n_computed + n == static_cast<int64_t>(seq->tokens.size())});
    plan.n_tokens += n;
    plan.n_prefill_tokens += n;
    budget -= n;
    prefill_budget -= n;
    plan.ttft_urgent_chunks += urgent && n > std::max<int64_t>(prefill_budget + n, 0);
  };

  // 2. Running sequences mid-prefill continue with a chunk (TTFT target: late ones after the admissions).
  std::vector<Sequence*> late_running;
  {
    std::vector<std::pair<TtftKey, Sequence*>> prefilling;
    for (Sequence* seq : running_)
      if (seq->n_remaining() > 1)
        prefilling.push_back({ttft_on() ? ttft_key(*seq, seq->n_computed, decodes, t_now) : TtftKey{}, seq});
    if (ttft_on())
      std::stable_sort(prefilling.begin(), prefilling.end(),
                       [&](const auto& a, const auto& b) { return by_key(a.first, b.first); });
    for (const auto& [key, seq] : prefilling) {
      if (key.cls == 2) {
        ++plan.ttft_late;
        late_running.push_back(seq);
        continue;
      }
      if (budget <= 0 || (prefill_budget <= 0 && !key.urgent)) continue;
      const int64_t n = grant(seq, key);
      if (n == 0) break;
      if (!reserve(seq, seq->n_computed + n)) break;
      add_prefill(seq, n, key.urgent);
    }
  }

  // TTFT target: waiting sequences in deadline order (stable: equal keys keep their FCFS order).
  if (ttft_on() && !waiting_.empty()) {
    std::vector<std::pair<TtftKey, Sequence*>> order;
    for (Sequence* seq : waiting_) order.push_back({ttft_key(*seq, cached_prefix(*seq), decodes, t_now), seq});
    std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) { return by_key(a.first, b.first); });
    for (size_t i = 0; i < order.size(); ++i) {
      waiting_[i] = order[i].second;
      plan.ttft_late += order[i].first.cls == 2;
    }
  }

  // 3. Admit waiting sequences FCFS (TTFT target: in the order above).
  while (!waiting_.empty() && budget > 0 && (prefill_budget > 0 || ttft_on()) &&
         static_cast<int64_t>(running_.size()) < config_.max_running) {
    Sequence* seq = waiting_.front();
    MX_CHECK(seq->block_table.empty() && seq->n_computed == 0);
    // Past the prefill cap only an urgent chunk (TTFT target) may still go this step.
    if (prefill_budget <= 0 && !ttft_key(*seq, cached_prefix(*seq), decodes, t_now).urgent) break;
    const int64_t len = static_cast<int64_t>(seq->tokens.size());
    int64_t host_tokens = 0;
    seq->dp_rank = place(*seq);
    if (!caches_.empty() && !seq->prompt_logprobs_pending) {
      // Never match the last token: its logits are needed to sample the next one.
      auto m = caches_[seq->dp_rank]->match(seq->tokens, len - 1);
      seq->block_table = std::move(m.blocks);
      seq->n_computed = static_cast<int32_t>(m.n_tokens);
      if (host_tier_ != nullptr) host_tokens = load_from_host(seq, m.key, len - 1);
    }
    seq->n_draft_computed = seq->n_computed;  // cached blocks carry the MTP layer's KV too
    const TtftKey key = ttft_on() ? ttft_key(*seq, seq->n_computed, decodes, t_now) : TtftKey{};
    const int64_t n = grant(seq, key);
    if (n == 0 || !reserve(seq, seq->n_computed + n)) {
      release(seq);  // give the matched prefix back; try again next step
      break;
    }
    waiting_.pop_front();
    // Counted once per admission (a request held back by the budgets is looked up again next step).
    if (!caches_.empty()) {
      counters_.prefix_queries_tokens += len - 1;
      counters_.prefix_hit_tokens += seq->n_computed;
      counters_.prefix_host_hit_tokens += host_tokens;
    }
    if (seq->cached_tokens < 0) {
      seq->cached_tokens = seq->n_computed;
      seq->cached_host_tokens = static_cast<int32_t>(host_tokens);
    }
    const kvcache::TableLease lease = table_rows_.acquire();
    MX_CHECK_MSG(lease.row >= 0, "scheduler: no free block-table row with " << running_.size() << " running");
    seq->table_row = lease.row;
    seq->table_lease = lease.lease;
    seq->state = SeqState::kRunning;
    running_.push_back(seq);
    add_prefill(seq, n, key.urgent);
  }
  // 3b. TTFT target: late running prefills take what the budgets have left.
  for (Sequence* seq : late_running) {
    if (budget <= 0 || prefill_budget <= 0) break;
    const int64_t n = itl.grant(seq->n_computed, chunk_cap(seq, false));
    if (n == 0 || !reserve(seq, seq->n_computed + n)) break;
    add_prefill(seq, n, false);
  }
  // 4. Plain decode rows (one token, no drafts) first, then multi-token chunks (speculative verification,
  // prefill), each group in the order above: the attention backend runs the leading decode rows through
  // its decode kernel when the rest of a mixed step takes the prefill kernel (AttentionParams::
  // n_leading_decode_rows). Every consumer walks plan.chunks in this one order (rows, logit rows).
  std::stable_partition(plan.chunks.begin(), plan.chunks.end(), is_plain_decode_row);
  plan.itl_limited = itl.limited();
  plan.ttft_past_itl_chunks = static_cast<int32_t>(itl.past_target_chunks());
  plan.decodes_over_target = itl.decodes_over_target();
  plan.predicted_seconds = itl.predicted_seconds();
  return plan;
}

int64_t Scheduler::cached_prefix(const Sequence& seq) const {
  if (caches_.empty() || seq.prompt_logprobs_pending) return 0;
  int64_t best = 0;
  for (const auto& cache : caches_)
    best = std::max(best, cache->match_length(seq.tokens, static_cast<int64_t>(seq.tokens.size()) - 1));
  return best;
}

double Scheduler::prefill_finish_seconds(const StepShape& decodes, int64_t start, int64_t len, int64_t chunk,
                                         bool itl_bound) const {
  const int64_t left = len - start;
  if (left <= 0) return 0;
  const double step = cost_model_->predict(decodes);  // base + the decodes every step carries
  if (itl_bound && config_.max_step_seconds > 0 && decodes.decode_rows > 0)
    chunk = std::min(chunk, std::max(config_.min_prefill_chunk,
                                     cost_model_->max_prefill_tokens(start, config_.max_step_seconds - step)));
  chunk = std::max<int64_t>(chunk, 1);
  const int64_t steps = (left + chunk - 1) / chunk;
  // The attention pairs of the chunks add up to those of one chunk of `left` tokens after `start`.
  return static_cast<double>(steps) * step + cost_model_->prefill_chunk_seconds(start, left);
}

Scheduler::TtftKey Scheduler::ttft_key(const Sequence& seq, int64_t start, const StepShape& decodes,
                                       Clock::time_point t_now) const {
  TtftKey k;
  const double target = config_.ttft_target_seconds;
  const double waited = std::chrono::duration<double>(t_now - seq.times.arrival).count();
  const int64_t len = static_cast<int64_t>(seq.tokens.size());
  k.slack = target - waited;
  k.work = len - start;
  if (seq.n_preemptions > 0) {
    k.cls = 0;
    return k;
  }
  if (cost_model_ == nullptr || !cost_model_->ready()) return k;  // deadline order only
  const double best = prefill_finish_seconds(decodes, start, len, config_.max_num_batched_tokens);
  if (best <= k.slack) {
    k.urgent = prefill_finish_seconds(decodes, start, len, config_.chunked_prefill_size) > k.slack;
  } else if (config_.ttft_over_itl && config_.max_step_seconds > 0 && decodes.decode_rows > 0 &&
             prefill_finish_seconds(decodes, start, len, config_.max_num_batched_tokens, false) <= k.slack) {
    k.urgent = k.past_itl = true;  // only without the ITL bound: this chunk takes the step past it
  } else if (waited < 2 * target) {
    k.cls = 2;  // late; at 2x the target it rejoins class 1 with the earliest deadline (no starvation)
  }
  return k;
}

bool wants_prompt_logprobs(const ScheduledChunk& c) {
  return c.n_drafts == 0 && c.seq->prompt_logprobs_pending && c.start < c.seq->prompt_len;
}

int32_t logit_rows_of(const ScheduledChunk& c) {
  if (c.n_drafts > 0 || wants_prompt_logprobs(c)) return c.n_tokens;
  return c.needs_sample ? 1 : 0;
}

bool is_plain_decode_row(const ScheduledChunk& c) { return c.n_tokens == 1 && c.n_drafts == 0; }

StepShape shape_of(const SchedulePlan& plan) {
  StepShape shape;
  for (const auto& c : plan.chunks) shape.add_chunk(c.start, c.n_tokens, c.n_drafts);
  return shape;
}

model::SequenceSpan table_span(const Sequence& seq) {
  MX_CHECK_MSG(seq.table_row >= 0, "request " << seq.id << " is scheduled without a block-table row");
  model::SequenceSpan span;
  span.table_row = seq.table_row;
  span.table_lease = seq.table_lease;
  span.host_table = &seq.block_table;
  return span;
}

model::ForwardBatch build_forward_batch(const SchedulePlan& plan) {
  model::ForwardBatch batch;
  batch.token_ids.reserve(plan.n_tokens);
  batch.positions.reserve(plan.n_tokens);
  batch.seqs.reserve(plan.chunks.size());
  for (const auto& c : plan.chunks) {
    model::SequenceSpan span = table_span(*c.seq);
    span.token_begin = batch.n_tokens();
    span.n_tokens = c.n_tokens;
    span.kv_len = c.start + c.n_tokens;
    const int32_t n_real = c.n_tokens - c.n_drafts;
    batch.token_ids.insert(batch.token_ids.end(), c.seq->tokens.begin() + c.start,
                           c.seq->tokens.begin() + c.start + n_real);
    batch.token_ids.insert(batch.token_ids.end(), c.seq->drafts.begin(), c.seq->drafts.begin() + c.n_drafts);
    if (c.n_drafts > 0 && !c.seq->draft_parents.empty()) {
      // A draft tree: rows [x_last, nodes in topological order] at KV indices start.., positions by depth
      // (parent's + 1), each node attending to the context, x_last and its own ancestors (tree mask).
      MX_CHECK_EQ(n_real, 1);
      MX_CHECK_EQ(static_cast<int32_t>(c.seq->draft_parents.size()), c.n_drafts);
      MX_CHECK_LE(c.n_drafts, 64);
      span.tree_base = c.start + 1;
      span.tree_mask.assign(c.n_tokens, 0);
      batch.positions.push_back(c.start);
      for (int32_t i = 0; i < c.n_drafts; ++i) {
        const int32_t parent = c.seq->draft_parents[i];
        MX_CHECK_LT(parent, i);
        const uint64_t self = uint64_t{1} << i;
        span.tree_mask[1 + i] = parent < 0 ? self : span.tree_mask[1 + parent] | self;
        batch.positions.push_back(parent < 0 ? c.start + 1 : batch.positions[span.token_begin + 1 + parent] + 1);
      }
    } else {
      for (int32_t i = 0; i < c.n_tokens; ++i) batch.positions.push_back(c.start + i);
    }
    if (c.n_drafts > 0 || wants_prompt_logprobs(c)) {  // verification / prompt logprobs: every row's logits
      for (int32_t i = 0; i < c.n_tokens; ++i) batch.logit_rows.push_back(span.token_begin + i);
    } else if (c.needs_sample) {
      batch.logit_rows.push_back(span.token_begin + c.n_tokens - 1);
    }
    batch.seqs.push_back(std::move(span));
  }
  return batch;
}

void Scheduler::commit(const SchedulePlan& plan) {
  for (const auto& c : plan.chunks) {
    Sequence* seq = c.seq;
    MX_CHECK_EQ(seq->n_computed, c.start);
    seq->n_computed += c.n_tokens - c.n_drafts;  // accepted drafts are added by the engine after verifying
    // Record the prompt's blocks as prefill progresses (decode blocks are recorded at release).
    if (c.n_tokens > 1) cache_blocks(seq);
  }
}

}  // namespace mxserve::runtime
