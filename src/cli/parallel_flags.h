// The parallel-layout flags shared by `mxserve serve`, `generate` and `verify-fixture` (sglang / vLLM
// spelling). Parsing only checks the values; launch_model() decides what runs (tp > 1 on the CPU backend
// today; ep, dp and DP attention are refused there with "not implemented yet", never ignored).
#pragma once

#include <set>
#include <string>

#include "cli/args.h"
#include "parallel/rank_layout.h"

namespace mxserve::cli {

// --tensor-parallel-size/--tp-size N, --data-parallel-size/--dp-size N, --ep-size N
// --nnodes N --node-rank R --dist-init-addr host:port (sglang): parsed and validated; nnodes > 1 is refused
// until the follower nodes' step loop exists (the rendezvous is parallel/rendezvous.h).
inline const std::set<std::string> kParallelValueFlags = {"--tensor-parallel-size", "--tp-size",
                                                          "--data-parallel-size", "--dp-size", "--ep-size",
                                                          "--nnodes", "--node-rank", "--dist-init-addr"};
// --enable-expert-parallel: ep = tp x dp (vLLM); --enable-dp-attention: attention data-parallel (sglang)
inline const std::set<std::string> kParallelBoolFlags = {"--enable-expert-parallel", "--enable-dp-attention"};

inline const char* kParallelUsage =
    "  --tensor-parallel-size, --tp-size N   ranks the model is split over (one thread each; cuda: one GPU each)\n"
    "  --data-parallel-size, --dp-size N     data-parallel replicas (not implemented yet)\n"
    "  --enable-expert-parallel, --ep-size N experts partitioned over ranks (not implemented yet)\n"
    "  --enable-dp-attention                 attention data-parallel with experts spread (not implemented yet)\n"
    "  --nnodes N --node-rank R --dist-init-addr HOST:PORT  several nodes (not implemented yet; docs/parallel.md)\n";

Result<parallel::ParallelConfig> parse_parallel_flags(const Args& args);

}  // namespace mxserve::cli
