// Decision hooks (decisions.h).
#include "model/decisions.h"

#include <algorithm>

namespace mxserve::model {
namespace {

thread_local DecisionHook* g_active = nullptr;

}  // namespace

const char* decision_site_name(DecisionSite s) {
  switch (s) {
    case DecisionSite::kExpertRouting: return "routing";
    case DecisionSite::kIndexTopk: return "index top-k";
  }
  return "?";
}

bool DecisionRows::same_row(const DecisionRows& o, int64_t r) const {
  return width == o.width && std::equal(row(r), row(r) + width, o.row(r));
}

std::string DecisionRows::describe_row(int64_t r) const {
  std::string s = "{";
  for (int64_t i = 0; i < width && row(r)[i] >= 0; ++i) s += (i ? ", " : "") + std::to_string(row(r)[i]);
  return s + "}";
}

DecisionHook* active_decision_hook() { return g_active; }

ScopedDecisionHook::ScopedDecisionHook(DecisionHook* hook) : previous_(g_active) { g_active = hook; }
ScopedDecisionHook::~ScopedDecisionHook() { g_active = previous_; }

void DecisionForcer::on_decision(DecisionRows& d) {
  observed.push_back(d);
  if (next_ >= to_force_.size()) {
    if (status_.is_ok())
      status_ = internal_error(std::string("decision forcing: more decisions than recorded (") +
                               decision_site_name(d.site) + " at layer " + std::to_string(d.layer) + ")");
    return;
  }
  const DecisionRows& want = to_force_[next_++];
  if (want.site != d.site || want.layer != d.layer || want.rows != d.rows || want.width != d.width) {
    if (status_.is_ok())
      status_ = internal_error(std::string("decision forcing: the forward made ") + decision_site_name(d.site) +
                               " at layer " + std::to_string(d.layer) + " over " + std::to_string(d.rows) +
                               " rows where the recording has " + decision_site_name(want.site) + " at layer " +
                               std::to_string(want.layer) + " over " + std::to_string(want.rows) + " rows");
    return;
  }
  d.ids = want.ids;
  d.forced = true;
}

}  // namespace mxserve::model
