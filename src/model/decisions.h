// Discrete decisions of a forward pass -- which experts the MoE router picks, which keys the DSA indexer keeps --
// made observable and forceable, so a bf16 backend can be checked against the fp32 reference decision by
// decision (cli/fixture_decisions.h). A DecisionHook is installed for the duration of a forward by
// ScopedDecisionHook (thread-local: it reaches every decision site of the forwards run on this thread, through
// any runner or engine, without widening their interfaces). The sites (model/layers/decision_sites.h) consult
// active_decision_hook() once per layer: with no hook installed that is one pointer test and nothing else.
// Invariant: a hook sees every decision of a forward in execution order (layer by layer), so two runs of the
// same batches on two models produce DecisionRows that pair up one to one.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace mxserve::model {

enum class DecisionSite { kExpertRouting, kIndexTopk };
const char* decision_site_name(DecisionSite s);  // "routing", "index top-k"

// One site's decisions for the rows of one forward.
struct DecisionRows {
  DecisionSite site = DecisionSite::kExpertRouting;
  int64_t layer = -1;  // decoder layer index (the MTP layer is num_hidden_layers)
  int64_t rows = 0;    // batch rows
  int64_t width = 0;   // ids per row: top_k experts / index_topk keys
  std::vector<int32_t> ids;  // [rows, width]: each row ascending, -1 padding last (fewer candidates than width)
  // [rows] the row's decision margin under this forward's own scores: the lowest kept score minus the highest
  // dropped one (routing: min with the group-selection margin); +inf when nothing was dropped.
  std::vector<double> margin;
  // [rows] the candidates that margin is between: {lowest kept, highest dropped}; {-1, -1} when nothing was
  // dropped or when the binding margin is routing's group selection.
  std::vector<std::pair<int32_t, int32_t>> margin_pair;
  // [rows] the size of a score error per unit of relative error in the scores' inputs, modelled as uncorrelated
  // noise: 4 standard deviations, the larger of margin_pair's two candidates (every expert when routing groups
  // decide); 0 when nothing was dropped. A score that sums products p_i has noise sqrt(sum p_i^2) per unit
  // relative error: routing s(1 - s) (the sigmoid's slope at the logit, linearized) x sqrt(sum_i (x_i g_ei)^2); index
  // sqrt(3 sum_h w_h^2 sum_d (q_hd k_d)^2) x scales over the heads the ReLU passes (q, k and w all noisy).
  std::vector<double> scale;
  bool forced = false;  // set by a hook that replaced ids; the site then runs with them

  const int32_t* row(int64_t r) const { return ids.data() + r * width; }
  bool same_row(const DecisionRows& o, int64_t r) const;  // the same id set in row r
  std::string describe_row(int64_t r) const;              // "{1, 5}"
};

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
  void on_decision(DecisionRows& d) override { records.push_back(d); }
  std::vector<DecisionRows> records;
};

// Replays recorded decisions in call order (forcing each site to the recorded ids) and keeps what each site
// chose on its own before being forced (`observed`). A call that does not pair with the next record (other
// site, layer or row count) is forced with nothing and reported by status().
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

}  // namespace mxserve::model
