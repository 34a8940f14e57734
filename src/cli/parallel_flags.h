// The parallel-layout flags shared by `mxserve serve`, `generate` and `verify-fixture` (sglang / vLLM
// spelling). Parsing only checks the values; launch_model() decides what runs (tp, ep, dp and DP attention
// on the CPU backend today; several GPUs with NCCL: docs/parallel.md).
#pragma once

#include <set>
#include <string>

#include "cli/args.h"
#include "parallel/rank_layout.h"

namespace mxserve::cli {

// --tensor-parallel-size/--tp-size N, --data-parallel-size/--dp-size N, --ep-size N
// --nnodes N --node-rank R --dist-init-addr host:port (sglang): parsed and validated; nnodes > 1 is refused
// until the follower nodes' step loop exists (the rendezvous is parallel/rendezvous.h).
// --communicator nccl|shared-device|auto: the CLI spelling of MXSERVE_COMMUNICATOR, which launch_model() reads
// (launch/launch.cpp); accepted with --backend cuda only. parse_parallel_flags() sets that variable for this
// process (a flag and a different MXSERVE_COMMUNICATOR already set are an error).
inline const std::set<std::string> kParallelValueFlags = {"--tensor-parallel-size", "--tp-size",
                                                          "--data-parallel-size", "--dp-size", "--ep-size",
                                                          "--nnodes", "--node-rank", "--dist-init-addr",
                                                          "--communicator"};
// --enable-expert-parallel: ep = tp x dp (vLLM); --enable-dp-attention: attention data-parallel (sglang)
inline const std::set<std::string> kParallelBoolFlags = {"--enable-expert-parallel", "--enable-dp-attention"};

inline const char* kParallelUsage =
    "  --tensor-parallel-size, --tp-size N   ranks the model is split over (one thread each; cuda: one GPU each)\n"
    "  --data-parallel-size, --dp-size N     data-parallel ranks, requests placed by prefix hit / free KV / load\n"
    "  --enable-expert-parallel, --ep-size N routed experts partitioned whole over N ranks (N = 1, tp or tp x dp;\n"
    "                                        --enable-expert-parallel: tp x dp), instead of sliced tp ways\n"
    "  --enable-dp-attention                 attention per dp rank, MoE blocks spread over all ranks (dp > 1)\n"
    "  --communicator nccl|shared-device|auto  cuda only; shared-device: every rank on ONE GPU, collectives through\n"
    "                                        device memory (a test / benchmark stand-in, no link bandwidth)\n"
    "  --nnodes N --node-rank R --dist-init-addr HOST:PORT  several nodes (not implemented yet; docs/parallel.md)\n";

Result<parallel::ParallelConfig> parse_parallel_flags(const Args& args);

}  // namespace mxserve::cli
