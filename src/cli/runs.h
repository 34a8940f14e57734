// --runs "b=1,n=0;b=1,n=3,a=2.5;b=8,n=3,a=2,adaptive=0": several engine runs of `mxserve generate` over one
// loaded model (benchmarks). Each run's spec starts from the command's spec flags; every run is validated
// against the same limits as the flags (an error names the run and the bad field).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/spec/speculative.h"

namespace mxserve::cli {

struct GenerateRun {
  int64_t batch = 1;
  runtime::SpecConfig spec;
  int64_t prompt_len = 0;  // > 0: a synthetic prompt of this length instead of the command's
  bool cuda_graphs = false;  // decode graphs (on by default on CUDA; every run of the command)
};

// Keys: b (batch), n (num_steps), a (simulated acceptance), adaptive (0/1), p (prompt length), k (topk),
// m (num_draft_tokens, tree mode). `base` gives the defaults; its simulated acceptance is not inherited.
Result<std::vector<GenerateRun>> parse_runs(const std::string& text, const runtime::SpecConfig& base);

}  // namespace mxserve::cli
