// Discrete decisions of a forward pass -- which experts the MoE router picks, which keys the DSA indexer keeps --
// made observable and forceable, so a bf16 backend can be checked against the fp32 reference decision by
// decision (cli/fixture_decisions.h). A DecisionHook is installed for the duration of a forward by
// ScopedDecisionHook (thread-local: it reaches every decision site of the forwards run on this thread, through
// any runner or engine, without widening their interfaces). The sites (model/layers/decision_sites.h) consult
// active_decision_hook() once per layer: with no hook installed that is one pointer test and nothing else.
// Invariant: a hook sees every decision of a forward in execution order (layer by layer), one call per site
// covering every row of the forward's batch.
//
// Judging a disagreement (judge_row): the format bound. A score s_j that sums products p_i of inputs rounded to
// the backend's activation format (relative error <= u each, u = 2^-8 for bf16) is off by at most
// u x sum_i |p_i| (first order): DecisionRows::sensitivity holds that sum (times the number of rounded factors
// per product), so the bound of candidate j is u x sensitivity_j. A set M the model chose instead of the
// reference's R is explainable by rounding exactly when some perturbation within the bounds makes M the
// selection: min over M of (s + b) >= max over the visible candidates outside M of (s - b) -- and, for routing's
// group-limited selection, the groups M uses can be among the top topk_group groups under the same test on the
// group scores. Never derived from a backend's measured error.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/status.h"

namespace mxserve::model {

enum class DecisionSite { kExpertRouting, kIndexTopk };
const char* decision_site_name(DecisionSite s);  // "routing", "index top-k"

// The unit roundoff of the bf16 activation format (8 significant bits).
constexpr double kBf16UnitRoundoff = 1.0 / 256.0;

// One site's decisions for the rows of one forward.
struct DecisionRows {
  DecisionSite site = DecisionSite::kExpertRouting;
  int64_t layer = -1;  // decoder layer index (the MTP layer is num_hidden_layers)
  int64_t rows = 0;    // batch rows
  int64_t width = 0;   // ids per row: top_k experts / index_topk keys
  std::vector<int32_t> ids;  // [rows, width]: each row ascending, -1 padding last (fewer candidates than width)
  // [rows] the row's nominal decision margin under this forward's own scores: the lowest kept score minus the
  // highest dropped one (routing: min with the group-selection margin); +inf when nothing was dropped.
  std::vector<double> margin;
  // [rows] the candidates that margin is between: {lowest kept, highest dropped}; {-1, -1} when nothing was
  // dropped or when the binding margin is routing's group selection.
  std::vector<std::pair<int32_t, int32_t>> margin_pair;
  // [rows][candidates] every candidate's selection score (routing: sigmoid(logit) + correction bias, all E
  // experts; index: the indexer score of each key the row may attend, 0..n-1) and its sensitivity: the worst-case
  // score error per unit relative error of the score's rounded inputs (see the header comment).
  std::vector<std::vector<double>> scores, sensitivity;
  int64_t n_group = 1, topk_group = 1;  // routing's group-limited selection (E / n_group experts a group)
  bool forced = false;  // set by a hook that replaced ids; the site then runs with them

  const int32_t* row(int64_t r) const { return ids.data() + r * width; }
  bool same_row(const DecisionRows& o, int64_t r) const;  // the same id set in row r
  std::string describe_row(int64_t r) const;              // "{1, 5}"
};

// The verdict on a model's id set `got` (width ids, any order, -1 padding) against the reference's row r.
struct RowJudgement {
  bool same = true;          // the same set
  bool within_bound = true;  // (when not the same) explainable by rounding within the format bound
  // Of the candidates whose membership changed, the largest ratio of the distance to the reference's selection
  // boundary over the candidate's bound (<= 1 for each: every changed element within its bound).
  double worst_ratio = 0;
  std::string detail;  // each changed candidate: its reference score, margin to the boundary and bound
};
RowJudgement judge_row(const DecisionRows& ref, int64_t r, const int32_t* got, double unit_roundoff);

// max over the row's candidates of |got_score - ref_score| / (u x ref sensitivity): how much of the format
// bound the tested backend's scores use (meaningful where every upstream decision was forced equal).
double bound_use(const DecisionRows& ref, int64_t r, const std::vector<double>& got_scores, double unit_roundoff);

class DecisionHook {
 public:
  virtual ~DecisionHook() = default;
  // Called once per site per forward with the decisions just made; may replace d.ids (setting d.forced).
  virtual void on_decision(DecisionRows& d) = 0;
};

// The hook installed on this thread, or nullptr.
DecisionHook* active_decision_hook();

// Installs a hook on this thread for its lifetime (restoring the previous one after).
class ScopedDecisionHook {
 public:
  explicit ScopedDecisionHook(DecisionHook* hook);
  ~ScopedDecisionHook();
  ScopedDecisionHook(const ScopedDecisionHook&) = delete;
  ScopedDecisionHook& operator=(const ScopedDecisionHook&) = delete;

 private:
  DecisionHook* previous_;
};

// Keeps every site's decisions in call order.
class DecisionRecorder : public DecisionHook {
 public:
  void on_decision(DecisionRows& d) override {
    std::lock_guard<std::mutex> lock(mutex_);
    records.push_back(d);
  }
  std::vector<DecisionRows> records;

 private:
  std::mutex mutex_;
};

// Replays recorded decisions in call order (forcing each site to the recorded ids) and keeps what each site
// chose on its own before being forced (`observed`). A call that does not pair with the next record (other
// site, layer or row count) is forced with nothing and reported by status(). For forwards whose batches are
// identical to the recording's; DecisionBook + PositionalForcer force any batching of the same tokens.
class DecisionForcer : public DecisionHook {
 public:
  explicit DecisionForcer(const std::vector<DecisionRows>& to_force) : to_force_(to_force) {}
  void on_decision(DecisionRows& d) override;
  std::vector<DecisionRows> observed;
  Status status() const { return status_; }

 private:
  const std::vector<DecisionRows>& to_force_;
  size_t next_ = 0;
  Status status_ = Status::ok();
};

// Reference decisions by (site, layer, sequence, position): filled from recordings of teacher-forced forwards of
// one sequence each (row r of every record is position r), looked up by any later forward of the same tokens --
// one batch of several sequences, prefill chunks, single-token decode steps, an MTP pass.
class DecisionBook {
 public:
  // The records of one forward over positions first_pos, first_pos + 1, ... of sequence `seq`.
  void add(const std::vector<DecisionRows>& records, int32_t seq, int64_t first_pos = 0);
  struct Entry {
    const DecisionRows* rows = nullptr;
    int64_t row = -1;
  };
  Entry find(DecisionSite site, int64_t layer, int32_t seq, int64_t pos) const;
  bool empty() const { return index_.empty(); }

 private:
  std::vector<std::unique_ptr<DecisionRows>> store_;
  std::map<std::tuple<int, int64_t, int32_t, int64_t>, Entry> index_;
};

// One row a PositionalForcer saw: the model's own choice (before forcing) at a site, and where it was.
struct ObservedDecision {
  DecisionSite site = DecisionSite::kExpertRouting;
  int64_t layer = -1;
  int32_t seq = -1;
  int64_t pos = -1;
  int path = 0;                 // the caller's label for the forward (set_rows)
  std::vector<int32_t> ids;     // [width], ascending, -1 padding
  std::vector<double> scores;   // the model's own scores of every candidate
};

// Forces every decision of the forwards it sees to the book's, row by row, through the (sequence, position) of
// each row that the caller declares before each forward (set_rows). A site whose row count differs from the
// declared rows, or a row the book lacks, is forced with nothing and reported by status(). Thread-safe: tensor-
// parallel ranks (launch/lockstep_model) each call it for the same rows, so their observations appear once per
// rank.
class PositionalForcer : public DecisionHook {
 public:
  explicit PositionalForcer(const DecisionBook& book) : book_(book) {}
  // The rows of the next forward(s): (sequence, position) per batch row, and a label for the observations.
  void set_rows(std::vector<std::pair<int32_t, int64_t>> rows, int path);
  void on_decision(DecisionRows& d) override;
  std::vector<ObservedDecision> observed;
  Status status() const { return status_; }

 private:
  const DecisionBook& book_;
  std::vector<std::pair<int32_t, int64_t>> rows_;
  int path_ = 0;
  Status status_ = Status::ok();
  std::mutex mutex_;
};

}  // namespace mxserve::model
