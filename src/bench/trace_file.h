// Agent trace files: the JSONL format `mxserve bench --workload trace --trace FILE` replays and
// `mxserve bench trace-gen` writes (docs/bench.md, "Agentic trace replay", is the reference).
// Owns: the in-memory trace (sessions of turns), parsing with errors that name the file, line and
// field, and serialisation (one session per line).
// A line is either a whole session  {"session_id": ID, "turns": [TURN, ...]}  or one turn
// {"session_id": ID, TURN fields...}; turn lines of one session are taken in file order.
// TURN = {"input_tokens": N | "input_text": "...", "output_tokens": N, "think_time_s": S?, "turn": K?}
// Invariant: a parsed Trace has >= 1 session, every session >= 1 turn, every turn exactly one of
// input_tokens >= 1 / non-empty input_text, output_tokens >= 1 and think_time_s finite >= 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace mxserve::bench {

struct TraceTurn {
  int64_t input_tokens = 0;   // new tokens this turn adds (cut from the corpus); 0 when input_text is set
  std::string input_text;     // new text this turn adds, sent as is
  int64_t output_tokens = 1;  // max_tokens of this turn (exact with ignore_eos)
  double think_time_s = 0;    // pause after this turn's response, before the next turn is sent
};

struct TraceSession {
  std::string id;
  std::vector<TraceTurn> turns;
};

struct Trace {
  std::vector<TraceSession> sessions;  // in order of first appearance in the file
  int64_t turns() const;
  bool needs_tokenizer() const;        // some turn gives input_tokens (cut from the corpus)
};

// `what` names the source in errors (the path for files).
Result<Trace> parse_trace_text(const std::string& text, const std::string& what);
Result<Trace> read_trace_file(const std::string& path);
// One session per line, turn fields in the order documented; parse_trace_text(write(t)) == t.
std::string write_trace_text(const Trace& trace);

}  // namespace mxserve::bench
