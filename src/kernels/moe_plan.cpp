#include "kernels/moe_plan.h"

#include <algorithm>
#include <sstream>

#include "core/check.h"
#include "core/logging.h"

namespace mxserve::kernels {
namespace {

constexpr MoeRegime kRegimes[] = {MoeRegime::kDecode, MoeRegime::kBetween, MoeRegime::kPrefill};

// Whether bucket a is strictly nearer to m than bucket b on a log scale (|ln a - ln m| < |ln b - ln m|),
// compared exactly as ratios max/min (the rule of select_moe_bucket).
bool strictly_nearer(int64_t a, int64_t b, int64_t m) {
  const __int128 an = std::max(a, m), ad = std::min(a, m), bn = std::max(b, m), bd = std::min(b, m);
  return an * bd < bn * ad;
}

}  // namespace

MoeKernelPlan::MoeKernelPlan(const MoeTuningKey& key, const MoeTuningTable* table, const MoeVariantCatalog& catalog,
                             const MoeLogSink* warn)
    : key_(key), has_table_(table != nullptr), warn_(warn) {
  if (table) table_ = *table;
  const auto& entries = table_.entries;
  MX_CHECK_MSG(entries.size() <= static_cast<size_t>(kMoeMaxBuckets),
               table_.source << ": " << entries.size() << " buckets (at most " << kMoeMaxBuckets << ")");
  for (size_t i = 0; i < entries.size(); ++i) {
    const MoeTuningEntry& e = entries[i];
    Slot s;
    s.kind = SlotKind::kBucket;
    s.bucket = static_cast<int>(i);
    s.gate_up = catalog.index(0, e.gate_up);
    s.down = catalog.index(1, e.down);
    // validate_moe_tuning ran at backend creation; a name unknown here is a bug, not input.
    MX_CHECK_MSG(s.gate_up >= 0 && s.down >= 0,
                 table_.source << ": unknown variant '" << e.gate_up << "' or '" << e.down << "' at m " << e.m);
    s.max_tokens = std::min(catalog.max_tokens(0, s.gate_up, key), catalog.max_tokens(1, s.down, key));
    slots_.push_back(s);
  }
  uint16_t no_bucket_slot[3];
  for (MoeRegime r : kRegimes) {
    Slot s;
    s.kind = SlotKind::kNoRegimeBucket;
    s.regime = r;
    no_bucket_slot[static_cast<int>(r)] = static_cast<uint16_t>(slots_.size());
    slots_.push_back(s);
  }
  const auto quiet = static_cast<uint16_t>(slots_.size());
  slots_.push_back(Slot{});
  unsupported_warned_ = std::vector<std::atomic<bool>>(entries.size());

  if (!has_table_) {  // every M -> slot_of_m_[0]
    slot_of_m_.assign(1, quiet);
    return;
  }
  // Dense over 0..dense_max_: past the largest bucket (and past the start of the prefill regime) every M
  // picks what dense_max_ picks.
  dense_max_ = kMoePrefillMinM;
  for (const MoeTuningEntry& e : entries) dense_max_ = std::max(dense_max_, e.m);
  slot_of_m_.assign(static_cast<size_t>(dense_max_) + 1, quiet);
  // Per regime, walk M upwards with the index of the nearest bucket of that regime: it only moves up (the
  // next bucket becomes strictly nearer past the geometric mean of the two), a tie keeps the smaller one.
  const std::pair<int64_t, int64_t> ranges[] = {
      {1, kMoeDecodeMaxM}, {kMoeDecodeMaxM + 1, kMoePrefillMinM - 1}, {kMoePrefillMinM, dense_max_}};
  for (MoeRegime r : kRegimes) {
    std::vector<int> own;  // indices of r's buckets, ascending m (entries are sorted)
    for (size_t i = 0; i < entries.size(); ++i)
      if (moe_regime(entries[i].m) == r) own.push_back(static_cast<int>(i));
    const auto [lo, hi] = ranges[static_cast<int>(r)];
    size_t j = 0;
    for (int64_t m = lo; m <= hi; ++m) {
      if (own.empty()) {
        slot_of_m_[m] = no_bucket_slot[static_cast<int>(r)];
        continue;
      }
      while (j + 1 < own.size() && strictly_nearer(entries[own[j + 1]].m, entries[own[j]].m, m)) ++j;
      slot_of_m_[m] = static_cast<uint16_t>(own[j]);
    }
  }
}

void MoeKernelPlan::warn_unsupported(const Slot& s, int64_t m) const {
  if (unsupported_warned_[s.bucket].exchange(true)) return;
  const MoeTuningEntry& e = table_.entries[s.bucket];
  (*warn_)("MoE kernels: " + table_.source + " bucket m " + std::to_string(e.m) + " names " + e.gate_up + "+" +
           e.down + ", which does not support " + key_.describe() + " at " + std::to_string(m) +
           " tokens: running the heuristic for it instead. Re-tune: `" + key_.tune_command() + "`");
}

void MoeKernelPlan::warn_no_regime_bucket(const Slot& s, int64_t m) const {
  if (regime_warned_[static_cast<int>(s.regime)].exchange(true)) return;
  const char* reg = moe_regime_name(s.regime);
  (*warn_)("MoE kernels: " + table_.source + " has no " + reg + " bucket for " + key_.describe() + ": " +
           std::to_string(m) + " tokens (and every other " + reg +
           "-size call) run the untuned heuristic; buckets are never borrowed across regimes. Re-tune with more "
           "token counts: `" + key_.tune_command() + "`");
}

std::string MoeKernelPlan::describe() const {
  std::ostringstream os;
  os << "MoE kernels for " << key_.describe() << " from " << table_.source << ":";
  if (table_.entries.empty()) os << " (no entries: heuristic for every token count)";
  for (const auto& e : table_.entries) os << " m" << e.m << "=" << e.gate_up << "+" << e.down;
  bool has_regime[3] = {false, false, false};
  for (const auto& e : table_.entries) has_regime[static_cast<int>(moe_regime(e.m))] = true;
  for (MoeRegime reg : kRegimes)
    if (!has_regime[static_cast<int>(reg)] && !table_.entries.empty())
      os << " " << moe_regime_name(reg) << "=heuristic(no bucket)";
  os << " (regimes: decode M <= " << kMoeDecodeMaxM << ", between, prefill M >= " << kMoePrefillMinM
     << "; a bucket is used only within its regime)";
  return os.str();
}

void MoeKernelPlan::append_rows(std::vector<MoeKernelConfigRow>* out) const {
  const std::string shape = key_.shape_label();
  if (!has_table_ || table_.entries.empty()) {
    out->push_back({shape, "any", "heuristic", "heuristic", "heuristic"});
    return;
  }
  bool has_regime[3] = {false, false, false};
  for (const auto& e : table_.entries) has_regime[static_cast<int>(moe_regime(e.m))] = true;
  for (size_t i = 0; i < table_.entries.size(); ++i) {
    const auto& e = table_.entries[i];
    if (unsupported_warned_[i].load())
      out->push_back({shape, std::to_string(e.m), "heuristic", "heuristic", "heuristic"});
    else
      out->push_back({shape, std::to_string(e.m), e.gate_up, e.down, "table"});
  }
  for (MoeRegime reg : kRegimes)
    if (!has_regime[static_cast<int>(reg)]) out->push_back({shape, moe_regime_name(reg), "heuristic", "heuristic", "heuristic"});
}

MoeKernelPlanner::MoeKernelPlanner(const MoeTuningSet* tables, std::mutex* tables_mutex, MoeVariantCatalog catalog,
                                   MoeLogSink info, MoeLogSink warn)
    : tables_(tables), tables_mutex_(tables_mutex), catalog_(std::move(catalog)), info_(std::move(info)),
      warn_(std::move(warn)) {
  if (!info_) info_ = [](const std::string& s) { MX_LOG(kInfo) << s; };
  if (!warn_) warn_ = [](const std::string& s) { MX_LOG(kWarn) << s; };
}

const MoeKernelPlan& MoeKernelPlanner::prepare(const MoeTuningKey& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  std::unique_ptr<MoeKernelPlan> plan;
  {
    std::unique_lock<std::mutex> tables_lock;
    if (tables_mutex_) tables_lock = std::unique_lock<std::mutex>(*tables_mutex_);
    plan = std::make_unique<MoeKernelPlan>(key, tables_ ? tables_->find(key) : nullptr, catalog_, &warn_);
  }
  if (!plan->has_table()) {
    warn_("MoE kernels: NO TUNED TABLE for " + key.describe() +
          ": every token count runs the untuned heuristic (moe_mxfp4_heuristic_plan), which may be far from the "
          "best kernel. Tune it on this GPU: `" + key.tune_command() +
          "` and rebuild, or pass the output directory with --moe-tuning-dir");
  } else {
    info_(plan->describe());
  }
  return *plans_.emplace(key, std::move(plan)).first->second;
}

std::vector<MoeKernelConfigRow> MoeKernelPlanner::rows() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<MoeKernelConfigRow> out;
  for (const auto& [key, plan] : plans_) plan->append_rows(&out);
  return out;
}

}  // namespace mxserve::kernels
