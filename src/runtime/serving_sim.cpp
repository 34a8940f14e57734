// simulate_serving (serving_sim.h): the real Scheduler in virtual time under a fixed step-cost model.
#include "runtime/serving_sim.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "kvcache/block_pool.h"

namespace mxserve::runtime {
namespace {

Clock::time_point at(double seconds) {
  return Clock::time_point{} + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

double predict(const StepCostCoefficients& c, const StepShape& s) {
  return c.base + c.per_prefill_token * s.prefill_tokens + c.per_prefill_pair * s.prefill_pairs +
         c.per_decode_row * s.decode_rows + c.per_decode_kv_token * s.decode_kv_tokens;
}

// The scheduler's ITL bound and TTFT target read a StepCostModel: one fitted on samples drawn exactly from the
// fixed coefficients, with those coefficients as its prior, predicts them (the fit has nothing to disagree with).
StepCostModel fixed_model(const StepCostCoefficients& c) {
  StepCostOptions o;
  o.prior = c;
  StepCostModel m(o);
  for (int i = 0; i < 64; ++i) {
    StepShape s;
    for (int d = 0; d < 1 + i % 7; ++d) s.add_chunk(1000 + 997 * d + 131 * i, 1, 0);
    if (i % 2 == 0) s.add_chunk(512 * i, 64 + 193 * i, 0);
    m.observe(s, predict(c, s));
  }
  return m;
}

}  // namespace

Result<SimResult> simulate_serving(const SimConfig& config, const SimWorkload& w, int64_t max_steps) {
  if (w.input_len < 2 || w.output_len < 1 || w.prefix_groups < 1 || w.num_requests < 1 || w.warmup < 0 ||
      !(w.rate > 0) || !(w.cache_hit_rate >= 0 && w.cache_hit_rate < 1))
    return invalid_argument("simulate: the workload needs input_len >= 2, output_len >= 1, prefix_groups >= 1, "
                            "num_requests >= 1, warmup >= 0, rate > 0 and cache_hit_rate in [0, 1)");
  const int64_t bs = config.scheduler.block_size;
  const int64_t per_request = (w.input_len + w.output_len + bs - 1) / bs + 1;
  if (per_request > config.kv_blocks)
    return invalid_argument("simulate: the KV pool of " + std::to_string(config.kv_blocks) + " blocks (" +
                            std::to_string(config.kv_blocks * bs) + " tokens) cannot hold one request of " +
                            std::to_string(w.input_len) + " + " + std::to_string(w.output_len) +
                            " tokens: raise --kv-tokens");

  kvcache::BlockPool pool(config.kv_blocks);
  Scheduler sched(config.scheduler, pool);
  const StepCostModel model = fixed_model(config.cost);
  sched.set_cost_model(&model);
  double now = 0;
  sched.set_clock([&now] { return at(now); });

  // Prompts: group g's prefix tokens, then the request's own (distinct everywhere, so only the prefix is shared).
  const int64_t total = w.warmup + w.num_requests;
  const int64_t prefix_len = static_cast<int64_t>(std::llround(w.cache_hit_rate * static_cast<double>(w.input_len)));
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<double> arrival(total), first(total, -1), finish(total, -1), last_token(total, -1);
  for (int64_t i = 0; i < total; ++i) {
    auto s = std::make_unique<Sequence>();
    s->id = static_cast<RequestId>(i + 1);
    s->admit_order = static_cast<uint64_t>(i + 1);
    const int64_t g = i % w.prefix_groups;
    s->tokens.reserve(w.input_len + w.output_len);
    for (int64_t j = 0; j < prefix_len; ++j) s->tokens.push_back(static_cast<int32_t>(1 + g * w.input_len + j));
    for (int64_t j = prefix_len; j < w.input_len; ++j)
      s->tokens.push_back(static_cast<int32_t>(1 + (w.prefix_groups + i) * w.input_len + j));
    s->prompt_len = static_cast<int32_t>(w.input_len);
    arrival[i] = static_cast<double>(i) / w.rate;
    s->times.arrival = at(arrival[i]);
    seqs.push_back(std::move(s));
  }

  SimResult out;
  double prefill_time = 0, all_time = 0;
  int64_t next = 0, done = 0;
  for (; out.steps < max_steps && done < total; ++out.steps) {
    while (next < total && arrival[next] <= now) sched.add_waiting(seqs[next++].get());
    SchedulePlan plan = sched.schedule();
    out.max_running = std::max<int64_t>(out.max_running, static_cast<int64_t>(sched.running().size()));
    out.max_waiting = std::max<int64_t>(out.max_waiting, static_cast<int64_t>(sched.waiting().size()));
    if (plan.empty()) {
      if (next >= total)
        return internal_error("simulate: nothing could be scheduled with " + std::to_string(total - done) +
                              " request(s) left (the KV pool is too small for the running set)");
      now = std::max(now, arrival[next]);  // idle until the next arrival
      --out.steps;
      continue;
    }
    const StepShape shape = shape_of(plan);
    const double t = predict(config.cost, shape);
    prefill_time += config.cost.per_prefill_token * shape.prefill_tokens + config.cost.per_prefill_pair * shape.prefill_pairs;
    all_time += t;
    out.max_step = std::max(out.max_step, t);
    out.past_itl_chunks += plan.ttft_past_itl_chunks;
    now += t;
    sched.commit(plan);
    for (const auto& c : plan.chunks) {
      if (!c.needs_sample) continue;
      Sequence* s = c.seq;
      const int64_t i = static_cast<int64_t>(s->id) - 1;
      if (s->n_generated() == 0) first[i] = now;
      if (last_token[i] >= 0 && i >= w.warmup) out.itl_max = std::max(out.itl_max, now - last_token[i]);
      last_token[i] = now;
      s->tokens.push_back(1);
      if (s->n_generated() >= w.output_len) {
        finish[i] = now;
        sched.remove(s);
        sched.release(s);
        ++done;
      }
    }
  }
  out.completed = done == total;
  out.preemptions = sched.counters().preemptions;
  out.prefill_share = all_time > 0 ? prefill_time / all_time : 0;

  double tpot_sum = 0, cached = 0, prompt = 0, last_finish = 0;
  int64_t finished = 0;
  for (int64_t i = w.warmup; i < total; ++i) {
    SimRequestRecord r;
    r.arrival = arrival[i];
    r.first_token = first[i];
    r.finish = finish[i];
    r.cached_tokens = std::max<int32_t>(seqs[i]->cached_tokens, 0);
    r.preemptions = seqs[i]->n_preemptions;
    out.requests.push_back(r);
    cached += static_cast<double>(r.cached_tokens);
    prompt += static_cast<double>(w.input_len);
    if (r.finish >= 0) {
      ++finished;
      last_finish = std::max(last_finish, r.finish);
      if (w.output_len > 1) tpot_sum += (r.finish - r.first_token) / static_cast<double>(w.output_len - 1);
    }
  }
  out.tpot_mean = finished > 0 ? tpot_sum / static_cast<double>(finished) : 0;
  const double span = last_finish - arrival[w.warmup];
  out.sustained_rate = span > 0 ? static_cast<double>(finished) / span : 0;
  out.cached_share = prompt > 0 ? cached / prompt : 0;
  return out;
}

}  // namespace mxserve::runtime
