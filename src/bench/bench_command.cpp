// `mxserve bench` CLI entry (see bench_command.h).
#include "bench/bench_command.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <string>

#include "bench/bench_config.h"
#include "bench/bench_run.h"
#include "bench/rejudge.h"
#include "bench/trace_gen.h"

namespace mxserve::bench {
namespace {

std::atomic<bool> g_stop{false};

// First SIGINT: finish gracefully (drain, then write what ran). Second: exit at once.
void on_sigint(int) {
  if (g_stop.exchange(true)) {
    signal(SIGINT, SIG_DFL);
    raise(SIGINT);
  }
  static const char kMsg[] = "\nmxserve bench: stopping after in-flight requests (Ctrl-C again to abort)\n";
  [[maybe_unused]] ssize_t w = write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "trace-gen") return cmd_trace_gen(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "judge") return cmd_bench_judge(argc - 1, argv + 1);
  bool help = false;
  Result<BenchConfig> config = parse_bench_args(argc, argv, &help);
  if (help) {
    std::cout << bench_usage();
    return 0;
  }
  if (!config.is_ok()) {
    std::cerr << "mxserve bench: " << config.status().message() << "\n";
    return 2;
  }
  BenchRun run(std::move(config).value(), std::cout, std::cerr);
  g_stop = false;
  struct sigaction sa {};
  sa.sa_handler = &on_sigint;
  sigemptyset(&sa.sa_mask);
  struct sigaction old {};
  sigaction(SIGINT, &sa, &old);
  run.set_stop_flag(&g_stop);
  Status s = run.run();
  sigaction(SIGINT, &old, nullptr);
  if (!s.is_ok()) {
    std::cerr << "mxserve bench: " << s.to_string() << "\n";
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  return run.interrupted() ? 130 : 0;
}

}  // namespace mxserve::bench

int cmd_bench(int argc, char** argv) { return mxserve::bench::cmd_bench(argc, argv); }
