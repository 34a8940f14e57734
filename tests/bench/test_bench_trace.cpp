// --workload trace: the trace format (parse errors name line and field), the generator
// (deterministic, parses back), the job metrics (pure), and replays against the scripted fake
// server: turns of a session are sequential and wait out their think time (checked by the order in
// which the server received them and by lower bounds, never by upper wall-clock bounds), turn k+1
// carries turn k's prompt + output exactly, computed tokens use cached_tokens, TTFT groups by depth.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "bench/bench_command.h"
#include "bench/bench_config.h"
#include "bench/bench_run.h"
#include "bench/trace_file.h"
#include "bench/trace_gen.h"
#include "bench/trace_report.h"
#include "bench/trace_workload.h"
#include "fake_openai_server.h"

namespace mxserve::bench {
namespace {

using testing::FakeOpenAiServer;
using testing::FakePlan;
using testing::FakeRequest;
using testing::LruPrefixCache;

std::string write_tmp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path;
}

// ---- format ----

TEST(TraceFile, ParsesSessionLinesAndTurnLines) {
  const std::string text =
      R"({"session_id": "a", "turns": [{"input_tokens": 100, "output_tokens": 10, "think_time_s": 1.5},)"
      R"( {"input_text": "look at this", "output_tokens": 5}]})" "\n"
      "\n"
      R"({"session_id": 7, "turn": 0, "input_tokens": 50, "output_tokens": 4, "think_time_s": 0.25})" "\n"
      R"({"session_id": "b", "input_tokens": 9, "output_tokens": 3, "meta": {"tool": "grep"}})" "\n"
      R"({"session_id": 7, "turn": 1, "input_tokens": 20, "output_tokens": 2})" "\n";
  auto t = parse_trace_text(text, "t.jsonl");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  ASSERT_EQ(t->sessions.size(), 3u);
  EXPECT_EQ(t->sessions[0].id, "a");
  EXPECT_EQ(t->sessions[1].id, "7");
  EXPECT_EQ(t->sessions[2].id, "b");
  ASSERT_EQ(t->sessions[0].turns.size(), 2u);
  EXPECT_EQ(t->sessions[0].turns[0].input_tokens, 100);
  EXPECT_DOUBLE_EQ(t->sessions[0].turns[0].think_time_s, 1.5);
  EXPECT_EQ(t->sessions[0].turns[1].input_text, "look at this");
  EXPECT_EQ(t->sessions[0].turns[1].output_tokens, 5);
  ASSERT_EQ(t->sessions[1].turns.size(), 2u);
  EXPECT_EQ(t->sessions[1].turns[1].input_tokens, 20);
  EXPECT_DOUBLE_EQ(t->sessions[1].turns[0].think_time_s, 0.25);
  EXPECT_EQ(t->turns(), 5);
  EXPECT_TRUE(t->needs_tokenizer());
  // Round trip through the writer (one session per line).
  auto back = parse_trace_text(write_trace_text(*t), "w");
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(write_trace_text(*back), write_trace_text(*t));
}

TEST(TraceFile, MalformedLinesNameLineAndField) {
  const std::string ok = R"({"session_id": "s", "input_tokens": 5, "output_tokens": 2})" "\n";
  struct Case {
    std::string line2;
    std::string want;
  };
  const std::vector<Case> cases = {
      {R"({"session_id": "s", "input_tokens": 5})", "t.jsonl:2: field 'output_tokens' is missing"},
      {R"({"session_id": "s", "input_tokens": 0, "output_tokens": 2})", "t.jsonl:2: field 'input_tokens' must be"},
      {R"({"session_id": "s", "input_tokens": 3, "input_text": "x", "output_tokens": 2})", "t.jsonl:2: field 'input_tokens' or 'input_text'"},
      {R"({"session_id": "s", "output_tokens": 2})", "t.jsonl:2: field 'input_tokens' or 'input_text'"},
      {R"({"session_id": "s", "input_tokens": 3, "output_tokens": 2, "think_time_s": -1})", "t.jsonl:2: field 'think_time_s'"},
      {R"({"session_id": "s", "input_tokens": 3, "output_tokens": 2, "think_time_s": "1s"})", "t.jsonl:2: field 'think_time_s'"},
      {R"({"session_id": "s", "input_tokens": 3, "output_len": 2})", "t.jsonl:2: field 'output_len' is not a trace field"},
      {R"({"session_id": "s", "turn": 5, "input_tokens": 3, "output_tokens": 2})", "t.jsonl:2: field 'turn' must be 1"},
      {R"({"input_tokens": 3, "output_tokens": 2})", "t.jsonl:2: field 'session_id' is missing"},
      {R"({"session_id": "", "input_tokens": 3, "output_tokens": 2})", "t.jsonl:2: field 'session_id' must be"},
      {R"({"session_id": "s", "turns": [{"input_tokens": 1, "output_tokens": 1}]})", "t.jsonl:2: field 'session_id' 's' already has turn lines"},
      {R"({"session_id": "z", "turns": [{"input_tokens": 1, "output_tokens": 1}, {"input_tokens": 1, "output_tokens": 1.5}]})",
       "t.jsonl:2 turns[1]: field 'output_tokens' must be an integer"},
      {R"({"session_id": "z", "turns": []})", "t.jsonl:2: field 'turns' must be a non-empty array"},
      {R"({"session_id": "z", "turns": [{"input_tokens": 1, "output_tokens": 1}], "think": 1})", "t.jsonl:2: field 'think' is not a session field"},
      {R"({"session_id": "s", "input_tokens": 3, "output_tokens": 2)", "t.jsonl:2: not a JSON object"},
      {R"([1, 2])", "t.jsonl:2: not a JSON object"},
  };
  for (const Case& c : cases) {
    auto t = parse_trace_text(ok + c.line2 + "\n", "t.jsonl");
    ASSERT_FALSE(t.is_ok()) << c.line2;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.want), std::string::npos) << "line: " << c.line2 << "\n got: " << t.status().message();
  }
  auto empty = parse_trace_text("\n\n", "e.jsonl");
  ASSERT_FALSE(empty.is_ok());
  EXPECT_NE(empty.status().message().find("e.jsonl: no sessions"), std::string::npos);
  auto missing = read_trace_file("/nonexistent/trace.jsonl");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("--trace /nonexistent/trace.jsonl"), std::string::npos);
  // A whole-session line given twice.
  const std::string whole = R"({"session_id": "w", "turns": [{"input_tokens": 1, "output_tokens": 1}]})" "\n";
  auto twice = parse_trace_text(whole + whole, "t.jsonl");
  ASSERT_FALSE(twice.is_ok());
  EXPECT_NE(twice.status().message().find("t.jsonl:2: field 'session_id' 'w' was already given"), std::string::npos);
}

// ---- generator ----

TEST(TraceGen, DeterministicUnderASeedAndParses) {
  TraceGenConfig c;
  c.sessions = 20;
  c.turns = 6;
  c.first_turn_tokens = 1000;
  c.turn_tokens = 200;
  c.output_tokens = 100;
  c.think_time_s = 2;
  c.spread = 0.5;
  c.seed = 7;
  const std::string a = write_trace_text(generate_trace(c));
  EXPECT_EQ(a, write_trace_text(generate_trace(c)));
  c.seed = 8;
  EXPECT_NE(a, write_trace_text(generate_trace(c)));
  auto t = parse_trace_text(a, "gen");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  ASSERT_EQ(t->sessions.size(), 20u);
  std::set<size_t> turn_counts;
  for (const TraceSession& s : t->sessions) {
    ASSERT_GE(s.turns.size(), 3u);
    ASSERT_LE(s.turns.size(), 9u);
    turn_counts.insert(s.turns.size());
    EXPECT_GE(s.turns[0].input_tokens, 500);
    EXPECT_LE(s.turns[0].input_tokens, 1500);
    for (size_t k = 1; k < s.turns.size(); ++k) {
      EXPECT_GE(s.turns[k].input_tokens, 100);
      EXPECT_LE(s.turns[k].input_tokens, 300);
    }
    for (const TraceTurn& turn : s.turns) {
      EXPECT_GE(turn.output_tokens, 50);
      EXPECT_LE(turn.output_tokens, 150);
    }
    for (size_t k = 0; k + 1 < s.turns.size(); ++k) {
      EXPECT_GE(s.turns[k].think_time_s, 1.0);
      EXPECT_LE(s.turns[k].think_time_s, 3.0);
    }
    EXPECT_EQ(s.turns.back().think_time_s, 0);
  }
  EXPECT_GT(turn_counts.size(), 1u);  // the spread spreads
  // Spread 0: every value exact. --max-context keeps each session's context within the cap.
  c.spread = 0;
  c.max_context = 1000 + 100 + 3 * 300;
  const Trace exact = generate_trace(c);
  for (const TraceSession& s : exact.sessions) {
    ASSERT_EQ(s.turns.size(), 4u);  // 1100 + 3 * 300 = 2000 <= 2000; a 5th turn would make 2300
    EXPECT_EQ(s.turns[0].input_tokens, 1000);
    EXPECT_EQ(s.turns[1].input_tokens, 200);
    EXPECT_DOUBLE_EQ(s.turns[0].think_time_s, 2.0);
  }
}

TEST(TraceGen, CliWritesTheFileAndRejectsBadFlags) {
  const std::string path = ::testing::TempDir() + "/gen_cli.jsonl";
  std::vector<std::string> args = {"bench", "trace-gen", "--sessions", "3", "--turns", "2", "--first-turn-tokens", "40",
                                   "--turn-tokens", "10", "--output-tokens", "5", "--think-time-s", "0.5", "--seed",
                                   "3", "--output", path};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ASSERT_EQ(cmd_bench(static_cast<int>(argv.size()), argv.data()), 0);
  auto t = read_trace_file(path);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->sessions.size(), 3u);
  bool help = false;
  std::vector<std::string> bad = {"trace-gen", "--spread", "1.5"};
  std::vector<char*> bv;
  for (auto& a : bad) bv.push_back(a.data());
  auto r = parse_trace_gen_args(static_cast<int>(bv.size()), bv.data(), &help);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("--spread 1.5"), std::string::npos);
  bad = {"trace-gen", "--sessions", "0"};
  bv.clear();
  for (auto& a : bad) bv.push_back(a.data());
  r = parse_trace_gen_args(static_cast<int>(bv.size()), bv.data(), &help);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("--sessions 0"), std::string::npos);
}

// ---- bench flags ----

Result<BenchConfig> parse(std::vector<std::string> args) {
  std::vector<char*> argv;
  static std::string name = "bench";
  argv.push_back(name.data());
  for (auto& a : args) argv.push_back(a.data());
  bool help = false;
  return parse_bench_args(static_cast<int>(argv.size()), argv.data(), &help);
}

TEST(TraceCli, FlagsAndErrors) {
  auto ok = parse({"--trace", "t.jsonl", "--max-concurrency", "4", "--num-sessions", "10"});
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->workload.kind, WorkloadKind::kTrace);
  EXPECT_EQ(ok->num_sessions, 10);
  EXPECT_EQ(ok->max_concurrency, 4);
  auto rate = parse({"--workload", "trace", "--trace", "t.jsonl", "--session-rate", "0.5"});
  ASSERT_TRUE(rate.is_ok()) << rate.status().to_string();
  EXPECT_DOUBLE_EQ(rate->session_rate, 0.5);
  struct Case {
    std::vector<std::string> args;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{"--workload", "trace", "--max-concurrency", "2"}, "--workload trace needs --trace"},
      {{"--trace", "t.jsonl"}, "give a load: --max-concurrency C"},
      {{"--trace", "t.jsonl", "--request-rate", "2"}, "--request-rate 2: does not apply to --workload trace"},
      {{"--trace", "t.jsonl", "--max-concurrency", "2", "--num-requests", "5"}, "--num-requests 5: does not apply"},
      {{"--trace", "t.jsonl", "--session-rate", "0"}, "--session-rate 0: must be"},
      {{"--trace", "t.jsonl", "--session-rate", "x"}, "--session-rate x"},
      {{"--trace", "t.jsonl", "--max-concurrency", "2", "--num-sessions", "0"}, "--num-sessions 0"},
      {{"--workload", "random", "--trace", "t.jsonl"}, "--trace t.jsonl: applies to --workload trace only"},
      {{"--session-rate", "1", "--request-rate", "1", "--num-requests", "2"}, "--session-rate 1: applies to --workload trace only"},
      {{"--trace", "t.jsonl", "--max-concurrency", "2", "--warmup-requests", "3"}, "--warmup-requests 3"},
  };
  for (const Case& c : cases) {
    auto r = parse(c.args);
    ASSERT_FALSE(r.is_ok()) << c.want;
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << r.status().message();
  }
}

// ---- metrics (pure) ----

RequestRecord rec(int64_t session, int turn, double sent, double ttft, double end, int64_t prompt, int64_t cached,
                  int64_t out, bool ok = true) {
  RequestRecord r;
  r.session = session;
  r.turn = turn;
  r.sent_s = sent;
  r.first_token_s = sent + ttft;
  r.last_token_s = end;
  r.end_s = end;
  r.prompt_tokens = prompt;
  r.cached_tokens = cached;
  r.output_tokens = out;
  r.token_chunks = out;
  r.ok = ok;
  if (!ok) r.error = "http 503: x";
  return r;
}

TEST(TraceMetrics, JobsComputedTokensAndDepths) {
  // Session 0: 3 turns ok. Session 1: turn 0 ok, turn 1 failed. Session 2: 2 turns ok, no cached
  // report on its turn 1. Session 3: never started. Duration 0 -> 10 s.
  std::vector<RequestRecord> r = {
      rec(0, 0, 0.0, 0.1, 1.0, 100, 0, 10),  rec(0, 1, 2.0, 0.2, 3.0, 150, 110, 10), rec(0, 2, 4.0, 0.3, 5.0, 200, 160, 10),
      rec(1, 0, 0.0, 0.5, 1.0, 100, 0, 10),  rec(1, 1, 2.0, 0.0, 2.5, 0, -1, 0, false),
      rec(2, 0, 1.0, 0.3, 2.0, 80, 0, 20),   rec(2, 1, 6.0, 0.4, 10.0, 130, -1, 20),
  };
  const TraceMetrics m = compute_trace_metrics(r, {3, 2, 2, 4});
  EXPECT_EQ(m.sessions_planned, 4);
  EXPECT_EQ(m.sessions_started, 3);
  EXPECT_EQ(m.sessions_completed, 2);
  EXPECT_EQ(m.sessions_failed, 1);
  EXPECT_EQ(m.sessions_unfinished, 0);
  EXPECT_DOUBLE_EQ(m.duration_s, 10);
  EXPECT_DOUBLE_EQ(m.jobs_per_hour, 2 * 360.0);
  EXPECT_EQ(m.prompt_tokens, 100 + 150 + 200 + 100 + 80 + 130);
  EXPECT_EQ(m.cached_tokens, 270);
  EXPECT_EQ(m.output_tokens, 80);
  EXPECT_DOUBLE_EQ(m.total_tps, (760 + 80) / 10.0);
  EXPECT_DOUBLE_EQ(m.computed_tps, (760 - 270 + 80) / 10.0);
  EXPECT_DOUBLE_EQ(m.prefill_computed_tps, (760 - 270) / 10.0);
  EXPECT_DOUBLE_EQ(m.cached_fraction, 270.0 / (760 - 130));  // turns that reported cached_tokens only
  ASSERT_EQ(m.depths.size(), 3u);
  EXPECT_EQ(m.depths[0].sent, 3);
  EXPECT_EQ(m.depths[0].completed, 3);
  EXPECT_NEAR(m.depths[0].ttft.p50, 0.3, 1e-9);  // {0.1, 0.5, 0.3}
  EXPECT_EQ(m.depths[1].sent, 3);
  EXPECT_EQ(m.depths[1].completed, 2);
  EXPECT_NEAR(m.depths[1].ttft.p50, 0.3, 1e-9);  // {0.2, 0.4}
  EXPECT_NEAR(m.depths[1].mean_prompt_tokens, 140, 1e-9);
  EXPECT_NEAR(m.depths[1].mean_cached_tokens, 110, 1e-9);
  EXPECT_EQ(m.depths[2].completed, 1);
  EXPECT_NEAR(m.session_duration.p50, 7.0, 1e-9);  // {5 - 0, 10 - 1}
  const nlohmann::json j = trace_metrics_to_json(m);
  EXPECT_EQ(j["jobs_completed"], 2);
  EXPECT_EQ(j["by_turn"].size(), 3u);
  EXPECT_EQ(j["by_turn"][1]["turn"], 2);
  EXPECT_DOUBLE_EQ(j["computed_token_throughput"].get<double>(), 57.0);
}

// ---- the schedule, driven by hand (no network, no clock) ----

TEST(TraceSchedule, AdmissionThinkTimeAndCarriedContext) {
  const std::string text =
      R"({"session_id": "a", "turns": [{"input_tokens": 8, "output_tokens": 2, "think_time_s": 0.5}, {"input_tokens": 3, "output_tokens": 2}]})" "\n"
      R"({"session_id": "b", "turns": [{"input_text": "hello there", "output_tokens": 1}]})" "\n";
  auto trace = parse_trace_text(text, "t");
  ASSERT_TRUE(trace.is_ok());
  WordCodec codec;
  auto corpus = TokenCorpus::load("", codec);
  ASSERT_TRUE(corpus.is_ok());
  for (bool lazy : {false, true}) {
    TraceReplayConfig rc;
    rc.chat = false;
    rc.model = "m";
    rc.max_active = 1;
    rc.num_sessions = 3;  // a, b, then a again with a fresh nonce
    rc.prebuild_token_cap = lazy ? 0 : 1000;
    auto made = TraceSchedule::make(*trace, rc, &codec, &*corpus);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    TraceSchedule& s = **made;
    EXPECT_EQ(s.lazy(), lazy);
    EXPECT_EQ(s.turns_per_instance(), (std::vector<int64_t>{2, 1, 2}));
    EXPECT_EQ(s.next_ready_s(), 0);
    double sched = -1;
    auto r0 = s.next(0.0, &sched);
    ASSERT_TRUE(r0.is_ok());
    EXPECT_EQ(r0->session, 0);
    EXPECT_EQ(r0->turn, 0);
    EXPECT_TRUE(r0->capture_text);
    EXPECT_EQ(r0->intended_input, 8);
    const std::string p0 = nlohmann::json::parse(r0->body)["prompt"];
    EXPECT_EQ(split_words(p0).size(), 8u);
    EXPECT_TRUE(std::isinf(s.next_ready_s()));  // cap 1: b waits; a's turn 1 waits for turn 0
    EXPECT_FALSE(s.exhausted());
    RequestRecord done;
    done.session = 0;
    done.turn = 0;
    done.ok = true;
    done.end_s = 2.0;
    done.output_tokens = 2;
    done.output_text = "out put ";
    s.on_finish(done);
    EXPECT_TRUE(done.output_text.empty());  // taken
    EXPECT_DOUBLE_EQ(s.next_ready_s(), 2.5);  // end + think time
    auto r1 = s.next(2.5, &sched);
    ASSERT_TRUE(r1.is_ok());
    EXPECT_DOUBLE_EQ(sched, 2.5);
    EXPECT_EQ(r1->turn, 1);
    EXPECT_EQ(r1->intended_input, 8 + 2 + 3);
    const std::string p1 = nlohmann::json::parse(r1->body)["prompt"];
    ASSERT_EQ(p1.compare(0, p0.size() + 8, p0 + "out put "), 0) << p1;
    EXPECT_EQ(split_words(p1.substr(p0.size() + 8)).size(), 3u);
    done.turn = 1;
    done.end_s = 3.0;
    s.on_finish(done);
    EXPECT_DOUBLE_EQ(s.next_ready_s(), 0);  // a ended: b may start (it arrived at 0)
    auto rb = s.next(3.0, &sched);
    ASSERT_TRUE(rb.is_ok());
    EXPECT_EQ(rb->session, 1);
    EXPECT_DOUBLE_EQ(sched, 3.0);  // closed loop: due when the slot freed
    EXPECT_EQ(nlohmann::json::parse(rb->body)["prompt"], "hello there");
    RequestRecord fail;
    fail.session = 1;
    fail.turn = 0;
    fail.ok = false;
    fail.end_s = 4.0;
    s.on_finish(fail);
    auto ra2 = s.next(4.0, &sched);
    ASSERT_TRUE(ra2.is_ok());
    EXPECT_EQ(ra2->session, 2);
    const std::string pa2 = nlohmann::json::parse(ra2->body)["prompt"];
    EXPECT_NE(pa2, p0);  // a repeated session gets its own nonce
    EXPECT_EQ(split_words(pa2).size(), 8u);
    fail.session = 2;
    s.on_finish(fail);
    EXPECT_TRUE(s.exhausted());
  }
}

TEST(TraceSchedule, DurationStopsNewSessions) {
  auto trace = parse_trace_text(R"({"session_id": "a", "input_text": "hi", "output_tokens": 1})" "\n", "t");
  ASSERT_TRUE(trace.is_ok());
  TraceReplayConfig rc;
  rc.max_active = 1;
  rc.num_sessions = 5;
  rc.duration_s = 1.0;
  auto made = TraceSchedule::make(*trace, rc, nullptr, nullptr);  // input_text only: no tokenizer needed
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  TraceSchedule& s = **made;
  double sched = 0;
  RequestRecord r;
  r.ok = true;
  for (int i = 0; i < 2; ++i) {  // sessions ending before 1 s let the next start
    auto spec = s.next(0.5 * i, &sched);
    ASSERT_TRUE(spec.is_ok());
    r.session = spec->session;
    r.turn = 0;
    r.end_s = 0.5 * i + 0.4;
    s.on_finish(r);
  }
  auto spec = s.next(1.0, &sched);
  ASSERT_TRUE(spec.is_ok());
  r.session = spec->session;
  r.end_s = 1.2;  // past --duration: no more sessions
  s.on_finish(r);
  EXPECT_TRUE(s.exhausted());
  EXPECT_TRUE(std::isinf(s.next_ready_s()));
}

// ---- replay against the fake server ----

struct Seen {
  FakeRequest req;
  int64_t cached = 0;
  double ttft = 0;
};

// Joined text of every message (chat) or the prompt (completions): what a prefix cache keys on.
std::string flat_prompt(const FakeRequest& r) {
  if (!r.body.contains("messages")) return r.body.value("prompt", "");
  std::string s;
  for (const auto& m : r.body["messages"]) s += m.value("content", "") + " ";
  return s;
}

// Depth = number of earlier outputs carried ("t0 " starts every fake output).
int depth_of(const std::string& flat) {
  int n = 0;
  for (size_t p = flat.find("t0 "); p != std::string::npos; p = flat.find("t0 ", p + 1)) ++n;
  return n;
}

struct Replay {
  std::mutex mu;
  std::vector<Seen> seen;
  LruPrefixCache cache{2, 1 << 20};  // blocks of 2 words: a nonce ("Session <hex>.") fills the first
  std::unique_ptr<FakeOpenAiServer> server;
  int fail_seq = -1;

  Replay() {
    server = std::make_unique<FakeOpenAiServer>([this](const FakeRequest& r) {
      std::lock_guard<std::mutex> lock(mu);
      const std::string flat = flat_prompt(r);
      FakePlan p;
      p.ttft_s = 0.01 + 0.1 * depth_of(flat);
      p.gap_s = 0.002;
      p.prompt_tokens = static_cast<int64_t>(split_words(flat).size());
      p.cached_tokens = cache.lookup_insert(flat);
      if (static_cast<int>(seen.size()) == fail_seq) p.status = 503;
      seen.push_back({r, p.cached_tokens, p.ttft_s});
      return p;
    });
  }
};

BenchConfig trace_config(const std::string& url, const std::string& trace_path) {
  BenchConfig c;
  c.base_url = url;
  c.model = "fake-model";
  c.tokenizer = "builtin:words";
  c.progress = false;
  c.request_timeout_s = 20;
  c.workload.kind = WorkloadKind::kTrace;
  c.trace_file = trace_path;
  c.scrape_server_metrics = false;
  c.save_requests = true;
  return c;
}

std::string fake_output(int64_t n) {
  std::string s;
  for (int64_t k = 0; k < n; ++k) {
    s += 't';
    s += std::to_string(k);
    s += ' ';
  }
  return s;
}

TEST(TraceReplay, CompletionsCarryContextAndHonourThinkTime) {
  // Session a: 3 turns, think 1 s after turn 0; session b: 3 turns, no think time; session c: 2
  // turns. At most 2 sessions at once, so c starts when a or b ends.
  const std::string trace =
      R"({"session_id": "a", "turns": [{"input_tokens": 30, "output_tokens": 4, "think_time_s": 1.0},)"
      R"( {"input_tokens": 7, "output_tokens": 3, "think_time_s": 0.1}, {"input_tokens": 5, "output_tokens": 2}]})" "\n"
      R"({"session_id": "b", "turns": [{"input_tokens": 20, "output_tokens": 3}, {"input_tokens": 6, "output_tokens": 3},)"
      R"( {"input_text": "please run the tests", "output_tokens": 2}]})" "\n"
      R"({"session_id": "c", "turns": [{"input_tokens": 25, "output_tokens": 2}, {"input_tokens": 4, "output_tokens": 2}]})" "\n";
  const Result<Trace> parsed = parse_trace_text(trace, "x");
  ASSERT_TRUE(parsed.is_ok());
  Replay rp;
  ASSERT_TRUE(rp.server->start());
  BenchConfig c = trace_config(rp.server->base_url(), write_tmp("replay_completions.jsonl", trace));
  c.endpoint = Endpoint::kCompletions;
  c.max_concurrency = 2;
  c.output_json = ::testing::TempDir() + "/replay_completions.json";
  std::ostringstream out, err;
  BenchRun run(c, out, err);
  Status s = run.run();
  ASSERT_TRUE(s.is_ok()) << s.to_string() << err.str();
  ASSERT_NE(run.trace_metrics(), nullptr);
  const TraceMetrics& m = *run.trace_metrics();
  EXPECT_EQ(m.sessions_completed, 3);
  EXPECT_EQ(m.sessions_failed, 0);
  std::lock_guard<std::mutex> lock(rp.mu);
  ASSERT_EQ(rp.seen.size(), 8u);

  // Group the server's requests into sessions by their first two words (the unique nonce).
  std::map<std::string, std::vector<size_t>> by_session;  // in arrival order
  for (size_t i = 0; i < rp.seen.size(); ++i) {
    const auto w = split_words(rp.seen[i].req.prompt);
    ASSERT_GE(w.size(), 2u);
    by_session[std::string(w[0]) + " " + std::string(w[1])].push_back(i);
  }
  ASSERT_EQ(by_session.size(), 3u);
  // Map each group to its trace session by its number of turns and first-turn size.
  int64_t prompt_sum = 0, cached_sum = 0, output_sum = 0;
  std::map<size_t, std::vector<size_t>> by_turns;
  for (auto& [nonce, idx] : by_session) {
    const size_t first_words = split_words(rp.seen[idx[0]].req.prompt).size();
    const TraceSession* ts = nullptr;
    for (const TraceSession& cand : parsed->sessions)
      if (cand.turns.size() == idx.size() && cand.turns[0].input_tokens == static_cast<int64_t>(first_words)) ts = &cand;
    ASSERT_NE(ts, nullptr) << nonce << " (" << first_words << " words, " << idx.size() << " turns)";
    for (size_t k = 0; k < idx.size(); ++k) {
      const Seen& cur = rp.seen[idx[k]];
      EXPECT_EQ(cur.req.max_tokens, ts->turns[k].output_tokens);
      prompt_sum += static_cast<int64_t>(split_words(cur.req.prompt).size());
      cached_sum += cur.cached;
      output_sum += cur.req.max_tokens;
      if (k == 0) continue;
      const Seen& prev = rp.seen[idx[k - 1]];
      // Turn k's prompt = turn k-1's prompt + its output + the new input, byte for byte.
      const std::string carried = prev.req.prompt + fake_output(prev.req.max_tokens);
      ASSERT_EQ(cur.req.prompt.compare(0, carried.size(), carried), 0) << "session " << ts->id << " turn " << k;
      const std::string fresh = cur.req.prompt.substr(carried.size());
      if (ts->turns[k].input_text.empty()) {
        EXPECT_EQ(static_cast<int64_t>(split_words(fresh).size()), ts->turns[k].input_tokens);
      } else {
        EXPECT_EQ(fresh.substr(0, 2), "\n\n");
        EXPECT_EQ(fresh.substr(2), ts->turns[k].input_text);
      }
      // The fake cache holds the prompts it saw (not outputs), in full blocks of 2 words: it serves the
      // words turn k shares with turn k-1's prompt (the fake's output has no leading space, so the
      // prompt's last word and "t0" fuse into one word).
      const auto pw = split_words(prev.req.prompt), cw = split_words(cur.req.prompt);
      size_t common = 0;
      while (common < pw.size() && common < cw.size() && pw[common] == cw[common]) ++common;
      EXPECT_GE(common + 1, pw.size());
      EXPECT_EQ(cur.cached, static_cast<int64_t>(common) / 2 * 2);
      // Sequential, after the think time: the server received turn k no earlier than it finished
      // sending turn k-1 (ttft + gaps) plus the think time.
      const double prev_done = prev.ttft + 0.002 * static_cast<double>(prev.req.max_tokens - 1);
      EXPECT_GE(static_cast<double>(cur.req.arrival_ns - prev.req.arrival_ns) * 1e-9,
                prev_done + ts->turns[k - 1].think_time_s)
          << "session " << ts->id << " turn " << k;
    }
    by_turns[idx.size()] = idx;
    if (ts->id == "a") by_turns[99] = idx;
  }
  // Order at the server: a waits 1 s after its first turn; b's three turns (no think time) all
  // arrive before a's second; c (third session, cap 2) starts only after b ended.
  const std::vector<size_t>& a = by_turns[99];
  std::vector<size_t> b, cc;
  for (auto& [nonce, idx] : by_session) {
    if (idx == a) continue;
    (idx.size() == 3 ? b : cc) = idx;
  }
  ASSERT_EQ(b.size(), 3u);
  ASSERT_EQ(cc.size(), 2u);
  EXPECT_LT(b[2], a[1]);
  EXPECT_GT(cc[0], b[2]);
  // Computed tokens come from the server's cached_tokens.
  EXPECT_EQ(m.prompt_tokens, prompt_sum);
  EXPECT_EQ(m.cached_tokens, cached_sum);
  EXPECT_EQ(m.output_tokens, output_sum);
  EXPECT_GT(m.cached_tokens, 0);
  EXPECT_NEAR(m.computed_tps * m.duration_s, static_cast<double>(prompt_sum - cached_sum + output_sum), 1e-6);
  EXPECT_NEAR(m.total_tps * m.duration_s, static_cast<double>(prompt_sum + output_sum), 1e-6);
  // TTFT per depth: 3 / 3 / 2 turns, scripted 10 / 110 / 210 ms (lower bounds; medians in order).
  ASSERT_EQ(m.depths.size(), 3u);
  EXPECT_EQ(m.depths[0].completed, 3);
  EXPECT_EQ(m.depths[1].completed, 3);
  EXPECT_EQ(m.depths[2].completed, 2);
  for (int d = 0; d < 3; ++d) EXPECT_GE(m.depths[static_cast<size_t>(d)].ttft.p50, 0.01 + 0.1 * d);
  EXPECT_LT(m.depths[0].ttft.p50, m.depths[1].ttft.p50);
  EXPECT_LT(m.depths[1].ttft.p50, m.depths[2].ttft.p50);
  // Client side: turn k sent no earlier than turn k-1 ended + think time; at most 2 sessions at once.
  const nlohmann::json& reqs = run.result()["points"][0]["requests"];
  std::map<int64_t, std::vector<nlohmann::json>> client;
  for (const auto& r : reqs) client[r["session"].get<int64_t>()].push_back(r);
  for (auto& [sid, turns] : client)
    for (size_t k = 1; k < turns.size(); ++k) EXPECT_GE(turns[k]["sent_s"].get<double>(), turns[k - 1]["end_s"].get<double>());
  // Report and JSON carry the trace section.
  EXPECT_NE(out.str().find("Jobs per hour:"), std::string::npos);
  EXPECT_NE(out.str().find("| Turn | Requests ok / sent | TTFT p50 / p95 (s) |"), std::string::npos);
  std::ifstream jf(c.output_json);
  const nlohmann::json doc = nlohmann::json::parse(jf);
  EXPECT_EQ(doc["trace"]["jobs_completed"], 3);
  EXPECT_EQ(doc["trace"]["by_turn"].size(), 3u);
  EXPECT_EQ(doc["workload"]["workload"], "trace");
  EXPECT_EQ(doc["trace"]["cached_tokens"], cached_sum);
}

TEST(TraceReplay, ChatCarriesMessagesAndAFailedTurnEndsItsSession) {
  // Two sessions of 3 turns, both at once. The server's 3rd request (turn 1 of one session) fails:
  // that session sends nothing more; the other completes.
  const std::string trace =
      R"({"session_id": "x", "turns": [{"input_tokens": 12, "output_tokens": 3}, {"input_tokens": 5, "output_tokens": 2}, {"input_tokens": 4, "output_tokens": 2}]})" "\n"
      R"({"session_id": "y", "turns": [{"input_tokens": 15, "output_tokens": 2}, {"input_tokens": 6, "output_tokens": 2}, {"input_tokens": 3, "output_tokens": 2}]})" "\n";
  Replay rp;
  rp.fail_seq = 2;
  ASSERT_TRUE(rp.server->start());
  BenchConfig c = trace_config(rp.server->base_url(), write_tmp("replay_chat.jsonl", trace));
  c.max_concurrency = 2;
  std::ostringstream out, err;
  BenchRun run(c, out, err);
  Status s = run.run();
  ASSERT_TRUE(s.is_ok()) << s.to_string() << err.str();
  const TraceMetrics& m = *run.trace_metrics();
  EXPECT_EQ(m.sessions_completed, 1);
  EXPECT_EQ(m.sessions_failed, 1);
  std::lock_guard<std::mutex> lock(rp.mu);
  ASSERT_EQ(rp.seen.size(), 5u);  // 3 + 2 (the failed turn, then nothing)
  const std::string failed_nonce = std::string(split_words(rp.seen[2].req.body["messages"][0]["content"].get<std::string>())[1]);
  int failed_turns = 0;
  for (size_t i = 0; i < rp.seen.size(); ++i) {
    const nlohmann::json& msgs = rp.seen[i].req.body["messages"];
    const std::string first = msgs[0]["content"].get<std::string>();
    if (first.find(failed_nonce) != std::string::npos) ++failed_turns;
    ASSERT_EQ(msgs.size() % 2, 1u);
    const size_t k = msgs.size() / 2;  // turn depth
    if (k == 0) continue;
    // Find the same session's previous request: messages_k = messages_{k-1} ++ [assistant output] ++ [user].
    bool found = false;
    for (size_t j = 0; j < i; ++j) {
      const nlohmann::json& pm = rp.seen[j].req.body["messages"];
      if (pm.size() != msgs.size() - 2 || pm[0] != msgs[0]) continue;
      found = true;
      for (size_t q = 0; q < pm.size(); ++q) EXPECT_EQ(msgs[q], pm[q]);
      EXPECT_EQ(msgs[pm.size()]["role"], "assistant");
      EXPECT_EQ(msgs[pm.size()]["content"], fake_output(rp.seen[j].req.max_tokens));
      EXPECT_EQ(msgs.back()["role"], "user");
    }
    EXPECT_TRUE(found) << "request " << i;
  }
  EXPECT_EQ(failed_turns, 2);
  EXPECT_EQ(m.depths.at(1).sent, 2);
  EXPECT_EQ(m.depths.at(1).completed, 1);
  EXPECT_EQ(m.depths.at(2).sent, 1);
}

TEST(TraceReplay, SessionRateAndRepeatedSessionsFromTheGenerator) {
  // 4 session instances of a 2-session generated trace (instances 2, 3 repeat with fresh nonces),
  // arriving at a constant 10/s: instance i is not sent before 0.1 i s.
  TraceGenConfig g;
  g.sessions = 2;
  g.turns = 2;
  g.first_turn_tokens = 20;
  g.turn_tokens = 5;
  g.output_tokens = 2;
  g.think_time_s = 0.05;
  g.seed = 11;
  const std::string path = write_tmp("replay_rate.jsonl", write_trace_text(generate_trace(g)));
  Replay rp;
  ASSERT_TRUE(rp.server->start());
  BenchConfig c = trace_config(rp.server->base_url(), path);
  c.session_rate = 10;
  c.arrival.kind = ArrivalKind::kConstant;
  c.num_sessions = 4;
  std::ostringstream out, err;
  BenchRun run(c, out, err);
  Status s = run.run();
  ASSERT_TRUE(s.is_ok()) << s.to_string() << err.str();
  EXPECT_EQ(run.trace_metrics()->sessions_completed, 4);
  const nlohmann::json& reqs = run.result()["points"][0]["requests"];
  std::map<int64_t, double> first_sent;
  for (const auto& r : reqs)
    if (r["turn"] == 0) first_sent[r["session"].get<int64_t>()] = r["sent_s"].get<double>();
  ASSERT_EQ(first_sent.size(), 4u);
  for (auto& [sid, t] : first_sent) EXPECT_GE(t, 0.1 * static_cast<double>(sid) - 1e-9) << sid;
  // Every first turn is unique: no session's cache hit comes from another session.
  std::lock_guard<std::mutex> lock(rp.mu);
  for (const Seen& seen : rp.seen)
    if (seen.req.body["messages"].size() == 1) {
      EXPECT_EQ(seen.cached, 0);
    }
}

}  // namespace
}  // namespace mxserve::bench
