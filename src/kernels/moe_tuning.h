// MoE kernel tuning tables (issue 9; docs/cuda.md "MXFP4 MoE: tuned tables and selection"). CPU code,
// always compiled.
//
// Owns: the table format (JSON "mxserve-moe-tuning/1", written by `mxserve tune-moe`), the tables embedded
// into the binary at build time (configs/moe/*.json) plus those added by --moe-tuning-dir, and the bucket
// rule. Does not own: the per-shape plans built from the tables at load (kernels/moe_plan.h), the kernel
// variants (kernels/cuda/moe_mxfp4 names them) nor the heuristic (the kernels' moe_mxfp4_heuristic_plan).
//
// Key invariant: a bucket of one regime is never used for a token count M of another regime
// (decode M <= 64, between 65..1023, prefill M >= 1024); with no usable bucket the heuristic runs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace mxserve::kernels {

inline constexpr const char* kMoeTuningFormat = "mxserve-moe-tuning/1";

// What a table is keyed by. gpu is the CUDA device name (cudaDeviceProp::name, e.g. "NVIDIA H200").
struct MoeTuningKey {
  std::string gpu;
  int64_t experts = 0, hidden = 0, inter = 0, top_k = 0;
  std::string dtype = "mxfp4";

  // "E128_H4096_I1408_K8_mxfp4" (no GPU: the /metrics label and the log name).
  std::string shape_label() const;
  // "NVIDIA H200 E128_H4096_I1408_K8_mxfp4"
  std::string describe() const;
  // The command that writes this shape's table:
  // "mxserve tune-moe --experts 128 --hidden 4096 --inter 1408 --top-k 8 --dtype mxfp4 --out configs/moe/<name>.json"
  std::string tune_command() const;
  // "nvidia_h200_E128_H4096_I1408_K8_mxfp4.json"
  std::string file_name() const;
  bool operator==(const MoeTuningKey& o) const = default;
  bool operator<(const MoeTuningKey& o) const;
};

// What a table may hold (a load-time plan indexes every token count up to its largest bucket).
inline constexpr int64_t kMoeMaxBucketM = int64_t{1} << 20;
inline constexpr int kMoeMaxBuckets = 1024;

struct MoeTuningEntry {
  int64_t m = 0;          // token-count bucket (n_tokens of the moe_experts call), 1..kMoeMaxBucketM
  std::string gate_up;    // variant name of the gate|up grouped GEMM
  std::string down;       // variant name of the down grouped GEMM
  double us = 0;          // measured time of the pair at m, microseconds (informative)
};

struct MoeTuningTable {
  MoeTuningKey key;
  std::string command;                 // how the tuner was run (informative)
  std::vector<MoeTuningEntry> entries;  // sorted by m, m unique, at most kMoeMaxBuckets
  std::string source;                  // file path, or "embedded:<name>.json"
};

// Parses one table. Every error names `source` and the field (entries[i].gate_up, ...), with the value.
Result<MoeTuningTable> parse_moe_tuning_table(const std::string& text, const std::string& source);
Result<MoeTuningTable> read_moe_tuning_file(const std::string& path);

// ---- the bucket rule ----
inline constexpr int64_t kMoeDecodeMaxM = 64;     // decode regime: 1 <= M <= 64
inline constexpr int64_t kMoePrefillMinM = 1024;  // prefill regime: M >= 1024; between: 65..1023
enum class MoeRegime { kDecode, kBetween, kPrefill };
MoeRegime moe_regime(int64_t m);
const char* moe_regime_name(MoeRegime r);
// Index into t.entries of the bucket used for M, or -1 (use the heuristic). Candidates are the entries of
// M's own regime; among them the nearest on a log scale (|ln m - ln M|), ties to the smaller m.
int select_moe_bucket(const MoeTuningTable& t, int64_t m);

// ---- table sets ----
// A table file text compiled into the binary (CMake generates the array from configs/moe/*.json).
struct EmbeddedMoeTable {
  const char* name;  // file name, e.g. "nvidia_h200_E128_H4096_I1408_K8_mxfp4.json"
  const char* text;
  size_t size;
};
const std::vector<EmbeddedMoeTable>& embedded_moe_tables();

class MoeTuningSet {
 public:
  // Adds tables; a key already present from an earlier add_* call is overridden (logged), a key given twice
  // within one call is an error naming both sources.
  Status add_tables(std::vector<MoeTuningTable> tables);
  Status add_embedded(const std::vector<EmbeddedMoeTable>& files);
  // Every *.json directly in dir. Errors name the file (and the field).
  Status add_dir(const std::string& dir);
  const MoeTuningTable* find(const MoeTuningKey& key) const;
  std::vector<const MoeTuningTable*> all() const;
  size_t size() const { return tables_.size(); }

 private:
  std::map<MoeTuningKey, MoeTuningTable> tables_;
};

// The process-wide set the CUDA backend selects from: the embedded tables (loaded on first use; a malformed
// embedded table aborts naming it -- CI catches it) plus every --moe-tuning-dir. Thread-safe.
MoeTuningSet& global_moe_tuning();
std::mutex& global_moe_tuning_mutex();
Status add_global_moe_tuning_dir(const std::string& dir);  // --moe-tuning-dir

// Every variant name of the tables in `set` must exist (index(gemm, name) >= 0; gemm 0 = gate_up, 1 = down);
// errors name the table file and the name, and say "retired" where index returns -2 (a retired variant:
// kMoeMxfp4RetiredVariant in kernels/cuda/moe_mxfp4/moe_mxfp4_variants.h).
Status validate_moe_tuning(const MoeTuningSet& set, const std::function<int(int, const std::string&)>& index);

// One row of the chosen configuration (the start-up log and the mxserve:moe_kernel_config gauge; built by
// the per-shape plans of kernels/moe_plan.h).
struct MoeKernelConfigRow {
  std::string shape;    // "E128_H4096_I1408_K8_mxfp4"
  std::string bucket;   // "16"; "decode" / "between" / "prefill" for a regime the table has no bucket in;
                        // "any" when the whole shape runs the heuristic (no table, or a table without entries)
  std::string gate_up;  // variant name, or "heuristic"
  std::string down;
  std::string source;   // "table" | "heuristic"
};

}  // namespace mxserve::kernels
