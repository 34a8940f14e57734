// The TTFT target (--slo-ttft-ms, SchedulerConfig::ttft_target_seconds): the order and chunk sizes the
// scheduler picks for a burst, the flag-off FCFS decisions, the ITL bound with the target on, and a simulated
// run (the step-cost model as the clock) where more requests meet the target with the policy than without.
// Deterministic: a scripted step-cost model (fitted on samples drawn exactly from its prior) and a fake clock.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <tuple>
#include <vector>

#include "runtime/scheduler.h"
#include "runtime/step_cost_model.h"

namespace mxserve::runtime {
namespace {

// 20 ms a step + 50 us/prefill token + 1 ns/attention pair + 200 us/decode row.
constexpr StepCostCoefficients kCost{20e-3, 50e-6, 1e-9, 2e-4, 0};

StepCostModel scripted_model() {
  StepCostOptions o;
  o.prior = kCost;
  StepCostModel m(o);
  for (int i = 0; i < 32; ++i) {
    StepShape s;
    for (int d = 0; d < i % 5; ++d) s.add_chunk(100, 1, 0);
    if (i % 2 == 0) s.add_chunk(64 * i, 128 + 97 * i, 0);
    const double t = kCost.base + kCost.per_prefill_token * s.prefill_tokens +
                     kCost.per_prefill_pair * s.prefill_pairs + kCost.per_decode_row * s.decode_rows;
    m.observe(s, t);
  }
  return m;
}

Clock::time_point at(double seconds) {
  return Clock::time_point{} + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::unique_ptr<Sequence> make_seq(RequestId id, int32_t len, double arrival) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->admit_order = id;
  s->tokens.assign(len, static_cast<int32_t>(id));
  s->prompt_len = len;
  s->times.arrival = at(arrival);
  return s;
}

SchedulerConfig base_config() {
  SchedulerConfig cfg;
  cfg.block_size = 16;
  cfg.max_num_batched_tokens = 8192;
  cfg.chunked_prefill_size = 2048;
  cfg.max_running = 64;
  cfg.enable_prefix_cache = false;
  return cfg;
}

using Trace = std::vector<std::tuple<RequestId, int32_t, int32_t>>;  // (id, start, n) per chunk

Trace trace_of(const SchedulePlan& plan) {
  Trace t;
  for (const auto& c : plan.chunks) t.emplace_back(c.seq->id, c.start, c.n_tokens);
  return t;
}

void advance(Scheduler& sched, const SchedulePlan& plan) {
  sched.commit(plan);
  for (const auto& c : plan.chunks)
    if (c.needs_sample) c.seq->tokens.push_back(1);
}

TEST(SchedulerTtft, ScriptedModelIsExact) {
  const StepCostModel m = scripted_model();
  ASSERT_TRUE(m.ready());
  EXPECT_NEAR(m.coefficients().base, kCost.base, 1e-6);
  EXPECT_NEAR(m.coefficients().per_prefill_token, kCost.per_prefill_token, 1e-8);
}

// A burst at t = 0 with a 1 s target: 40k tokens (~2.9 s of prefill: late), 6000, 500, 3000 (all can make it).
// Deadlines tie, so the fewest tokens left go first; the late one goes last.
TEST(SchedulerTtft, BurstOrderAndChunkSizes) {
  const StepCostModel model = scripted_model();
  SchedulerConfig cfg = base_config();
  cfg.ttft_target_seconds = 1.0;
  kvcache::BlockPool pool(100000);
  Scheduler sched(cfg, pool);
  sched.set_cost_model(&model);
  double now = 0;
  sched.set_clock([&] { return at(now); });
  auto a = make_seq(1, 40000, 0), b = make_seq(2, 6000, 0), c = make_seq(3, 500, 0), d = make_seq(4, 3000, 0);
  for (Sequence* s : {a.get(), b.get(), c.get(), d.get()}) sched.add_waiting(s);

  SchedulePlan p1 = sched.schedule();
  EXPECT_EQ(trace_of(p1), (Trace{{3, 0, 500}, {4, 0, 1548}}));
  EXPECT_EQ(p1.ttft_late, 1);
  EXPECT_EQ(p1.ttft_urgent_chunks, 0);
  ASSERT_EQ(sched.waiting().size(), 2u);
  EXPECT_EQ(sched.waiting()[0], b.get());
  EXPECT_EQ(sched.waiting()[1], a.get()) << "the late request goes after the others";
  advance(sched, p1);
  now += model.predict(shape_of(p1));
  SchedulePlan p2 = sched.schedule();  // c decodes; d finishes its prompt; b is admitted with what is left
  EXPECT_EQ(trace_of(p2), (Trace{{3, 500, 1}, {4, 1548, 1452}, {2, 0, 596}}));
}

// Same burst, no target: FCFS in arrival order, chunks cut by the prefill cap (today's decisions), and the
// clock is never read.
TEST(SchedulerTtft, FlagOffKeepsFcfsDecisions) {
  const StepCostModel model = scripted_model();
  SchedulerConfig cfg = base_config();
  kvcache::BlockPool pool(100000);
  Scheduler sched(cfg, pool);
  sched.set_cost_model(&model);
  int clock_reads = 0;
  sched.set_clock([&] {
    ++clock_reads;
    return at(0);
  });
  auto a = make_seq(1, 40000, 0), b = make_seq(2, 6000, 0), c = make_seq(3, 500, 0), d = make_seq(4, 3000, 0);
  for (Sequence* s : {a.get(), b.get(), c.get(), d.get()}) sched.add_waiting(s);
  std::vector<Trace> traces;
  for (int step = 0; step < 4; ++step) {
    SchedulePlan p = sched.schedule();
    EXPECT_EQ(p.ttft_late, 0);
    EXPECT_EQ(p.ttft_urgent_chunks, 0);
    traces.push_back(trace_of(p));
    advance(sched, p);
  }
  EXPECT_EQ(traces[0], (Trace{{1, 0, 2048}}));
  EXPECT_EQ(traces[1], (Trace{{1, 2048, 2048}}));
  EXPECT_EQ(traces[3], (Trace{{1, 6144, 2048}}));
  EXPECT_EQ(clock_reads, 0);
}

// A request near its deadline: 3000 tokens take 0.195 s at 2048-token chunks and 0.175 s in one chunk. With
// 0.185 s left it gets the one chunk (past --chunked-prefill-size); with 0.5 s left, the usual 2048.
TEST(SchedulerTtft, NearDeadlineChunkPassesThePrefillCap) {
  const StepCostModel model = scripted_model();
  for (const double waited : {0.815, 0.5}) {
    SchedulerConfig cfg = base_config();
    cfg.ttft_target_seconds = 1.0;
    kvcache::BlockPool pool(100000);
    Scheduler sched(cfg, pool);
    sched.set_cost_model(&model);
    sched.set_clock([&] { return at(waited); });
    auto s = make_seq(1, 3000, 0);
    sched.add_waiting(s.get());
    SchedulePlan p = sched.schedule();
    ASSERT_EQ(p.chunks.size(), 1u);
    const bool urgent = waited > 0.8;
    EXPECT_EQ(p.chunks[0].n_tokens, urgent ? 3000 : 2048) << "waited " << waited;
    EXPECT_EQ(p.ttft_urgent_chunks, urgent ? 1 : 0);
    EXPECT_EQ(p.ttft_late, 0);
  }
}

// --slo-ttft-over-itl: six decodes running under a 50 ms ITL target leave ~29 ms a step for prefill (~500 tokens);
// a 6,000-token prompt with 0.45 s left to its 1 s deadline needs ~12 such steps (0.6 s: late) but one unbounded
// step (~0.34 s). Off (the default), its chunk keeps the ITL bound and it is classed late; on, it takes the whole
// prompt past the bound in one step and is counted as such.
TEST(SchedulerTtft, OverItlChunkMakesADeadlineOnlyAnUnboundedChunkMeets) {
  const StepCostModel model = scripted_model();
  for (const bool over : {false, true}) {
    SchedulerConfig cfg = base_config();
    cfg.ttft_target_seconds = 1.0;
    cfg.max_step_seconds = 0.05;
    cfg.min_prefill_chunk = 64;
    cfg.ttft_over_itl = over;
    kvcache::BlockPool pool(100000);
    Scheduler sched(cfg, pool);
    sched.set_cost_model(&model);
    double now = 0;
    sched.set_clock([&] { return at(now); });
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (RequestId id = 1; id <= 6; ++id) {
      seqs.push_back(make_seq(id, 8, 0));
      sched.add_waiting(seqs.back().get());
    }
    advance(sched, sched.schedule());  // the six prefills; they decode from now on
    now = 0.55;
    seqs.push_back(make_seq(7, 6000, 0));
    sched.add_waiting(seqs.back().get());
    SchedulePlan p = sched.schedule();
    int decodes = 0;
    int64_t prefill = 0;
    for (const auto& c : p.chunks) {
      if (c.n_tokens == 1) ++decodes;
      else prefill += c.n_tokens;
    }
    EXPECT_EQ(decodes, 6);
    if (over) {
      EXPECT_EQ(prefill, 6000) << "the whole prompt in one step, past the ITL bound";
      EXPECT_EQ(p.ttft_past_itl_chunks, 1);
      EXPECT_EQ(p.ttft_late, 0);
      EXPECT_GT(model.predict(shape_of(p)), cfg.max_step_seconds);
      EXPECT_LE(now + model.predict(shape_of(p)), 1.0) << "and it meets the deadline";
    } else {
      EXPECT_LE(prefill, 1000) << "the ITL bound holds";
      EXPECT_LE(model.predict(shape_of(p)), cfg.max_step_seconds + 1e-9);
      EXPECT_EQ(p.ttft_past_itl_chunks, 0);
      EXPECT_EQ(p.ttft_late, 1);
    }
  }
}

// With decodes running and the ITL target on, urgent and ordered prefills still keep every step with decodes
// within the target (above the --min-prefill-chunk floor), and every decode runs every step. Two regimes: a
// tight ITL target (chunks far below the prefill cap: nothing can be urgent, many prefills late) and a loose
// one (the ITL bound allows chunks past the prefill cap: near-deadline chunks take them).
void run_itl_scenario(double itl, double ttft, int period, bool expect_urgent) {
  const StepCostModel model = scripted_model();
  SchedulerConfig cfg = base_config();
  cfg.ttft_target_seconds = ttft;
  cfg.max_step_seconds = itl;
  cfg.min_prefill_chunk = 64;
  kvcache::BlockPool pool(100000);
  Scheduler sched(cfg, pool);
  sched.set_cost_model(&model);
  double now = 0;
  sched.set_clock([&] { return at(now); });
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (RequestId id = 1; id <= 6; ++id) {
    seqs.push_back(make_seq(id, 8, 0));
    sched.add_waiting(seqs.back().get());
  }
  int limited = 0, urgent = 0, late = 0;
  for (int step = 0; step < 120; ++step) {
    if (step % period == 0) {
      seqs.push_back(make_seq(100 + step, 500 + 700 * (step % 7), now));
      sched.add_waiting(seqs.back().get());
    }
    SchedulePlan p = sched.schedule();
    EXPECT_LE(p.n_tokens, cfg.max_num_batched_tokens);
    int decodes = 0;
    for (const auto& c : p.chunks) decodes += c.n_tokens == 1;
    if (step > 0) EXPECT_GE(decodes, 6) << "step " << step;
    if (p.itl_limited && p.n_prefill_tokens > cfg.min_prefill_chunk) {
      ++limited;
      EXPECT_LE(model.predict(shape_of(p)), cfg.max_step_seconds + 1e-9) << "step " << step;
    }
    urgent += p.ttft_urgent_chunks;
    late += p.ttft_late > 0;
    advance(sched, p);
    now += model.predict(shape_of(p));
  }
  std::printf("ITL %g s, TTFT %g s: %d ITL-limited steps, %d urgent chunks, %d steps with late prefills\n", itl,
              ttft, limited, urgent, late);
  EXPECT_GT(limited, 10);
  if (expect_urgent) EXPECT_GT(urgent, 0) << "the scenario must exercise urgent chunks";
  else EXPECT_GT(late, 0) << "the scenario must exercise late prefills";
}

TEST(SchedulerTtft, ItlBoundHoldsForRunningDecodes) {
  run_itl_scenario(0.06, 0.3, 3, false);
  run_itl_scenario(0.2, 0.3, 2, true);
}

// Simulated run: requests arrive on a schedule; each step takes the cost model's prediction; a request meets
// the target when its first token is sampled within it. Returns how many met it.
int simulate(double ttft_target, const std::vector<std::pair<double, int32_t>>& arrivals, int out_tokens) {
  const StepCostModel model = scripted_model();
  SchedulerConfig cfg = base_config();
  cfg.ttft_target_seconds = ttft_target;
  kvcache::BlockPool pool(100000);
  Scheduler sched(cfg, pool);
  sched.set_cost_model(&model);
  double now = 0;
  sched.set_clock([&] { return at(now); });
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (size_t i = 0; i < arrivals.size(); ++i)
    seqs.push_back(make_seq(static_cast<RequestId>(i + 1), arrivals[i].second, arrivals[i].first));
  size_t next = 0, done = 0;
  int met = 0;
  for (int step = 0; step < 100000 && done < seqs.size(); ++step) {
    while (next < seqs.size() && arrivals[next].first <= now) sched.add_waiting(seqs[next++].get());
    SchedulePlan p = sched.schedule();
    if (p.empty()) {
      EXPECT_LT(next, seqs.size()) << "nothing to run and nothing to arrive";
      if (next >= seqs.size()) break;
      now = arrivals[next].first;
      continue;
    }
    now += model.predict(shape_of(p));
    sched.commit(p);
    for (const auto& c : p.chunks) {
      if (!c.needs_sample) continue;
      Sequence* s = c.seq;
      if (s->n_generated() == 0) met += now - arrivals[s->id - 1].first <= 1.0;
      s->tokens.push_back(1);
      if (s->n_generated() >= out_tokens) {
        sched.remove(s);
        sched.release(s);
        ++done;
      }
    }
  }
  EXPECT_EQ(done, seqs.size());
  return met;
}

TEST(SchedulerTtft, SimulatedRunMeetsTheTargetMoreOften) {
  // A 40k-token prompt (~2.9 s of prefill alone: it cannot make a 1 s target) arrives first, then a stream of
  // short and mid-length prompts. FCFS lets the long one delay all of them; the policy serves it last.
  std::vector<std::pair<double, int32_t>> arrivals = {{0.0, 40000}};
  for (int i = 0; i < 12; ++i) arrivals.push_back({0.05 + 0.15 * i, i % 3 == 0 ? 3000 : 800});
  const int fcfs = simulate(0, arrivals, 8);
  const int slo = simulate(1.0, arrivals, 8);
  std::printf("TTFT <= 1 s: %d of %zu requests FCFS, %d with --slo-ttft-ms 1000\n", fcfs, arrivals.size(), slo);
  EXPECT_GT(slo, fcfs);
  EXPECT_GE(slo, 12);
}

}  // namespace
}  // namespace mxserve::runtime
