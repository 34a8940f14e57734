// `mxserve bench` CLI entry (see bench_command.h).
#include "bench/bench_command.h"

#include <iostream>

#include "bench/bench_config.h"
#include "bench/bench_run.h"

namespace mxserve::bench {

int cmd_bench(int argc, char** argv) {
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
  Status s = run.run();
  if (!s.is_ok()) {
    std::cerr << "mxserve bench: " << s.to_string() << "\n";
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace mxserve::bench

int cmd_bench(int argc, char** argv) { return mxserve::bench::cmd_bench(argc, argv); }
