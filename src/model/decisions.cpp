// Decision hooks, the format-bound judgement, the positional book and forcer (decisions.h).
#include "model/decisions.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace mxserve::model {
namespace {

thread_local DecisionHook* g_active = nullptr;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<int32_t> valid_ids(const int32_t* ids, int64_t width) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < width; ++i)
    if (ids[i] >= 0) v.push_back(ids[i]);
  std::sort(v.begin(), v.end());
  return v;
}

std::string fmt(const char* f, double a, double b, double c) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), f, a, b, c);
  return buf;
}

// Whether `chosen` can be the top-|chosen| set of `cand` under |perturbation_j| <= b_j: the lowest upper end
// among the chosen reaches the highest lower end among the others.
bool selectable(const std::vector<int32_t>& chosen, const std::vector<int32_t>& cand, const std::vector<double>& s,
                const std::vector<double>& b) {
  std::set<int32_t> in(chosen.begin(), chosen.end());
  double lo_chosen = kInf, hi_other = -kInf;
  for (int32_t j : chosen) lo_chosen = std::min(lo_chosen, s[j] + b[j]);
  for (int32_t j : cand)
    if (!in.count(j)) hi_other = std::max(hi_other, s[j] - b[j]);
  return lo_chosen >= hi_other;
}

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

RowJudgement judge_row(const DecisionRows& ref, int64_t r, const int32_t* got, double u) {
  RowJudgement j;
  const std::vector<int32_t> R = valid_ids(ref.row(r), ref.width), M = valid_ids(got, ref.width);
  if (R == M) return j;
  j.same = false;
  const std::vector<double>& s = ref.scores[r];
  const int64_t n = static_cast<int64_t>(s.size());
  std::vector<double> b(n);
  for (int64_t c = 0; c < n; ++c) b[c] = u * ref.sensitivity[r][c];
  const char* what = ref.site == DecisionSite::kExpertRouting ? "expert" : "key";
  for (int32_t m : M)
    if (m >= n) {  // a candidate the reference could not even see: never rounding
      j.within_bound = false;
      j.worst_ratio = kInf;
      j.detail += std::string(" ") + what + " " + std::to_string(m) + " chosen but not a candidate;";
      return j;
    }
  // Candidates visible to the expert-level selection: every one, or (grouped routing) those of the groups that
  // M's groups plus the best remaining ones (by upper score) make up, when that group choice is itself possible.
  std::vector<int32_t> cand;
  const int64_t G = ref.site == DecisionSite::kExpertRouting ? std::max<int64_t>(ref.n_group, 1) : 1;
  if (G > 1 && ref.topk_group < G) {
    const int64_t per = n / G;
    std::vector<double> gs(G), gb(G);  // nominal group score (top-2 sum) and its bound (the pair's bounds)
    for (int64_t g = 0; g < G; ++g) {
      std::vector<std::pair<double, double>> v;
      for (int64_t e = g * per; e < (g + 1) * per; ++e) v.push_back({s[e], b[e]});
      std::sort(v.begin(), v.end(), [](auto& x, auto& y) { return x.first > y.first; });
      gs[g] = v[0].first + (per > 1 ? v[1].first : 0.0);
      gb[g] = v[0].second + (per > 1 ? v[1].second : 0.0);
    }
    std::set<int64_t> used;
    for (int32_t m : M) used.insert(m / per);
    std::vector<int64_t> rest;
    for (int64_t g = 0; g < G; ++g)
      if (!used.count(g)) rest.push_back(g);
    std::sort(rest.begin(), rest.end(), [&](int64_t x, int64_t y) { return gs[x] + gb[x] > gs[y] + gb[y]; });
    std::vector<int32_t> groups(used.begin(), used.end());
    for (size_t i = 0; static_cast<int64_t>(groups.size()) < ref.topk_group && i < rest.size(); ++i)
      groups.push_back(static_cast<int32_t>(rest[i]));
    std::vector<int32_t> all_groups(G);
    for (int64_t g = 0; g < G; ++g) all_groups[g] = static_cast<int32_t>(g);
    if (static_cast<int64_t>(used.size()) > ref.topk_group || !selectable(groups, all_groups, gs, gb)) {
      j.within_bound = false;
      j.detail += " the model's experts need a group selection no rounding explains;";
    }
    for (int32_t g : groups)
      for (int64_t e = g * per; e < (g + 1) * per; ++e) cand.push_back(static_cast<int32_t>(e));
  } else {
    for (int64_t c = 0; c < n; ++c) cand.push_back(static_cast<int32_t>(c));
  }
  if (!selectable(M, cand, s, b)) j.within_bound = false;
  // Per changed candidate: its distance to the reference's boundary over its bound (plus the boundary's).
  std::set<int32_t> in_r(R.begin(), R.end()), in_m(M.begin(), M.end());
  int32_t lowest_kept = -1, highest_dropped = -1;
  for (int32_t k : R)
    if (lowest_kept < 0 || s[k] < s[lowest_kept]) lowest_kept = k;
  for (int64_t c = 0; c < n; ++c)
    if (!in_r.count(static_cast<int32_t>(c)) && (highest_dropped < 0 || s[c] > s[highest_dropped]))
      highest_dropped = static_cast<int32_t>(c);
  auto note = [&](int32_t c, bool added) {
    const int32_t edge = added ? lowest_kept : highest_dropped;
    if (edge < 0) return;
    const double dist = added ? s[edge] - s[c] : s[c] - s[edge];
    const double bound = b[c] + b[edge];
    const double ratio = bound > 0 ? dist / bound : (dist > 0 ? kInf : 0.0);
    j.worst_ratio = std::max(j.worst_ratio, ratio);
    j.detail += std::string(" ") + what + " " + std::to_string(c) + (added ? " added" : " dropped") +
                fmt(": reference score %.6g, %.3g from the boundary, bound %.3g;", s[c], dist, bound);
  };
  for (int32_t m : M)
    if (!in_r.count(m)) note(m, true);
  for (int32_t k : R)
    if (!in_m.count(k)) note(k, false);
  return j;
}

double bound_use(const DecisionRows& ref, int64_t r, const std::vector<double>& got, double u) {
  double use = 0;
  const size_t n = std::min(got.size(), ref.scores[r].size());
  for (size_t c = 0; c < n; ++c) {
    const double b = u * ref.sensitivity[r][c];
    if (b > 0) use = std::max(use, std::fabs(got[c] - ref.scores[r][c]) / b);
  }
  return use;
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

void DecisionBook::add(const std::vector<DecisionRows>& records, int32_t seq, int64_t first_pos) {
  for (const DecisionRows& rec : records) {
    store_.push_back(std::make_unique<DecisionRows>(rec));
    const DecisionRows* p = store_.back().get();
    for (int64_t r = 0; r < p->rows; ++r)
      index_[{static_cast<int>(p->site), p->layer, seq, first_pos + r}] = Entry{p, r};
  }
}

DecisionBook::Entry DecisionBook::find(DecisionSite site, int64_t layer, int32_t seq, int64_t pos) const {
  auto it = index_.find({static_cast<int>(site), layer, seq, pos});
  return it == index_.end() ? Entry{} : it->second;
}

void PositionalForcer::set_rows(std::vector<std::pair<int32_t, int64_t>> rows, int path) {
  rows_ = std::move(rows);
  path_ = path;
}

void PositionalForcer::on_decision(DecisionRows& d) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto fail = [&](const std::string& why) {
    if (status_.is_ok()) status_ = internal_error("decision forcing: " + why);
  };
  if (d.rows != static_cast<int64_t>(rows_.size()))
    return fail(std::string(decision_site_name(d.site)) + " at layer " + std::to_string(d.layer) + " over " +
                std::to_string(d.rows) + " rows where the caller declared " + std::to_string(rows_.size()));
  for (int64_t r = 0; r < d.rows; ++r) {
    const auto [seq, pos] = rows_[r];
    ObservedDecision o;
    o.site = d.site;
    o.layer = d.layer;
    o.seq = seq;
    o.pos = pos;
    o.path = path_;
    o.ids.assign(d.row(r), d.row(r) + d.width);
    if (r < static_cast<int64_t>(d.scores.size())) o.scores = d.scores[r];
    observed.push_back(std::move(o));
    const DecisionBook::Entry e = book_.find(d.site, d.layer, seq, pos);
    if (e.rows == nullptr || e.rows->width != d.width) {
      fail(std::string("no reference ") + decision_site_name(d.site) + " decision at layer " +
           std::to_string(d.layer) + " for sequence " + std::to_string(seq) + " position " + std::to_string(pos));
      continue;
    }
    std::copy(e.rows->row(e.row), e.rows->row(e.row) + d.width, d.ids.begin() + r * d.width);
  }
  d.forced = true;
}

}  // namespace mxserve::model
