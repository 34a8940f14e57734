// `mxserve bench` entry point: the hand-off from the `mxserve` main to the bench run.
// argv[0] is "bench"; returns the process exit code (0 ok, 1 run failure, 2 bad flags).
// Both spellings are real (non-inline) functions defined in bench_command.cpp.
#pragma once

namespace mxserve::bench {
int cmd_bench(int argc, char** argv);
}  // namespace mxserve::bench

int cmd_bench(int argc, char** argv);
