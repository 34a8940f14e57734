// Test-only executable: `mxserve_bench_cli [flags]` == `mxserve bench [flags]` until the lead wires
// cmd_bench into the mxserve main.
#include "bench/bench_command.h"

#include <string>
#include <vector>

int main(int argc, char** argv) {
  std::vector<char*> args;
  static char name[] = "bench";
  args.push_back(name);
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  return mxserve::bench::cmd_bench(static_cast<int>(args.size()), args.data());
}
