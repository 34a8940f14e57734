// The CUDA-graph flags shared by `mxserve generate` and `mxserve serve`. Decode graphs are ON by default on the
// CUDA backend (the GPU suite's test_cuda_graphs judges them: identical greedy tokens on and off); other
// backends have none and stay quiet unless --cuda-graph asks (then the engine says why they are off).
// --disable-cuda-graph (sglang) and --enforce-eager (vLLM) keep every step eager. Asking for both is an error.
#pragma once

#include <set>
#include <string>

#include "cli/args.h"
#include "core/status.h"

namespace mxserve::cli {

inline const std::set<std::string> kGraphBoolFlags = {"--cuda-graph", "--disable-cuda-graph", "--enforce-eager"};

inline Result<bool> parse_cuda_graph_flags(const Args& args, const std::string& backend) {
  const bool off = args.has("--disable-cuda-graph") || args.has("--enforce-eager");
  if (off && args.has("--cuda-graph"))
    return invalid_argument("--cuda-graph contradicts --disable-cuda-graph / --enforce-eager: give one");
  if (args.has("--cuda-graph")) return true;
  return !off && backend == "cuda";
}

}  // namespace mxserve::cli
