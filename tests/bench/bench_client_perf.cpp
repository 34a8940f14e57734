// Client benchmark (a program, not a test; docs/perf/bench-client.md): the bench client against the
// in-process fast fake server on 127.0.0.1, both sharing the machine's cores.
//   bench_client_perf [--rate R] [--duration S] [--tokens K] [--gap-ms G] [--ttft-ms T]
//                     [--http-client native|curl] [--pin 1] (server thread on CPU 1, client on CPU 0)
//                     [--server-batch-us 200] (the fake server sends events due within 200 us together)
// Open-loop Poisson at R req/s; each request streams K token events G ms apart, so about
// R*(T + (K-1)G) streams are open at once and R*K events/s arrive.
// Timing error (per SSE event) = the client's stamp of the event (native engine: the kernel's
// receive time of the segment, SO_TIMESTAMPNS; curl engine: when curl hands over the bytes) - the
// server's stamp (CLOCK_MONOTONIC just before its send() of that event). Read lag (native engine)
// = when the loop read the bytes - their kernel receive time: the loop's headroom.
// Send lag (per request) = actual send - scheduled arrival.
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench/arrivals.h"
#include "bench/load_runner.h"
#include "bench/metrics.h"
#include "fake_openai_server.h"

using namespace mxserve::bench;
using namespace mxserve::bench::testing;

static double thread_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// Per-second CPU accounting: jiffies used by the whole machine and by this process, so each second
// of the run can be labelled with how much CPU other processes took from the 2 cores.
struct CpuSample {
  double t = 0;
  long long machine_busy = 0, machine_total = 0, self = 0;
};

static CpuSample sample_cpu(double t) {
  CpuSample c;
  c.t = t;
  if (FILE* f = std::fopen("/proc/stat", "r")) {
    long long v[10] = {0};
    if (std::fscanf(f, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                    &v[7]) == 8) {
      c.machine_busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
      c.machine_total = c.machine_busy + v[3] + v[4];
    }
    std::fclose(f);
  }
  if (FILE* f = std::fopen("/proc/self/stat", "r")) {
    char buf[1024];
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    const char* p = std::strrchr(buf, ')');
    long long utime = 0, stime = 0;
    // Fields after ')': state(3) ... utime is field 14, stime 15.
    if (p && std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lld %lld", &utime, &stime) == 2)
      c.self = utime + stime;
    std::fclose(f);
  }
  return c;
}

static void pin_to_cpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);
}

int main(int argc, char** argv) {
  double rate = 1000, duration = 10, gap_ms = 20, ttft_ms = 10;
  int64_t tokens = 100;
  HttpClientKind client = HttpClientKind::kNative;
  bool pin = false;
  double batch_us = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const double v = std::atof(argv[i + 1]);
    if (a == "--rate") rate = v;
    else if (a == "--duration") duration = v;
    else if (a == "--tokens") tokens = static_cast<int64_t>(v);
    else if (a == "--gap-ms") gap_ms = v;
    else if (a == "--ttft-ms") ttft_ms = v;
    else if (a == "--pin") pin = v != 0;
    else if (a == "--server-batch-us") batch_us = v;
    else if (a == "--http-client") client = std::string(argv[i + 1]) == "curl" ? HttpClientKind::kCurl : HttpClientKind::kNative;
    else { std::fprintf(stderr, "unknown flag %s\n", a.c_str()); return 2; }
  }
  FakeOpenAiServer server([&](const FakeRequest&) {
    FakePlan p;
    p.ttft_s = ttft_ms * 1e-3;
    p.gap_s = gap_ms * 1e-3;
    p.tokens = tokens;
    p.prompt_tokens = 8;
    p.stamp = true;
    p.empty_role_chunk = false;
    return p;
  });
  server.batch_window_ns = static_cast<int64_t>(batch_us * 1e3);
  if (pin) pin_to_cpu(1);  // the server thread inherits CPU 1; the client then moves to CPU 0
  if (!server.start()) { std::fprintf(stderr, "server start failed\n"); return 1; }
  if (pin) pin_to_cpu(0);
  HttpTarget t;
  t.url = server.base_url() + "/v1/chat/completions";
  t.request_timeout_s = 60;
  LoadPlan plan;
  ArrivalConfig ac;
  ac.seed = 1;
  auto sched = make_arrival_schedule(ac, rate, -1, duration, 0);
  if (!sched.is_ok()) { std::fprintf(stderr, "%s\n", sched.status().to_string().c_str()); return 2; }
  plan.offsets = std::move(sched).value();
  const std::string body = R"({"model":"fake","messages":[{"role":"user","content":"the quick brown fox"}],"max_tokens":)" +
                           std::to_string(tokens) + R"(,"stream":true,"stream_options":{"include_usage":true}})";
  BodySource src = [&](int64_t) -> mxserve::Result<RequestSpec> {
    RequestSpec s;
    s.body = body;
    return s;
  };
  RunOptions opt;
  opt.timing_probe = true;
  opt.http_client = client;
  opt.progress_interval_s = 2.0;
  opt.progress = [](const Progress& p) {
    std::fprintf(stderr, "  %5.1fs sent %lld done %lld failed %lld in-flight %lld\n", p.elapsed_s,
                 static_cast<long long>(p.sent), static_cast<long long>(p.done), static_cast<long long>(p.failed),
                 static_cast<long long>(p.in_flight));
  };
  std::vector<CpuSample> cpu_samples;
  std::atomic<bool> sampling{true};
  const int64_t t0 = monotonic_ns();
  std::thread sampler([&] {
    while (sampling.load()) {
      cpu_samples.push_back(sample_cpu(static_cast<double>(monotonic_ns() - t0) * 1e-9));
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  });
  const double cpu0 = thread_cpu_s();
  auto r = run_load(t, plan, src, opt);
  sampling = false;
  sampler.join();
  const double cpu = thread_cpu_s() - cpu0;
  const double server_cpu = server.thread_cpu_seconds();
  if (!r.is_ok()) { std::fprintf(stderr, "%s\n", r.status().to_string().c_str()); return 1; }
  int64_t events = 0, ok = 0;
  double first_token = 1e300, last_token = 0;
  for (const RequestRecord& rec : r->records) {
    events += rec.token_chunks;
    ok += rec.ok;
    if (rec.first_token_s >= 0) first_token = std::min(first_token, rec.first_token_s);
    last_token = std::max(last_token, rec.last_token_s);
  }
  // Steady-state event rate: events while the schedule runs (excluding ramp-up/drain).
  const double ramp = ttft_ms * 1e-3 + (tokens - 1) * gap_ms * 1e-3;
  int64_t steady = 0;
  for (const RequestRecord& rec : r->records) {
    if (rec.first_token_s < 0) continue;
    double tt = rec.first_token_s;
    if (tt >= ramp && tt < duration) ++steady;
    for (float g : rec.itl_s) {
      tt += g;
      if (tt >= ramp && tt < duration) ++steady;
    }
  }
  const Dist err = summarize(r->probe_error_s);
  const Dist lag = summarize(r->send_lag_s);
  const double steady_window = duration - ramp;
  std::printf("requests %zu ok %lld  max in flight %lld  wall %.2f s  client thread CPU %.2f s (%.0f%% of one core)\n",
              r->records.size(), static_cast<long long>(ok), static_cast<long long>(r->max_in_flight), r->wall_s, cpu,
              100 * cpu / r->wall_s);
  std::printf("server thread CPU %.2f s (%.0f%% of one core); machine load average now: ", server_cpu,
              100 * server_cpu / r->wall_s);
  std::fflush(stdout);
  [[maybe_unused]] int rc = std::system("cat /proc/loadavg");
  std::printf("SSE token events %lld  overall %.0f/s  steady-state %.0f/s (window %.1f-%.1f s)\n",
              static_cast<long long>(events), events / (last_token - first_token), steady / steady_window, ramp, duration);
  std::printf("timing error (client stamp - server send), ms: p50 %.3f  p90 %.3f  p99 %.3f  max %.3f  (n=%lld)\n",
              err.p50 * 1e3, err.p90 * 1e3, err.p99 * 1e3, err.max * 1e3, static_cast<long long>(err.count));
  std::printf("send lag (sent - scheduled), ms: p50 %.3f  p99 %.3f  max %.3f\n", lag.p50 * 1e3, lag.p99 * 1e3, lag.max * 1e3);
  if (!r->read_lag_s.empty()) {
    const Dist rl = summarize(r->read_lag_s);
    std::printf("read lag (loop read time - kernel receive stamp; headroom, not error), ms: p50 %.3f  p99 %.3f  max %.3f\n",
                rl.p50 * 1e3, rl.p99 * 1e3, rl.max * 1e3);
  }
  // Per second of the steady window: events, timing error p50/p99, and the share of the 2 cores
  // that other processes used in that second (machine busy minus this process).
  std::printf("per second (steady window): t  events  err_p50_ms  err_p99_ms  others_cpu%%\n");
  std::vector<Dist> quiet, busy;
  for (size_t k = 0; k + 1 < cpu_samples.size(); ++k) {
    const CpuSample& a = cpu_samples[k];
    const CpuSample& b = cpu_samples[k + 1];
    if (a.t < ramp || b.t > duration) continue;
    std::vector<double> errs;
    for (size_t i = 0; i < r->probe_time_s.size(); ++i)
      if (r->probe_time_s[i] >= a.t && r->probe_time_s[i] < b.t) errs.push_back(r->probe_error_s[i]);
    const long long total = b.machine_total - a.machine_total;
    const double others = total > 0 ? 100.0 * static_cast<double>((b.machine_busy - a.machine_busy) - (b.self - a.self)) /
                                          static_cast<double>(total)
                                    : 0;
    const Dist d = summarize(errs);
    std::printf("  %5.1f  %7zu  %9.3f  %9.3f  %5.1f\n", a.t, errs.size(), d.p50 * 1e3, d.p99 * 1e3, others);
    (others < 5 ? quiet : busy).push_back(d);
  }
  std::printf("seconds with others < 5%% CPU: %zu (p99 <= 1 ms in %zu); other seconds: %zu (p99 <= 1 ms in %zu)\n",
              quiet.size(), static_cast<size_t>(std::count_if(quiet.begin(), quiet.end(), [](const Dist& d) { return d.p99 <= 1e-3; })),
              busy.size(), static_cast<size_t>(std::count_if(busy.begin(), busy.end(), [](const Dist& d) { return d.p99 <= 1e-3; })));
  server.stop();
  return ok == static_cast<int64_t>(r->records.size()) ? 0 : 1;
}
