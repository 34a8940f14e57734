// TraceSchedule (see trace_workload.h).
#include "bench/trace_workload.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "bench/workload.h"

namespace mxserve::bench {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) { return mix(mix(mix(a) ^ b) ^ c); }

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

Result<std::unique_ptr<TraceSchedule>> TraceSchedule::make(const Trace& trace, TraceReplayConfig config,
                                                           const TokenCodec* codec, const TokenCorpus* corpus) {
  if (trace.sessions.empty()) return invalid_argument("--trace: no sessions");
  if (trace.needs_tokenizer() && (!codec || !corpus))
    return invalid_argument("--workload trace: turns with input_tokens are cut from the corpus and need --tokenizer");
  const int64_t n = config.num_sessions > 0 ? config.num_sessions : static_cast<int64_t>(trace.sessions.size());
  if (!config.session_offsets.empty() && static_cast<int64_t>(config.session_offsets.size()) < n)
    return internal_error("trace schedule: fewer session arrival times than sessions");
  std::unique_ptr<TraceSchedule> s(new TraceSchedule(std::move(config)));
  s->codec_ = codec;
  s->corpus_ = corpus;
  s->file_sessions_ = static_cast<int64_t>(trace.sessions.size());
  if (!s->c_.chat && codec) { MX_ASSIGN_OR_RETURN(s->sep_, codec->encode("\n\n")); }
  s->sessions_.resize(static_cast<size_t>(n));
  int64_t total_tokens = 0;
  for (int64_t i = 0; i < n; ++i) {
    Session& ses = s->sessions_[static_cast<size_t>(i)];
    ses.src = &trace.sessions[static_cast<size_t>(i) % trace.sessions.size()];
    for (const TraceTurn& t : ses.src->turns) total_tokens += t.input_tokens;
  }
  // Up front (no prompt building between network events) unless the text would not fit memory
  // comfortably; then each session's inputs are built when it starts.
  s->lazy_ = total_tokens > s->c_.prebuild_token_cap;
  if (!s->lazy_)
    for (int64_t i = 0; i < n; ++i) MX_RETURN_IF_ERROR(s->build_inputs(i));
  return s;
}

Status TraceSchedule::build_inputs(int64_t i) {
  Session& ses = sessions_[static_cast<size_t>(i)];
  if (!ses.inputs.empty()) return Status::ok();
  const bool repeat = i >= file_sessions_;
  char nonce[64];
  std::snprintf(nonce, sizeof nonce, "Session %016llx.", static_cast<unsigned long long>(hash3(c_.seed, 0x5e55, i)));
  for (size_t k = 0; k < ses.src->turns.size(); ++k) {
    const TraceTurn& t = ses.src->turns[k];
    NewInput in;
    if (!t.input_text.empty()) {
      // A repeated session would otherwise send the same text as its first instance (a free cache hit).
      in.text = (k == 0 && repeat ? std::string(nonce) + "\n" : std::string()) + (k > 0 && !c_.chat ? "\n\n" : "") +
                t.input_text;
      if (codec_) {
        MX_ASSIGN_OR_RETURN(auto ids, codec_->encode(in.text));
        in.tokens = static_cast<int64_t>(ids.size());
      }
    } else {
      std::vector<int32_t> prefix;
      if (k == 0) {
        MX_ASSIGN_OR_RETURN(prefix, codec_->encode(nonce));
      } else {
        prefix = sep_;
      }
      MX_ASSIGN_OR_RETURN(FittedText f, fit_prompt(*codec_, *corpus_, prefix, hash3(c_.seed ^ 0x7ace, i, k), t.input_tokens));
      in.text = std::move(f.text);
      in.tokens = f.tokens;
    }
    ses.inputs.push_back(std::move(in));
  }
  return Status::ok();
}

bool TraceSchedule::can_admit() const {
  return next_arrival_ < sessions_.size() && (c_.max_active <= 0 || active_ < c_.max_active);
}

double TraceSchedule::next_ready_s() const {
  double t = due_.empty() ? kInf : due_.top().at;
  if (can_admit()) t = std::min(t, arrival_time(next_arrival_));
  return t;
}

bool TraceSchedule::exhausted() const {
  return next_arrival_ >= sessions_.size() && due_.empty() && in_flight_ == 0;
}

Result<RequestSpec> TraceSchedule::next(double now_s, double* scheduled_s) {
  int64_t id;
  if (!due_.empty() && due_.top().at <= now_s &&
      !(can_admit() && arrival_time(next_arrival_) < due_.top().at)) {
    id = due_.top().session;
    *scheduled_s = due_.top().at;
    due_.pop();
  } else if (can_admit() && arrival_time(next_arrival_) <= now_s) {
    id = static_cast<int64_t>(next_arrival_++);
    // Closed loop: a session is due when a slot frees (now). Arrivals: its arrival time, so waiting
    // for a --max-concurrency slot shows as client queue time.
    *scheduled_s = c_.session_offsets.empty() ? now_s : arrival_time(static_cast<size_t>(id));
    ++active_;
    max_active_seen_ = std::max(max_active_seen_, active_);
    if (lazy_) MX_RETURN_IF_ERROR(build_inputs(id));
  } else {
    return internal_error("trace schedule: next() called with nothing due");
  }
  Session& s = sessions_[static_cast<size_t>(id)];
  const size_t k = s.next_turn;
  const NewInput& in = s.inputs[k];
  const TraceTurn& turn = s.src->turns[k];
  nlohmann::json body;
  body["model"] = c_.model;
  if (c_.chat) {
    body["messages"] = s.messages;
    body["messages"].push_back({{"role", "user"}, {"content", in.text}});
  } else {
    body["prompt"] = s.prompt + in.text;
  }
  body["max_tokens"] = turn.output_tokens;
  if (c_.ignore_eos) body["ignore_eos"] = true;
  if (c_.temperature >= 0) body["temperature"] = c_.temperature;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (c_.extra_body.is_object()) body.update(c_.extra_body);
  RequestSpec spec;
  // Invalid UTF-8 in a dataset row or a model's text must not abort the run: replaced by U+FFFD.
  spec.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // Completions: history + new input as the client counts them (boundary merges aside). Chat: the
  // template adds tokens per message, so the count is left unknown rather than reported wrong.
  spec.intended_input = !c_.chat && in.tokens >= 0 && s.context_tokens >= 0 ? s.context_tokens + in.tokens : -1;
  spec.intended_output = turn.output_tokens;
  spec.session = id;
  spec.turn = static_cast<int>(k);
  spec.capture_text = true;
  s.in_flight = true;
  ++in_flight_;
  return spec;
}

void TraceSchedule::end_session(Session& s, double now_s) {
  s.ended = true;
  s.messages = nlohmann::json::array();  // the history is not needed any more
  std::string().swap(s.prompt);
  std::vector<NewInput>().swap(s.inputs);
  --active_;
  // --duration: once a session ends past it, start no more.
  if (c_.duration_s > 0 && now_s >= c_.duration_s) next_arrival_ = sessions_.size();
}

void TraceSchedule::on_finish(RequestRecord& rec) {
  if (rec.session < 0 || rec.session >= static_cast<int64_t>(sessions_.size())) return;
  Session& s = sessions_[static_cast<size_t>(rec.session)];
  if (!s.in_flight) return;
  s.in_flight = false;
  --in_flight_;
  const size_t k = s.next_turn;
  if (!rec.ok) {
    end_session(s, rec.end_s);
    return;
  }
  const NewInput& in = s.inputs[k];
  if (c_.chat) {
    s.messages.push_back({{"role", "user"}, {"content", in.text}});
    nlohmann::json a = {{"role", "assistant"}, {"content", rec.output_text}};
    if (!rec.reasoning_text.empty()) a["reasoning_content"] = rec.reasoning_text;
    s.messages.push_back(std::move(a));
  } else {
    s.prompt += in.text;
    s.prompt += rec.output_text;
  }
  if (in.tokens < 0 || s.context_tokens < 0) s.context_tokens = -1;
  else s.context_tokens += in.tokens + rec.output_tokens_effective();
  rec.output_text.clear();
  rec.output_text.shrink_to_fit();
  rec.reasoning_text.clear();
  rec.reasoning_text.shrink_to_fit();
  s.next_turn = k + 1;
  if (s.next_turn >= s.src->turns.size()) {
    end_session(s, rec.end_s);
    return;
  }
  due_.push(Due{rec.end_s + s.src->turns[k].think_time_s, rec.session});
}

std::vector<int64_t> TraceSchedule::turns_per_instance() const {
  std::vector<int64_t> out;
  out.reserve(sessions_.size());
  for (const Session& s : sessions_) out.push_back(static_cast<int64_t>(s.src->turns.size()));
  return out;
}

nlohmann::json TraceSchedule::describe(const std::string& file) const {
  int64_t turns = 0;
  for (const Session& s : sessions_) turns += static_cast<int64_t>(s.src->turns.size());
  return {{"workload", "trace"},
          {"prompts_built", lazy_ ? "when each session starts (over the prebuild cap)" : "before the clock started"},
          {"file", file},
          {"sessions", sessions_.size()},
          {"turns", turns},
          {"max_concurrency_sessions", c_.max_active},
          {"session_arrivals", c_.session_offsets.empty() ? "all at start (closed loop)" : "scheduled"},
          {"context", c_.chat ? "messages_k + assistant output_k + user new_{k+1}"
                              : "prompt_k + output_k + new_{k+1}"}};
}

}  // namespace mxserve::bench
