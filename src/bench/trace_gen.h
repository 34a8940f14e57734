// `mxserve bench trace-gen`: synthetic agent traces (sessions x turns x context growth) in the
// format of trace_file.h. Owns the generator's flags, the spread rules and the summary it prints.
// Spread r: turns per session, first-turn tokens, later-turn tokens and output tokens are uniform
// integers in [round(v(1-r)), round(v(1+r))] (at least 1); think times uniform in [X(1-r), X(1+r)],
// rounded to the millisecond. --max-context C drops a session's later turns once its estimated
// context (all inputs and outputs so far) would pass C tokens; the first turn always stays.
// Invariant: the output is a pure function of the flags (seed included): same flags, same bytes.
#pragma once

#include <cstdint>
#include <string>

#include "bench/trace_file.h"
#include "core/status.h"

namespace mxserve::bench {

struct TraceGenConfig {
  int64_t sessions = 16;
  int64_t turns = 8;
  int64_t first_turn_tokens = 2000;
  int64_t turn_tokens = 300;
  int64_t output_tokens = 200;
  double think_time_s = 2.0;
  double spread = 0.5;
  int64_t max_context = 0;     // 0: no cap
  uint64_t seed = 0;
  std::string output;          // file; empty or "-": stdout
};

Trace generate_trace(const TraceGenConfig& c);

// argv[0] is "trace-gen". `help` set: print trace_gen_usage().
Result<TraceGenConfig> parse_trace_gen_args(int argc, char** argv, bool* help);
std::string trace_gen_usage();
// The CLI: 0 ok, 1 write failure, 2 bad flags.
int cmd_trace_gen(int argc, char** argv);

}  // namespace mxserve::bench
