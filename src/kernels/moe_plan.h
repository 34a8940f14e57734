// MoE kernel plans (issue 15): which kernel variant pair (gate_up, down) runs one expert shape at every
// token count M, resolved ONCE, when the model loads its MoE layers, from the tuned tables (moe_tuning.h).
// A moe_experts call then picks its kernels with an array index: no string, no lock, no allocation.
// CPU code, always compiled: the kernels are seen only through MoeVariantCatalog callbacks.
//
// Owns: the plan of one shape (MoeKernelPlan: M -> table bucket -> variant pair, or the heuristic), the
// planner that builds one plan per shape and logs it (the start-up line, or ONE loud warning with the exact
// tune-moe command for an untuned shape), the one-time warnings of the call path, and the rows of the
// mxserve:moe_kernel_config gauge.
//
// Key invariant: MoeKernelPlan::choose(M) == what the bucket rule select_moe_bucket(table, M) picks, for
// every M (tests/unit/kernels/test_moe_plan.cpp checks each M against it), with the heuristic where the
// table has no bucket of M's regime or the bucket's pair cannot run M tokens.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/moe_tuning.h"

namespace mxserve::kernels {

// The kernels' side, as callbacks (so this file stays CPU-only and testable). gemm 0 = gate_up, 1 = down.
struct MoeVariantCatalog {
  std::function<int(int gemm, const std::string& name)> index;  // variant id, -1 when unknown
  // The largest token count the variant runs `shape` at (it runs every count from 1 up to it); 0: never.
  std::function<int64_t(int gemm, int variant, const MoeTuningKey& shape)> max_tokens;
};

struct MoeChoice {
  bool heuristic = true;
  int gate_up = -1, down = -1;  // variant ids when !heuristic
};

using MoeLogSink = std::function<void(const std::string&)>;

// The plan of one expert shape. Immutable after build except the one-time warning flags (atomics), so
// choose() may run on any thread without a lock.
class MoeKernelPlan {
 public:
  // table nullptr: no tuned table (the heuristic for every M, silently: the planner warned once already).
  // `warn` must outlive the plan. Every variant name of `table` must be known to the catalog (an unknown
  // one is a bug here: validate_moe_tuning rejects the table first).
  MoeKernelPlan(const MoeTuningKey& key, const MoeTuningTable* table, const MoeVariantCatalog& catalog,
                const MoeLogSink* warn);
  MoeKernelPlan(const MoeKernelPlan&) = delete;
  MoeKernelPlan& operator=(const MoeKernelPlan&) = delete;

  // The pair for a call of m tokens. A bucket whose pair cannot run m tokens -> the heuristic and one loud
  // warning per bucket; no bucket in m's regime -> the heuristic and one warning per regime; m <= 0 -> the
  // heuristic, silently.
  MoeChoice choose(int64_t m) const {
    const Slot& s = slots_[slot_of_m_[m <= 0 ? 0 : m >= dense_max_ ? dense_max_ : m]];
    if (s.kind == SlotKind::kBucket) {
      if (m <= s.max_tokens) return {false, s.gate_up, s.down};
      warn_unsupported(s, m);
    } else if (s.kind == SlotKind::kNoRegimeBucket) {
      warn_no_regime_bucket(s, m);
    }
    return {};
  }

  const MoeTuningKey& key() const { return key_; }
  bool has_table() const { return has_table_; }
  // The start-up line naming the chosen pair per bucket (has_table() only).
  std::string describe() const;
  // This shape's rows of the mxserve:moe_kernel_config gauge (a bucket that fell back shows "heuristic").
  void append_rows(std::vector<MoeKernelConfigRow>* out) const;

 private:
  enum class SlotKind : uint8_t { kBucket, kQuiet, kNoRegimeBucket };
  struct Slot {
    SlotKind kind = SlotKind::kQuiet;
    MoeRegime regime = MoeRegime::kDecode;  // kNoRegimeBucket
    int bucket = -1;                        // kBucket: index into table_.entries
    int gate_up = -1, down = -1;            // kBucket: variant ids
    int64_t max_tokens = 0;                 // kBucket: the pair runs M <= this
  };
  void warn_unsupported(const Slot& s, int64_t m) const;
  void warn_no_regime_bucket(const Slot& s, int64_t m) const;

  MoeTuningKey key_;
  bool has_table_ = false;
  MoeTuningTable table_;  // a copy: a later --moe-tuning-dir cannot change it under us
  // slot_of_m_[min(M, dense_max_)] indexes slots_ (M > dense_max_ picks what dense_max_ picks: the largest
  // bucket, or no prefill bucket). Slots: the table's buckets, then one per regime without a bucket, then
  // the quiet heuristic (M <= 0, or no table).
  int64_t dense_max_ = 0;
  std::vector<uint16_t> slot_of_m_;
  std::vector<Slot> slots_;
  const MoeLogSink* warn_ = nullptr;
  mutable std::vector<std::atomic<bool>> unsupported_warned_;  // per bucket
  mutable std::atomic<bool> regime_warned_[3] = {false, false, false};
};

// Builds and owns one plan per shape (one planner per backend). Thread-safe.
class MoeKernelPlanner {
 public:
  // info/warn default to MX_LOG(kInfo) / MX_LOG(kWarn). tables_mutex guards `tables` (may be nullptr).
  MoeKernelPlanner(const MoeTuningSet* tables, std::mutex* tables_mutex, MoeVariantCatalog catalog,
                   MoeLogSink info = {}, MoeLogSink warn = {});

  // Load time: the plan of `key`, built on the first call for the key -- logging its chosen configs per
  // bucket, or ONE loud warning naming the shape and the tune-moe command when there is no table -- and
  // the same plan after. The plan lives as long as the planner.
  const MoeKernelPlan& prepare(const MoeTuningKey& key);
  std::vector<MoeKernelConfigRow> rows() const;

 private:
  const MoeTuningSet* tables_;
  std::mutex* tables_mutex_;
  MoeVariantCatalog catalog_;
  MoeLogSink info_, warn_;
  mutable std::mutex mutex_;
  std::map<MoeTuningKey, std::unique_ptr<MoeKernelPlan>> plans_;
};

}  // namespace mxserve::kernels
