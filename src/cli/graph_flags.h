// The CUDA-graph flags shared by `mxserve generate` and `mxserve serve`: --cuda-graph turns decode graphs on
// (off by default until the GPU suite has judged them); --disable-cuda-graph (sglang) and --enforce-eager
// (vLLM) keep every step eager. Asking for both is an error naming the flags.
#pragma once

#include <set>
#include <string>

#include "cli/args.h"
#include "core/status.h"

namespace mxserve::cli {

inline const std::set<std::string> kGraphBoolFlags = {"--cuda-graph", "--disable-cuda-graph", "--enforce-eager"};

inline Result<bool> parse_cuda_graph_flags(const Args& args) {
  const bool off = args.has("--disable-cuda-graph") || args.has("--enforce-eager");
  if (off && args.has("--cuda-graph"))
    return invalid_argument("--cuda-graph contradicts --disable-cuda-graph / --enforce-eager: give one");
  return args.has("--cuda-graph");
}

}  // namespace mxserve::cli
