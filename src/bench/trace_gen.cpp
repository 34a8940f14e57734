// Synthetic agent trace generator (see trace_gen.h).
#include "bench/trace_gen.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>

namespace mxserve::bench {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Deterministic draws keyed by (seed, session, turn, what).
struct Draw {
  uint64_t seed;
  uint64_t h(int64_t s, int64_t t, uint64_t what) const {
    return mix(mix(mix(seed ^ 0x7472616365ull) ^ static_cast<uint64_t>(s)) ^ (static_cast<uint64_t>(t) * 16 + what));
  }
  double unit(int64_t s, int64_t t, uint64_t what) const {  // [0, 1)
    return static_cast<double>(h(s, t, what) >> 11) * 0x1.0p-53;
  }
  int64_t spread_int(int64_t v, double r, int64_t s, int64_t t, uint64_t what) const {
    const int64_t lo = std::max<int64_t>(1, std::llround(static_cast<double>(v) * (1 - r)));
    const int64_t hi = std::max<int64_t>(lo, std::llround(static_cast<double>(v) * (1 + r)));
    return lo + static_cast<int64_t>(h(s, t, what) % static_cast<uint64_t>(hi - lo + 1));
  }
};

Status bad(const std::string& flag, const std::string& value, const std::string& why) {
  return invalid_argument(flag + " " + value + ": " + why);
}

Result<int64_t> parse_int(const std::string& flag, const std::string& v, int64_t min) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || end != v.c_str() + v.size()) return bad(flag, v, "not an integer");
  if (x < min) return bad(flag, v, "must be >= " + std::to_string(min));
  return static_cast<int64_t>(x);
}

Result<double> parse_double(const std::string& flag, const std::string& v, double min, double max_excl) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(d)) return bad(flag, v, "not a number");
  if (d < min || d >= max_excl) return bad(flag, v, "out of range");
  return d;
}

}  // namespace

Trace generate_trace(const TraceGenConfig& c) {
  const Draw d{c.seed};
  Trace trace;
  for (int64_t s = 0; s < c.sessions; ++s) {
    TraceSession session;
    char id[32];
    std::snprintf(id, sizeof id, "s%05lld", static_cast<long long>(s));
    session.id = id;
    const int64_t turns = d.spread_int(c.turns, c.spread, s, -1, 0);
    int64_t context = 0;
    for (int64_t t = 0; t < turns; ++t) {
      TraceTurn turn;
      turn.input_tokens = d.spread_int(t == 0 ? c.first_turn_tokens : c.turn_tokens, c.spread, s, t, 1);
      turn.output_tokens = d.spread_int(c.output_tokens, c.spread, s, t, 2);
      const double think = c.think_time_s * (1 - c.spread + 2 * c.spread * d.unit(s, t, 3));
      turn.think_time_s = std::round(think * 1000) / 1000;
      if (t > 0 && c.max_context > 0 && context + turn.input_tokens + turn.output_tokens > c.max_context) break;
      context += turn.input_tokens + turn.output_tokens;
      session.turns.push_back(turn);
    }
    session.turns.back().think_time_s = 0;  // nothing follows the last turn
    trace.sessions.push_back(std::move(session));
  }
  return trace;
}

std::string trace_gen_usage() {
  return R"(usage: mxserve bench trace-gen [--sessions S] [--turns T] [--first-turn-tokens N] [--turn-tokens M]
                               [--output-tokens O] [--think-time-s X] [--spread r] [--max-context C]
                               [--seed N] [--output FILE]
Writes a synthetic agent trace (JSONL, one session per line) for `mxserve bench --workload trace`.
Turn k of a session sends the whole conversation so far plus its new tokens, so the context grows
by about M + O tokens a turn from N. docs/bench.md, "Agentic trace replay".

  --sessions S            sessions (16)
  --turns T               turns per session (8)
  --first-turn-tokens N   new input tokens of the first turn: system prompt, task, files (2000)
  --turn-tokens M         new input tokens of each later turn: tool results, user follow-ups (300)
  --output-tokens O       output tokens of each turn (200)
  --think-time-s X        pause between a response and the next turn: tool runs, user (2.0)
  --spread r              every value above uniform in [v(1-r), v(1+r)] per session / turn (0.5; 0: exact)
  --max-context C         drop later turns once the session's context would pass C tokens (0: no cap)
  --seed N                (0) the same flags and seed write the same file
  --output FILE           (stdout)
)";
}

Result<TraceGenConfig> parse_trace_gen_args(int argc, char** argv, bool* help) {
  TraceGenConfig c;
  *help = false;
  std::map<std::string, std::string> v;
  static const char* kFlags[] = {"--sessions", "--turns", "--first-turn-tokens", "--turn-tokens", "--output-tokens",
                                 "--think-time-s", "--spread", "--max-context", "--seed", "--output"};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      *help = true;
      return c;
    }
    std::string value;
    bool has_value = false;
    if (const size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a.resize(eq);
      has_value = true;
    }
    bool known = false;
    for (const char* f : kFlags) known = known || a == f;
    if (!known) return invalid_argument("unknown flag " + a + " (see mxserve bench trace-gen --help)");
    if (!has_value) {
      if (i + 1 >= argc) return invalid_argument(a + ": missing value");
      value = argv[++i];
    }
    v[a] = value;
  }
  auto has = [&](const char* f) { return v.count(f) > 0; };
  if (has("--sessions")) { MX_ASSIGN_OR_RETURN(c.sessions, parse_int("--sessions", v["--sessions"], 1)); }
  if (has("--turns")) { MX_ASSIGN_OR_RETURN(c.turns, parse_int("--turns", v["--turns"], 1)); }
  if (has("--first-turn-tokens")) {
    MX_ASSIGN_OR_RETURN(c.first_turn_tokens, parse_int("--first-turn-tokens", v["--first-turn-tokens"], 1));
  }
  if (has("--turn-tokens")) { MX_ASSIGN_OR_RETURN(c.turn_tokens, parse_int("--turn-tokens", v["--turn-tokens"], 1)); }
  if (has("--output-tokens")) { MX_ASSIGN_OR_RETURN(c.output_tokens, parse_int("--output-tokens", v["--output-tokens"], 1)); }
  if (has("--think-time-s")) {
    MX_ASSIGN_OR_RETURN(c.think_time_s, parse_double("--think-time-s", v["--think-time-s"], 0, 1e7));
  }
  if (has("--spread")) { MX_ASSIGN_OR_RETURN(c.spread, parse_double("--spread", v["--spread"], 0, 1)); }
  if (has("--max-context")) { MX_ASSIGN_OR_RETURN(c.max_context, parse_int("--max-context", v["--max-context"], 0)); }
  if (has("--seed")) {
    MX_ASSIGN_OR_RETURN(int64_t s, parse_int("--seed", v["--seed"], 0));
    c.seed = static_cast<uint64_t>(s);
  }
  if (c.sessions > 10'000'000) return bad("--sessions", v["--sessions"], "must be <= 1e7");
  if (c.turns > 100'000) return bad("--turns", v["--turns"], "must be <= 1e5");
  if (has("--output")) c.output = v["--output"];
  return c;
}

int cmd_trace_gen(int argc, char** argv) {
  bool help = false;
  Result<TraceGenConfig> c = parse_trace_gen_args(argc, argv, &help);
  if (help) {
    std::cout << trace_gen_usage();
    return 0;
  }
  if (!c.is_ok()) {
    std::cerr << "mxserve bench trace-gen: " << c.status().message() << "\n";
    return 2;
  }
  const Trace trace = generate_trace(*c);
  const std::string text = write_trace_text(trace);
  if (c->output.empty() || c->output == "-") {
    std::cout << text << std::flush;
  } else {
    std::ofstream f(c->output, std::ios::binary | std::ios::trunc);
    f << text;
    f.close();
    if (!f) {
      std::cerr << "mxserve bench trace-gen: --output " << c->output << ": cannot write the file\n";
      return 1;
    }
  }
  int64_t max_ctx = 0, sum_ctx = 0;
  for (const TraceSession& s : trace.sessions) {
    int64_t ctx = 0;
    for (const TraceTurn& t : s.turns) ctx += t.input_tokens + t.output_tokens;
    max_ctx = std::max(max_ctx, ctx);
    sum_ctx += ctx;
  }
  std::cerr << "mxserve bench trace-gen: " << trace.sessions.size() << " sessions, " << trace.turns()
            << " turns; final context per session mean " << sum_ctx / static_cast<int64_t>(trace.sessions.size())
            << ", max " << max_ctx << " tokens (plus chat-template tokens)"
            << (c->output.empty() || c->output == "-" ? std::string() : "; wrote " + c->output) << "\n";
  return 0;
}

}  // namespace mxserve::bench
