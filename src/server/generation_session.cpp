#include "server/generation_session.h"

#include <algorithm>
#include <iterator>
#include <map>

namespace mxserve::server {
namespace {

double seconds(runtime::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

GenerationSession::GenerationSession(ServerContext& ctx, const GenerationOptions& gen)
    : ctx_(ctx), gen_(gen), inbox_(std::make_shared<Inbox>()), arrival_(runtime::Clock::now()) {
  ++ctx_.active_sessions;
}

GenerationSession::~GenerationSession() {
  abort_all();
  --ctx_.active_sessions;
}

std::optional<ApiError> GenerationSession::submit(const std::vector<ChoiceInput>& inputs, int64_t max_tokens) {
  runtime::Engine& engine = *ctx_.model.engine;
  choices_.resize(inputs.size() * static_cast<size_t>(gen_.n));
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (int j = 0; j < gen_.n; ++j) {
      const int k = static_cast<int>(i) * gen_.n + j;
      Choice& c = choices_[k];
      c.prompt_index = inputs[i].prompt_index;
      c.prompt_tokens = static_cast<int64_t>(inputs[i].prompt.size());
      c.input = &inputs[i];
      c.detok = std::make_unique<tokenizer::StreamingDetokenizer>(*ctx_.model.tokenizer, gen_.stop,
                                                                  gen_.skip_special_tokens);
      runtime::RequestSpec spec;
      spec.prompt = inputs[i].prompt;
      spec.sampling = gen_.sampling;
      drop_generated_ = max_tokens == 0;
      spec.sampling.max_tokens = static_cast<int32_t>(std::max<int64_t>(max_tokens, 1));
      spec.sampling.logprobs = gen_.logprobs;
      // Echo with logprobs needs every prompt token's logprob (and the top alternatives the client asked for).
      const int echo_lp = gen_.echo && gen_.logprobs >= 0 ? gen_.logprobs : -1;
      spec.sampling.prompt_logprobs = std::max(gen_.prompt_logprobs, echo_lp);
      if (gen_.sampling.seed) spec.sampling.seed = *gen_.sampling.seed + static_cast<uint64_t>(j);
      if (gen_.grammar) {
        if (!ctx_.model.structured) {
          abort_all();
          choices_.clear();
          n_open_ = 0;
          return unsupported_field("response_format", "this server has no token index for structured output");
        }
        spec.constraint = ctx_.model.structured->make(gen_.grammar, max_tokens);  // one state per choice
      }
      std::shared_ptr<Inbox> inbox = inbox_;
      auto id = engine.submit(std::move(spec), [inbox, k](const runtime::TokenEvent& ev) {
        const auto now = runtime::Clock::now();
        std::lock_guard<std::mutex> lock(inbox->mutex);
        inbox->events.push_back(Event{k, ev, now});
        inbox->cv.notify_one();
      });
      if (!id.is_ok()) {
        abort_all();
        choices_.clear();
        n_open_ = 0;
        return from_status(id.status(), "");
      }
      c.id = *id;
      c.submitted = true;
      c.submitted_at = runtime::Clock::now();
      ++n_open_;
      ctx_.metrics.add_prompt_tokens(c.prompt_tokens);
    }
  }
  return std::nullopt;
}

bool GenerationSession::poll(std::vector<ChoiceDelta>* out, std::chrono::milliseconds timeout) {
  if (ctx_.stopping) abort_all();  // the server is going down: stop waiting for the engine
  if (n_open_ == 0) return false;
  std::deque<Event> events;
  {
    std::unique_lock<std::mutex> lock(inbox_->mutex);
    inbox_->cv.wait_for(lock, timeout, [&] { return !inbox_->events.empty(); });
    events.swap(inbox_->events);
  }
  std::map<int, ChoiceDelta> deltas;
  for (const Event& e : events) {
    ChoiceDelta& d = deltas[e.choice];
    d.index = e.choice;
    handle(e, &d);
  }
  for (auto& [k, d] : deltas)
    if (d.n_tokens > 0 || !d.finish_reason.empty()) out->push_back(std::move(d));
  return true;
}

void GenerationSession::handle(const Event& e, ChoiceDelta* delta) {
  Choice& c = choices_[e.choice];
  if (c.finished) return;
  const runtime::TokenEvent& ev = e.ev;
  if (ev.usage.prompt_tokens > 0) c.cached_tokens = ev.usage.cached_tokens;
  c.spec_drafts = ev.usage.spec_drafts;
  c.spec_draft_tokens = ev.usage.spec_draft_tokens;
  c.spec_accepted = ev.usage.spec_accepted_tokens;
  if (!c.prompt_sent && (ev.token >= 0 || ev.finish != runtime::FinishReason::kNone)) add_prompt_part(c, ev, delta);
  if (ev.token >= 0 && !c.cache_counted) {  // cached_tokens is final from the first token on
    ctx_.metrics.add_cached_tokens("gpu", ev.usage.cached_tokens - ev.usage.cached_host_tokens);
    if (ev.usage.cached_host_tokens > 0) ctx_.metrics.add_cached_tokens("host", ev.usage.cached_host_tokens);
    c.cache_counted = true;
  }
  if (ev.token >= 0 && drop_generated_) {  // max_tokens 0: the prompt part only
    if (ev.finish == runtime::FinishReason::kNone) ctx_.model.engine->abort(c.id);
    finish_choice(c, "length", delta);
    return;
  }
  if (ev.token >= 0) {
    if (!c.last_token) {
      c.first_token = e.at;
      c.first_scheduled = ev.first_scheduled;
    }
    ++c.n_tokens;
    ++delta->n_tokens;
    ctx_.metrics.add_generation_tokens(1);
    if (!c.last_token) {
      ctx_.metrics.observe_ttft(seconds(e.at - arrival_));
    } else {
      ctx_.metrics.observe_itl(seconds(e.at - *c.last_token));
      ctx_.metrics.observe_tpot(seconds(e.at - *c.last_token));
    }
    c.last_token = e.at;
    if (gen_.logprobs >= 0) delta->logprobs.push_back(TokenLogprob{ev.token, ev.logprob, ev.top_logprobs});
    delta->text += c.detok->push(ev.token);
    if (c.detok->stopped()) {
      if (gen_.include_stop_str_in_output) delta->text += *c.detok->matched_stop();
      delta->stop_str = *c.detok->matched_stop();
      ctx_.model.engine->abort(c.id);  // generation past a stop string is wasted work: free its blocks now
      finish_choice(c, "stop", delta);
      return;
    }
  }
  if (ev.finish != runtime::FinishReason::kNone) {
    delta->text += c.detok->finish();
    if (ev.finish == runtime::FinishReason::kError) delta->error = ev.error.empty() ? "engine error" : ev.error;
    finish_choice(c, runtime::finish_reason_name(ev.finish), delta);
  }
}

void GenerationSession::finish_choice(Choice& c, const std::string& reason, ChoiceDelta* delta) {
  c.finished = true;
  --n_open_;
  delta->finish_reason = reason;
  ctx_.metrics.request_finished(reason);
  ctx_.metrics.observe_e2e(seconds(runtime::Clock::now() - arrival_));
  ctx_.metrics.observe_prompt_len(static_cast<double>(c.prompt_tokens));
  ctx_.metrics.observe_generation_len(static_cast<double>(c.n_tokens));
  if (c.spec_drafts > 0) ctx_.metrics.add_request_spec(c.spec_drafts, c.spec_draft_tokens, c.spec_accepted);
  // The engine phases of a request that produced tokens (an abort before the first token has none).
  if (c.last_token && c.first_scheduled != runtime::Clock::time_point{}) {
    ctx_.metrics.observe_queue(std::max(0.0, seconds(c.first_scheduled - c.submitted_at)));
    ctx_.metrics.observe_prefill(std::max(0.0, seconds(c.first_token - c.first_scheduled)));
    const double decode = std::max(0.0, seconds(*c.last_token - c.first_token));
    ctx_.metrics.observe_decode(decode);
    ctx_.metrics.observe_inference(std::max(0.0, seconds(*c.last_token - c.first_scheduled)));
    if (c.n_tokens > 1) ctx_.metrics.observe_request_tpot(decode / static_cast<double>(c.n_tokens - 1));
  }
}

void GenerationSession::add_prompt_part(Choice& c, const runtime::TokenEvent& ev, ChoiceDelta* delta) {
  c.prompt_sent = true;
  if (gen_.prompt_logprobs >= 0) {
    delta->has_prompt_logprobs = true;
    delta->prompt_logprobs = ev.prompt_logprobs;
    for (auto& p : delta->prompt_logprobs)
      if (static_cast<int>(p.top.size()) > gen_.prompt_logprobs) p.top.resize(gen_.prompt_logprobs);
  }
  if (!gen_.echo || c.input == nullptr) return;
  delta->text = c.input->echo_text + delta->text;
  if (gen_.logprobs < 0) return;
  std::vector<TokenLogprob> lps;
  const auto& prompt = c.input->prompt;
  if (!prompt.empty()) lps.push_back(TokenLogprob{prompt[0], 0.f, {}, /*has_logprob=*/false});
  for (const auto& p : ev.prompt_logprobs) {
    TokenLogprob t{p.token, p.logprob, p.top, true};
    if (static_cast<int>(t.top.size()) > gen_.logprobs) t.top.resize(gen_.logprobs);
    lps.push_back(std::move(t));
  }
  lps.insert(lps.end(), std::make_move_iterator(delta->logprobs.begin()), std::make_move_iterator(delta->logprobs.end()));
  delta->logprobs = std::move(lps);
}

void GenerationSession::abort_all() {
  for (Choice& c : choices_) {
    if (!c.submitted || c.finished) continue;
    ctx_.model.engine->abort(c.id);
    c.finished = true;
    --n_open_;
    ctx_.metrics.request_finished("abort");
  }
}

UsageTotals GenerationSession::usage() const {
  UsageTotals u;
  std::map<int, bool> counted;  // prompt tokens count once per prompt, not per choice
  for (const Choice& c : choices_) {
    u.completion_tokens += c.n_tokens;
    if (!counted[c.prompt_index]) {
      counted[c.prompt_index] = true;
      u.prompt_tokens += c.prompt_tokens;
      u.cached_tokens += c.cached_tokens;
    }
  }
  return u;
}

}  // namespace mxserve::server
