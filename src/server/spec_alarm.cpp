#include "server/spec_alarm.h"

#include <cstdio>

namespace mxserve::server {

SpecAcceptanceAlarm::SpecAcceptanceAlarm(SpecAlarmOptions o) : o_(o) {
  state_.enabled = o_.bound > 0 && o_.window > 0;
  state_.bound = o_.bound;
  history_.push_back(Snapshot{});  // the server starts from zero counters
}

std::optional<std::string> SpecAcceptanceAlarm::update(const runtime::SpecStats& s) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!state_.enabled) return std::nullopt;
  Snapshot now{s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, s.accepted_per_pos};
  if (now.drafts < history_.back().drafts) history_.clear();  // counters went back (a new engine): start over
  if (!history_.empty() && now.drafts == history_.back().drafts) return std::nullopt;  // nothing new
  history_.push_back(now);
  // The window starts at the newest snapshot at least `window` verify steps back.
  while (history_.size() > 2 && now.drafts - history_[1].drafts >= o_.window) history_.pop_front();
  const Snapshot& base = history_.front();
  const int64_t d = now.drafts - base.drafts;
  if (d < o_.window) return std::nullopt;  // not a full window yet
  state_.judged = true;
  state_.window_drafts = d;
  state_.rate_per_pos.assign(now.per_pos.size(), 0.0);
  for (size_t i = 0; i < now.per_pos.size(); ++i) {
    const int64_t b = i < base.per_pos.size() ? base.per_pos[i] : 0;
    state_.rate_per_pos[i] = static_cast<double>(now.per_pos[i] - b) / static_cast<double>(d);
  }
  const int64_t dt = now.draft_tokens - base.draft_tokens;
  state_.token_rate = dt > 0 ? static_cast<double>(now.accepted - base.accepted) / static_cast<double>(dt) : 0;
  const double first = state_.rate_per_pos.empty() ? 0.0 : state_.rate_per_pos[0];
  const bool collapsed = first < o_.bound;
  if (collapsed == state_.collapsed) return std::nullopt;
  state_.collapsed = collapsed;
  char buf[512];
  if (collapsed) {
    ++state_.alarms;
    std::snprintf(buf, sizeof(buf),
                  "MTP acceptance COLLAPSED: over the last %lld verify steps the first draft was accepted %.1f%% of "
                  "the time (%.1f%% of all drafted tokens), below --spec-acceptance-alarm %.2f. Speculation now "
                  "costs more than it saves; outputs stay correct. Check the draft layer (MTP weights, KV cache "
                  "tiers) or turn speculation off (drop --speculative-algorithm)",
                  static_cast<long long>(d), 100 * first, 100 * state_.token_rate, o_.bound);
  } else {
    std::snprintf(buf, sizeof(buf),
                  "MTP acceptance recovered: the first draft was accepted %.1f%% of the time over the last %lld "
                  "verify steps (bound %.2f)",
                  100 * first, static_cast<long long>(d), o_.bound);
  }
  return std::string(buf);
}

SpecAlarmState SpecAcceptanceAlarm::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_;
}

}  // namespace mxserve::server
