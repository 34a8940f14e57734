// SpecAcceptanceAlarm: watches MTP draft acceptance over a sliding window of verify steps and raises an alarm
// (one warning line, a gauge) when it collapses -- e.g. a KV cache tier or a kernel that corrupts the draft
// layer's state makes the drafts worthless while outputs stay correct, so nothing else would show it.
// Fed cumulative engine counters (runtime::SpecStats) by whoever reads them (the stats thread, /metrics); the
// window is the most recent >= `window` verify steps between two such reads. Invariant: the alarm judges only
// a full window (a quiet or new server never alarms), and it logs once per transition (collapsed / recovered).
// Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace mxserve::server {

struct SpecAlarmOptions {
  double bound = 0.2;     // alarm when the window's position-1 acceptance is below this (0: off)
  int64_t window = 256;   // verify steps (drafts) in the window
};

struct SpecAlarmState {
  bool enabled = false;
  bool judged = false;                     // a full window has been seen
  bool collapsed = false;
  double bound = 0;
  int64_t window_drafts = 0;               // verify steps in the window last judged
  std::vector<double> rate_per_pos;        // accepted at position i + 1 / verify steps, over that window
  double token_rate = 0;                   // accepted / drafted tokens over that window
  int64_t alarms = 0;                      // times it went from healthy to collapsed
};

class SpecAcceptanceAlarm {
 public:
  explicit SpecAcceptanceAlarm(SpecAlarmOptions o = {});
  // Feeds a snapshot of the cumulative counters; returns the warning or recovery line when the state changes
  // (the caller logs it), else nullopt.
  std::optional<std::string> update(const runtime::SpecStats& s);
  SpecAlarmState state() const;

 private:
  struct Snapshot {
    int64_t drafts = 0, draft_tokens = 0, accepted = 0;
    std::vector<int64_t> per_pos;
  };
  SpecAlarmOptions o_;
  mutable std::mutex mutex_;
  std::deque<Snapshot> history_;  // oldest first; history_.front() is the window's start
  SpecAlarmState state_;
};

}  // namespace mxserve::server
