// `mxserve bench-scheduler`: the runtime's own overhead -- scheduler + KV bookkeeping per step with many
// running requests and a large block pool (no model), and prefix-cache lookup cost against the number
// of cached sequences, and the ITL policy's step cost model refit. A benchmark program, not a test: prints a table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "kvcache/radix_cache.h"
#include "runtime/scheduler.h"

namespace mxserve::cli {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int cmd_bench_scheduler(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {"--running", "--blocks", "--context", "--steps"}, {});
  if (!args.is_ok()) {
    std::fprintf(stderr, "error: %s\n", args.status().to_string().c_str());
    return 2;
  }
  int64_t running = 0, n_blocks = 0, context = 0, steps = 0;
  for (auto [flag, fallback, out] : {std::tuple{"--running", 256, &running}, {"--blocks", 100000, &n_blocks},
                                     {"--context", 2000, &context}, {"--steps", 2000, &steps}}) {
    auto v = args->get_int(flag, fallback);
    if (!v.is_ok() || *v <= 0) {
      std::fprintf(stderr, "error: %s must be a positive integer\n", flag);
      return 2;
    }
    *out = *v;
  }
  if (running * ((context + 64) / 16 + 1) > n_blocks) {
    std::fprintf(stderr, "error: --blocks %lld cannot hold %lld requests of %lld tokens\n",
                 static_cast<long long>(n_blocks), static_cast<long long>(running), static_cast<long long>(context));
    return 2;
  }

  runtime::SchedulerConfig cfg;
  cfg.block_size = 16;
  cfg.max_running = running;
  cfg.max_num_batched_tokens = 8192;
  kvcache::BlockPool pool(n_blocks);
  runtime::Scheduler sched(cfg, pool);
  std::mt19937 rng(1);
  std::vector<std::unique_ptr<runtime::Sequence>> seqs;
  for (int64_t i = 0; i < running; ++i) {
    auto s = std::make_unique<runtime::Sequence>();
    s->id = static_cast<uint64_t>(i + 1);
    for (int64_t t = 0; t < context; ++t) s->tokens.push_back(static_cast<int32_t>(rng() % 150000));
    s->prompt_len = static_cast<int32_t>(context);
    sched.add_waiting(s.get());
    seqs.push_back(std::move(s));
  }
  // Prefill everything (untimed), then time decode steps.
  for (int guard = 0; guard < 100000; ++guard) {
    auto plan = sched.schedule();
    bool all_decoding = true;
    for (const auto& c : plan.chunks) all_decoding &= c.n_tokens == 1;
    sched.commit(plan);
    for (const auto& c : plan.chunks)
      if (c.needs_sample) c.seq->tokens.push_back(7);
    if (all_decoding && static_cast<int64_t>(sched.running().size()) == running) break;
  }
  std::vector<double> us;
  for (int64_t s = 0; s < steps; ++s) {
    const auto t0 = Clock::now();
    auto plan = sched.schedule();
    model::ForwardBatch batch = runtime::build_forward_batch(plan);
    sched.commit(plan);
    for (const auto& c : plan.chunks)
      if (c.needs_sample) c.seq->tokens.push_back(static_cast<int32_t>(s % 1000));
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::printf("scheduler step (schedule + build batch + commit), %lld running decodes, %lld-block pool, context %lld:\n",
              static_cast<long long>(running), static_cast<long long>(n_blocks), static_cast<long long>(context));
  std::printf("  median %.1f us   p99 %.1f us   (target < 50 us)\n", median(us),
              [&] { auto v = us; std::sort(v.begin(), v.end()); return v[v.size() * 99 / 100]; }());

  // The ITL policy's cost model refits on every engine step (full windows: 2 x 128 samples).
  {
    runtime::StepCostModel model;
    std::vector<double> fit_us;
    for (int64_t s = 0; s < 2000; ++s) {
      runtime::StepShape shape;
      for (int64_t i = 0; i < 1 + static_cast<int64_t>(rng() % 64); ++i) shape.add_chunk(rng() % 20000, 1, 0);
      if (s % 2 == 0) shape.add_chunk(rng() % 20000, 16 + rng() % 4000, 0);
      const double t = 2e-3 + 5e-5 * shape.prefill_tokens + 1e-4 * shape.decode_rows;
      const auto t0 = Clock::now();
      model.observe(shape, t);
      fit_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    std::printf("step cost model refit (StepCostModel::observe, full windows): median %.1f us\n", median(fit_us));
  }

  // Prefix lookup: cost vs prompt length and vs number of cached sequences.
  std::printf("prefix lookup (full hit), block 16:\n  %-10s %-14s %s\n", "prompt", "cached seqs", "us/lookup");
  for (int64_t n_cached : {100, 10000}) {
    for (int64_t len : {1024, 20000}) {
      kvcache::BlockPool p2(n_cached * 8 + len / 16 + 16);
      kvcache::RadixCache cache(p2, 16);
      std::vector<int32_t> target(len);
      for (auto& t : target) t = static_cast<int32_t>(rng() % 150000);
      std::vector<int32_t> blocks;
      (void)p2.allocate(len / 16, blocks);
      cache.insert(target, blocks);
      p2.unref_all(blocks);
      for (int64_t i = 0; i < n_cached; ++i) {  // other sequences: 128 tokens each
        std::vector<int32_t> other(128), ob;
        for (auto& t : other) t = static_cast<int32_t>(rng() % 150000);
        (void)p2.allocate(8, ob);
        cache.insert(other, ob);
        p2.unref_all(ob);
      }
      std::vector<double> t;
      for (int r = 0; r < 20; ++r) {
        const auto t0 = Clock::now();
        auto m = cache.match(target, len);
        t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        p2.unref_all(m.blocks);
      }
      std::printf("  %-10lld %-14lld %.1f\n", static_cast<long long>(len), static_cast<long long>(n_cached), median(t));
    }
  }
  return 0;
}

}  // namespace mxserve::cli
