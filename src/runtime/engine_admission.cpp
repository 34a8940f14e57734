// Engine admission (engine.h, "The waiting-queue bound"): the counts submit() admits against, kept under
// inbox_mutex_. Invariant: a request counts against max_waiting / the running slots only while it is live --
// abort() uncounts it at once, whatever the engine thread is doing -- and a count the engine thread has not
// refreshed yet is never lower than what the scheduler holds (arrivals are counted as they leave the inbox).
#include <algorithm>

#include "runtime/engine.h"

namespace mxserve::runtime {

bool Engine::admits_one_more() const {
  const int64_t live_inbox = static_cast<int64_t>(inbox_.size()) - dropped_inbox_;
  const int64_t live_waiting = waiting_published_ - dropped_waiting_;
  const int64_t live_running = running_published_ - dropped_running_;
  // Something live waiting means the scheduler could not run it (slots, blocks or the prefill budget): no
  // running slot counts as free for a newcomer then.
  const int64_t free_slots =
      live_waiting > 0 ? 0 : std::max<int64_t>(0, config_.scheduler.max_running - live_running);
  return live_inbox + live_waiting < config_.max_waiting + free_slots;
}

void Engine::count_drained(const std::vector<std::unique_ptr<Sequence>>& fresh) {
  const int64_t live_waiting = waiting_published_ - dropped_waiting_;
  const int64_t live_running = running_published_ - dropped_running_;
  int64_t free_slots = live_waiting > 0 ? 0 : std::max<int64_t>(0, config_.scheduler.max_running - live_running);
  for (const auto& seq : fresh) {
    Admission& a = admission_[seq->id];
    if (a.dropped) {  // aborted while in the inbox: uncounted already, finished by this drain
      --dropped_inbox_;
      continue;
    }
    if (free_slots > 0) {  // free slots first, waiting beyond them
      --free_slots;
      a.phase = Admission::Phase::kRunning;
      ++running_published_;
    } else {
      a.phase = Admission::Phase::kWaiting;
      ++waiting_published_;
    }
  }
}

void Engine::publish_admission() {
  std::lock_guard<std::mutex> lock(inbox_mutex_);
  waiting_published_ = static_cast<int64_t>(scheduler_.waiting().size());
  running_published_ = static_cast<int64_t>(scheduler_.running().size());
  dropped_waiting_ = dropped_running_ = 0;
  // Aborts that arrived since this step's drain stay uncounted (they are finished by the next one).
  for (const Sequence* seq : scheduler_.waiting()) {
    Admission& a = admission_[seq->id];
    a.phase = Admission::Phase::kWaiting;
    dropped_waiting_ += a.dropped;
  }
  for (const Sequence* seq : scheduler_.running()) {
    Admission& a = admission_[seq->id];
    a.phase = Admission::Phase::kRunning;
    dropped_running_ += a.dropped;
  }
}

void Engine::abort(RequestId id) {
  std::lock_guard<std::mutex> lock(inbox_mutex_);
  abort_inbox_.push_back(id);
  inbox_cv_.notify_one();
  auto it = admission_.find(id);
  if (it == admission_.end() || it->second.dropped) return;  // finished already, or aborted twice
  it->second.dropped = true;
  switch (it->second.phase) {
    case Admission::Phase::kInbox: ++dropped_inbox_; break;
    case Admission::Phase::kWaiting: ++dropped_waiting_; break;
    case Admission::Phase::kRunning: ++dropped_running_; break;
  }
}

}  // namespace mxserve::runtime
