// Workloads: what each request asks for (prompt text or chat messages, intended token counts).
// Owns: the random, shared-prefix, single-stream and file generators and the length fitting that
// makes a prompt count exactly the intended tokens under the run's TokenCodec.
// Invariant: prompt(i) is a pure function of (config, seed, i): a sweep point can rebuild any request.
//
// Shared-prefix hit-rate formula (documented in docs/bench.md): with input length L and target hit
// rate h, every request is  [group prefix: P = round(h*L) tokens] ++ [unique suffix: L-P tokens].
// Requests 0..G-1 prime the G groups (one each, in order; they are the warm-up requests); later
// requests pick a group uniformly at random. Once each group's prefix is resident, a prefix cache
// serves exactly P of the L tokens, so the expected hit rate is P/L = h (to 1/L). Without priming,
// over N requests the expectation is h*(1 - G/N). Servers caching in blocks of B tokens report
// floor(P/B)*B, i.e. at most B/L lower. Keep G*P inside the server's KV pool or LRU eviction lowers it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/corpus.h"
#include "bench/token_codec.h"
#include "core/status.h"

namespace mxserve::bench {

// kTrace (multi-turn sessions, trace_workload.h) is not a per-request Workload: make_workload refuses it.
enum class WorkloadKind { kRandom, kSharedPrefix, kSingleStream, kFile, kTrace };

Result<WorkloadKind> parse_workload_kind(const std::string& name);
const char* workload_kind_name(WorkloadKind kind);

struct WorkloadConfig {
  WorkloadKind kind = WorkloadKind::kRandom;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0.0;      // random: lengths uniform in [floor(L(1-r)), ceil(L(1+r))] (vLLM's meaning)
  double cache_hit_rate = 0.6;   // shared-prefix target h
  int num_groups = 16;           // shared-prefix G
  std::string file;              // file: JSONL path
  uint64_t seed = 0;
};

struct Prompt {
  std::string text;                   // raw prompt, or the single user message for chat
  nlohmann::json messages;            // file workload with "messages": sent as is (chat only)
  int64_t input_tokens = -1;          // codec count of `text`; -1 when unknown (chat messages)
  int64_t output_len = 0;             // max_tokens to request
  int group = -1;                     // shared-prefix group, -1 otherwise
  int64_t prefix_tokens = 0;          // shared-prefix tokens at the start of `text`
};

class Workload {
 public:
  virtual ~Workload() = default;
  // Request i of sweep point `stream` (streams give disjoint unique suffixes/prompts).
  virtual Result<Prompt> prompt(uint64_t stream, uint64_t i) const = 0;
  // Requests that should be warm-up by default (shared-prefix: G priming requests).
  virtual int64_t default_warmup() const = 0;
  virtual nlohmann::json describe() const = 0;
};

// codec/corpus may be null for the file workload (input_tokens then stay -1).
Result<std::unique_ptr<Workload>> make_workload(const WorkloadConfig& config, const TokenCodec* codec,
                                                const TokenCorpus* corpus);

// prefix ++ corpus[offset, offset+m) with m adjusted so that encode(decode(.)) has `target` tokens
// (re-encoding can merge tokens at slice edges). Returns the text and its exact token count.
struct FittedText {
  std::string text;
  int64_t tokens = 0;
};
Result<FittedText> fit_prompt(const TokenCodec& codec, const TokenCorpus& corpus, const std::vector<int32_t>& prefix,
                              uint64_t offset, int64_t target);

}  // namespace mxserve::bench
