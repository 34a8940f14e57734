// `mxserve simulate`: the scheduler in virtual time under a fixed step-cost model (runtime/serving_sim.h) over a
// rate sweep of the shared-prefix workload; prints the bench's table and the knee the model predicts. Its times are
// the cost model's, not a measurement: use it to see what limits the knee and which flags move it before spending
// GPU time (docs/scheduling.md "Simulating the knee"). With --fit-step-log it simulates nothing: it fits the step cost
// model to a `serve --step-log` file and prints the fits, their errors and the --step-cost to simulate with
// (docs/scheduling.md "Recording the steps").
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cli/args.h"
#include "bench/knee.h"
#include "bench/metrics.h"
#include "cli/commands.h"
#include "runtime/serving_sim.h"
#include "runtime/step_log.h"

namespace mxserve::cli {
namespace {

// "a,b,c" -> doubles; errors name the flag and the item.
Result<std::vector<double>> parse_doubles(const std::string& text, const std::string& flag) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || end == nullptr || *end != '\0' || !std::isfinite(v))
      return invalid_argument(flag + ": '" + item + "' is not a number (a comma-separated list)");
    out.push_back(v);
  }
  if (out.empty()) return invalid_argument(flag + " is empty");
  return out;
}

// The bench's numbers for the simulated requests, so that the knee is judged by the same rule as
// `mxserve bench --find-knee` (bench/knee.h: TTFT p95, success, first- vs last-quarter TTFT, the queue after
// the ramp): each simulated request becomes the record a client would have written.
bench::RateMetrics metrics_of(const runtime::SimResult& r, double rate, int64_t output_len) {
  std::vector<bench::RequestRecord> records;
  for (const auto& q : r.requests) {
    bench::RequestRecord rec;
    rec.index = static_cast<int64_t>(records.size());
    rec.scheduled_s = rec.sent_s = q.arrival;
    rec.ok = q.finish >= 0;
    if (rec.ok) {
      rec.first_token_s = q.first_token, rec.last_token_s = rec.end_s = q.finish;
      rec.output_tokens = output_len;
    } else {
      rec.error = "simulate: not finished within the step limit";
    }
    records.push_back(std::move(rec));
  }
  return bench::compute_rate_metrics(records, rate, /*max_concurrency=*/0);
}

int fail(const Status& s) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return 2;
}

std::string describe(const runtime::StepCostCoefficients& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%.4g ms + %.4g us/prefill token + %.4g ns/prefill pair + %.4g us/decode row + %.4g ns/decode KV token",
                1e3 * c.base, 1e6 * c.per_prefill_token, 1e9 * c.per_prefill_pair, 1e6 * c.per_decode_row,
                1e9 * c.per_decode_kv_token);
  return buf;
}

// --fit-step-log FILE: the model's online fit (replayed as the engine fits it) and one batch fit over the whole
// log, with their relative errors per kind of step (runtime/step_log.h).
int fit_step_log(const std::string& path) {
  auto records = runtime::read_step_log(path);
  if (!records.is_ok()) return fail(records.status());
  if (records->empty()) return fail(invalid_argument(path + ": no step records (is it a `serve --step-log` file?)"));
  const runtime::StepLogReport r = runtime::evaluate_step_log(*records);
  std::printf("step log %s: %lld records (%lld decode-only eager, %lld decode-only graph, %lld with prefill)\n\n",
              path.c_str(), static_cast<long long>(r.records), static_cast<long long>(r.batch_decode_eager.n),
              static_cast<long long>(r.batch_decode_graph.n), static_cast<long long>(r.batch_with_prefill.n));
  std::printf("online fit (replayed as the engine fits it, its state after the last record): %s\n",
              describe(r.online).c_str());
  std::printf("batch fit (every record alike, one fit): %s\n\n", describe(r.batch).c_str());
  std::printf("| fit | steps | n | mean error | median error |\n|---|---|---:|---:|---:|\n");
  const std::tuple<const char*, const char*, const runtime::StepLogClassError*> rows[] = {
      {"online", "decode-only, eager", &r.online_decode_eager},
      {"online", "decode-only, graph", &r.online_decode_graph},
      {"online", "with prefill", &r.online_with_prefill},
      {"batch", "decode-only, eager", &r.batch_decode_eager},
      {"batch", "decode-only, graph", &r.batch_decode_graph},
      {"batch", "with prefill", &r.batch_with_prefill}};
  for (const auto& [fit, steps, e] : rows) {
    if (e->n == 0)
      std::printf("| %s | %s | 0 | - | - |\n", fit, steps);
    else
      std::printf("| %s | %s | %lld | %.1f%% | %.1f%% |\n", fit, steps, static_cast<long long>(e->n),
                  100 * e->mean_rel_error, 100 * e->median_rel_error);
  }
  std::printf("\nonline: each step predicted by the replayed model before it observed that step (what the scheduler "
              "saw), from the first step it was ready; batch: every step predicted by the batch fit. Error: |measured - "
              "predicted| / measured.\n");
  const runtime::StepCostCoefficients& b = r.batch;
  std::printf("\nsimulate with the batch fit: mxserve simulate --step-cost %.6g,%.6g,%.6g,%.6g,%.6g\n", b.base,
              b.per_prefill_token, b.per_prefill_pair, b.per_decode_row, b.per_decode_kv_token);
  return 0;
}

}  // namespace

int cmd_simulate(int argc, char** argv) {
  const std::set<std::string> sim_value_flags = {
      "--input-len", "--output-len", "--cache-hit-rate", "--num-prefix-groups", "--rates", "--num-requests",
      "--warmup", "--kv-tokens", "--block-size", "--max-num-seqs", "--max-num-batched-tokens",
      "--chunked-prefill-size", "--max-itl-ms", "--min-prefill-chunk", "--slo-ttft-ms", "--step-cost",
      "--ttft-knee-ms"};
  const std::set<std::string> sim_bool_flags = {"--no-enable-prefix-caching", "--slo-ttft-over-itl"};
  std::set<std::string> value_flags = sim_value_flags;
  value_flags.insert("--fit-step-log");
  auto args = Args::parse(argc, argv, value_flags, sim_bool_flags);
  if (!args.is_ok()) return fail(args.status());
  const Args& a = *args;
  if (a.has("--fit-step-log")) {
    for (const auto* flags : {&sim_value_flags, &sim_bool_flags})
      for (const std::string& f : *flags)
        if (a.has(f))
          return fail(invalid_argument("--fit-step-log fits a step log and simulates nothing: drop " + f));
    return fit_step_log(a.get_or("--fit-step-log", ""));
  }
  runtime::SimWorkload w;
  runtime::SimConfig c;
  int64_t kv_tokens = 0, max_itl_ms = 0, slo_ttft_ms = 0, knee_ms = 0;
  for (auto [flag, fallback, out] :
       {std::tuple{"--input-len", int64_t{20000}, &w.input_len}, {"--output-len", int64_t{1000}, &w.output_len},
        {"--num-prefix-groups", int64_t{4}, &w.prefix_groups}, {"--num-requests", int64_t{30}, &w.num_requests},
        {"--kv-tokens", int64_t{341000}, &kv_tokens}, {"--block-size", int64_t{16}, &c.scheduler.block_size},
        {"--max-num-seqs", int64_t{256}, &c.scheduler.max_running},
        {"--max-num-batched-tokens", int64_t{8192}, &c.scheduler.max_num_batched_tokens},
        {"--chunked-prefill-size", int64_t{8192}, &c.scheduler.chunked_prefill_size},
        {"--min-prefill-chunk", int64_t{256}, &c.scheduler.min_prefill_chunk}, {"--max-itl-ms", int64_t{50}, &max_itl_ms},
        {"--slo-ttft-ms", int64_t{0}, &slo_ttft_ms}, {"--ttft-knee-ms", int64_t{5000}, &knee_ms}}) {
    auto v = a.get_int(flag, fallback);
    if (!v.is_ok()) return fail(v.status());
    const bool may_be_zero = std::string(flag) == "--max-itl-ms" || std::string(flag) == "--slo-ttft-ms";
    if (*v < 0 || (*v == 0 && !may_be_zero))
      return fail(invalid_argument(std::string(flag) + " must be " + (may_be_zero ? ">= 0" : "> 0") + ", got " +
                                   std::to_string(*v)));
    *out = *v;
  }
  auto warmup = a.get_int("--warmup", w.prefix_groups);
  if (!warmup.is_ok() || *warmup < 0) return fail(invalid_argument("--warmup must be >= 0"));
  w.warmup = *warmup;
  auto hit = a.get_double("--cache-hit-rate", 0.6);
  if (!hit.is_ok() || !(*hit >= 0 && *hit < 1)) return fail(invalid_argument("--cache-hit-rate must be in [0, 1)"));
  w.cache_hit_rate = *hit;
  auto rates = parse_doubles(a.get_or("--rates", "0.1,0.2,0.3,0.4,0.5"), "--rates");
  if (!rates.is_ok()) return fail(rates.status());
  for (double r : *rates)
    if (!(r > 0)) return fail(invalid_argument("--rates: every rate must be > 0 req/s"));
  // The default: GLM-4.5-Air's whole-model step on one H200 as the engine fitted it (docs/perf/seed-workload.md,
  // session 5): 26.6 ms + 190 us / prefill token + 6.87 ns / attention pair + 210 us / decode row.
  auto cost = parse_doubles(a.get_or("--step-cost", "0.0266,190e-6,6.87e-9,210e-6,0"), "--step-cost");
  if (!cost.is_ok()) return fail(cost.status());
  if (cost->size() != 5)
    return fail(invalid_argument("--step-cost takes 5 numbers: base s, s per prefill token, s per attention pair, "
                                 "s per decode row, s per decode KV token"));
  for (double v : *cost)
    if (v < 0) return fail(invalid_argument("--step-cost: coefficients are >= 0"));
  c.cost = {(*cost)[0], (*cost)[1], (*cost)[2], (*cost)[3], (*cost)[4]};
  c.kv_blocks = kv_tokens / c.scheduler.block_size;
  c.scheduler.max_step_seconds = static_cast<double>(max_itl_ms) / 1e3;
  c.scheduler.ttft_target_seconds = static_cast<double>(slo_ttft_ms) / 1e3;
  c.scheduler.enable_prefix_cache = !a.has("--no-enable-prefix-caching");
  c.scheduler.ttft_over_itl = a.has("--slo-ttft-over-itl");
  if (c.scheduler.ttft_over_itl && slo_ttft_ms == 0)
    return fail(invalid_argument("--slo-ttft-over-itl needs --slo-ttft-ms (the deadline it protects)"));
  c.scheduler.chunked_prefill_size = std::min(c.scheduler.chunked_prefill_size, c.scheduler.max_num_batched_tokens);
  const double knee_s = static_cast<double>(knee_ms) / 1e3;

  std::printf("simulated (step-cost model, not a measurement): %lld in / %lld out, %.0f%% shared prefix in %lld "
              "groups, %lld requests a rate (+%lld warm-up), KV pool %lld tokens, --max-itl-ms %lld, --slo-ttft-ms "
              "%lld; step = %.4g s + %.3g s/prefill token + %.3g s/pair + %.3g s/decode row + %.3g s/KV token\n\n",
              static_cast<long long>(w.input_len), static_cast<long long>(w.output_len), 100 * w.cache_hit_rate,
              static_cast<long long>(w.prefix_groups), static_cast<long long>(w.num_requests),
              static_cast<long long>(w.warmup), static_cast<long long>(c.kv_blocks * c.scheduler.block_size),
              static_cast<long long>(max_itl_ms), static_cast<long long>(slo_ttft_ms), c.cost.base,
              c.cost.per_prefill_token, c.cost.per_prefill_pair, c.cost.per_decode_row, c.cost.per_decode_kv_token);
  std::printf("| offered req/s | sustained | TTFT p50 / p95 / p99 (s) | TPOT mean (ms) | longest ITL (s) | max running "
              "| max waiting | preemptions | prefill share | cached | longest step (s) | chunks past the ITL bound | knee criterion |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  bench::KneeCriteria criteria;
  criteria.slo_ttft_p95_s = knee_s;
  double knee = 0;
  bool knee_broken = false;
  // The rates are independent runs (each its own scheduler and pool): simulated on up to one thread per core,
  // printed in order.
  std::vector<std::optional<Result<runtime::SimResult>>> runs(rates->size());
  {
    const size_t n_threads = std::max<size_t>(1, std::min<size_t>(rates->size(), std::thread::hardware_concurrency()));
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    for (size_t t = 0; t < n_threads; ++t)
      threads.emplace_back([&] {
        for (size_t i = next++; i < rates->size(); i = next++) {
          runtime::SimWorkload wi = w;
          wi.rate = (*rates)[i];
          runs[i] = runtime::simulate_serving(c, wi);
        }
      });
    for (auto& t : threads) t.join();
  }
  for (size_t i = 0; i < rates->size(); ++i) {
    const double rate = (*rates)[i];
    const Result<runtime::SimResult>& r = *runs[i];
    if (!r.is_ok()) return fail(r.status());
    const bench::RateMetrics m = metrics_of(*r, rate, w.output_len);
    const bench::Verdict v = bench::judge(m, criteria);
    if (v.pass && !knee_broken) knee = rate;
    if (!v.pass) knee_broken = true;
    std::printf("| %.3g | %.3f | %.2f / %.2f / %.2f | %.1f | %.2f | %lld | %lld | %lld | %.0f%% | %.0f%% | %.2f | %lld | %s |\n", rate,
                r->sustained_rate, m.ttft.p50, m.ttft.p95, m.ttft.p99, 1e3 * r->tpot_mean, r->itl_max,
                static_cast<long long>(r->max_running), static_cast<long long>(r->max_waiting),
                static_cast<long long>(r->preemptions), 100 * r->prefill_share, 100 * r->cached_share, r->max_step,
                static_cast<long long>(r->past_itl_chunks), v.pass ? "met" : v.reason.c_str());
  }
  if (knee > 0)
    std::printf("\nknee (the bench's rule: TTFT p95 <= %.3g s, >= %.0f%% success, last-quarter TTFT p50 <= %.2gx the "
                "first quarter's, requests in flight settled after the ramp; rates in order): %.3g req/s\n", knee_s,
                100 * criteria.min_success, criteria.max_growth, knee);
  else
    std::printf("\nknee: none -- the first rate tried (%.3g req/s) misses it (rates are judged in the order given; the "
                "knee is the last rate met before the first miss)\n", rates->front());
  return 0;
}

}  // namespace mxserve::cli
