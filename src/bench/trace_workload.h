// TraceSchedule: replays the multi-turn agent sessions of a trace (trace_file.h) as a DynamicSchedule
// for run_load(). Owns: session admission (all at once up to --max-concurrency, or arrivals at
// --session-rate, capped by --max-concurrency when both are given), the think time between turns,
// and the carried context: turn k+1 of a session sends turn k's whole request plus turn k's streamed
// output plus turn k+1's new input, so a server's prefix cache can serve everything but the new part.
//  - chat: messages_{k+1} = messages_k ++ [{assistant: output_k (+ reasoning_content)}, {user: new_{k+1}}]
//  - completions: prompt_{k+1} = prompt_k ++ output_k ++ new_{k+1}  (new_{k+1} starts with "\n\n")
// New inputs given as a token count are cut from the corpus with fit_prompt (exact under the codec);
// the first turn of every session instance starts with a unique "Session <hex>." nonce so sessions
// never share a prefix with each other. Instance i replays trace session i mod (sessions in file).
// A failed turn ends its session (the next turn would need its output).
// Invariant: at most one request per session is in flight, and turn k+1 is never sent before
// turn k ended + its think time.
#pragma once

#include <cstdint>
#include <memory>
#include <queue>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/corpus.h"
#include "bench/load_runner.h"
#include "bench/token_codec.h"
#include "bench/trace_file.h"
#include "core/status.h"

namespace mxserve::bench {

struct TraceReplayConfig {
  bool chat = true;                   // --endpoint chat (else completions)
  std::string model;
  bool ignore_eos = true;
  double temperature = -1;            // <0: not sent
  nlohmann::json extra_body;          // merged into every body (object or null)
  int64_t num_sessions = -1;          // session instances (-1: the sessions of the file, once each)
  int64_t max_active = 0;             // sessions at once (0: no cap; needs session offsets)
  std::vector<double> session_offsets;// arrival time of instance i (empty: every instance at 0, gated by max_active)
  double duration_s = 0;              // >0: no session starts once a session ends after this time
  uint64_t seed = 0;
  int64_t prebuild_token_cap = 20'000'000;  // new-input tokens built before the clock starts, at most
};

class TraceSchedule final : public DynamicSchedule {
 public:
  // Builds every new input up front (before the clock starts), or, past config.prebuild_token_cap
  // tokens in all, each session's when it starts (lazy(); describe() says which). codec/corpus may
  // be null only when every turn gives input_text. `trace`, codec and corpus must outlive the schedule.
  static Result<std::unique_ptr<TraceSchedule>> make(const Trace& trace, TraceReplayConfig config,
                                                     const TokenCodec* codec, const TokenCorpus* corpus);
  bool lazy() const { return lazy_; }

  double next_ready_s() const override;
  bool exhausted() const override;
  Result<RequestSpec> next(double now_s, double* scheduled_s) override;
  void on_finish(RequestRecord& rec) override;

  int64_t instances() const { return static_cast<int64_t>(sessions_.size()); }
  // Turns each instance has (the metrics' definition of a completed job).
  std::vector<int64_t> turns_per_instance() const;
  int64_t max_active_seen() const { return max_active_seen_; }
  nlohmann::json describe(const std::string& file) const;

 private:
  struct NewInput {
    std::string text;
    int64_t tokens = -1;              // codec count (-1: no codec)
  };
  struct Session {
    const TraceSession* src = nullptr;
    std::vector<NewInput> inputs;     // one per turn
    size_t next_turn = 0;
    bool in_flight = false, ended = false;
    nlohmann::json messages = nlohmann::json::array();  // chat history so far
    std::string prompt;               // completions prompt so far
    int64_t context_tokens = 0;       // client-side count of the history (new inputs + outputs)
  };
  struct Due {
    double at;
    int64_t session;
    bool operator>(const Due& o) const { return at > o.at || (at == o.at && session > o.session); }
  };
  explicit TraceSchedule(TraceReplayConfig c) : c_(std::move(c)) {}
  Status build_inputs(int64_t instance);
  double arrival_time(size_t i) const { return c_.session_offsets.empty() ? 0.0 : c_.session_offsets[i]; }
  bool can_admit() const;
  void end_session(Session& s, double now_s);

  TraceReplayConfig c_;
  const TokenCodec* codec_ = nullptr;
  const TokenCorpus* corpus_ = nullptr;
  std::vector<int32_t> sep_;          // completions: "\n\n" before a later turn's corpus input
  int64_t file_sessions_ = 0;
  bool lazy_ = false;
  std::vector<Session> sessions_;
  size_t next_arrival_ = 0;           // instances [0, next_arrival_) have started (or were cut)
  int64_t active_ = 0;                // started, not ended
  int64_t in_flight_ = 0;
  int64_t max_active_seen_ = 0;
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> due_;  // next turns waiting out think time
};

}  // namespace mxserve::bench
