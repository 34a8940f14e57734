// Decode attention split tables (issue 17 item 5; docs/perf/decode-path.md "Tuning the decode attention
// splits"). CPU code, always compiled.
//
// Owns: the table format (JSON "mxserve-attention-tuning/1", written by `mxserve tune-attention`), the
// tables embedded into the binary at build time (configs/attention/*.json), the file names and the tune
// command of a key. Does not own: the lookup (kernels/attention_split_table.h, header-only for the CUDA
// planner) nor the heuristic (kernels/cuda/attention/paged_attention.cu).
//
// Key invariant: a table with status "untuned" is never used for planning (it documents a grid only);
// a tuned one covers a full (rows x contexts) grid with a split count >= 1 in every cell.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/attention_split_table.h"

namespace mxserve::kernels {

inline constexpr const char* kAttentionTuningFormat = "mxserve-attention-tuning/1";
inline constexpr int64_t kAttentionMaxSplits = 1024;

// "nvidia_h200_Q96_KV8_D128_bf16.json"
std::string attention_tuning_file_name(const AttentionTuningKey& key);
// "mxserve tune-attention --heads 96 --kv-heads 8 --head-dim 128 --kv-cache-dtype bf16 --out configs/attention/<name>"
std::string attention_tune_command(const AttentionTuningKey& key);
// "'NVIDIA H200' Q96_KV8_D128_bf16"
std::string describe(const AttentionTuningKey& key);

// Parses one table; every error names `source` and the field, with the value found.
Result<AttentionSplitTable> parse_attention_tuning_table(const std::string& text, const std::string& source);
Result<AttentionSplitTable> read_attention_tuning_file(const std::string& path);
// The JSON text of a table (parse_attention_tuning_table reads it back unchanged, source aside).
std::string attention_tuning_json(const AttentionSplitTable& t);

// A table file compiled into the binary (CMake generates the array from configs/attention/*.json).
struct EmbeddedAttentionTable {
  const char* name;
  const char* text;
  size_t size;
};
const std::vector<EmbeddedAttentionTable>& embedded_attention_tables();

// Tables parsed from `files`; errors name the file. Two tables for one key: an error naming both.
Result<std::vector<AttentionSplitTable>> parse_embedded_attention_tables(const std::vector<EmbeddedAttentionTable>& files);
// The process-wide tables (the embedded ones, parsed on first use; a malformed one aborts naming it -- the
// CPU test parses every embedded table, so CI catches it). Null when none matches the key.
const AttentionSplitTable* find_attention_split_table(const AttentionTuningKey& key);

}  // namespace mxserve::kernels
