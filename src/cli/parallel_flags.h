// The parallel-layout flags shared by `mxserve serve`, `generate` and `verify-fixture` (sglang / vLLM
// spelling). Parsing only checks the values; launch_model() decides what runs (tp, ep, dp and DP attention
// on the CPU backend today; several GPUs with NCCL: docs/parallel.md).
#pragma once

#include <set>
#include <string>

#include "cli/args.h"
#include "parallel/rank_layout.h"

namespace mxserve::cli {

// --tensor-parallel-size/--tp-size/-tp N, --data-parallel-size/--dp-size/-dp N (-tp / -dp: vLLM's short forms,
// mapped in cli/args.cpp), --ep-size/--expert-parallel-size N
// --nnodes N --node-rank R --dist-init-addr host:port (sglang): one process per node (launch/multinode.h);
// node 0 serves, the others (`mxserve serve --node-rank R`) run node 0's steps on their ranks. --dist-timeout S
// (sglang): bounds the start-up and each cross-node collective (default 300 s).
// --communicator nccl|shared-device|auto: the CLI spelling of MXSERVE_COMMUNICATOR, which launch_model() reads
// (launch/launch.cpp); accepted with --backend cuda only. parse_parallel_flags() sets that variable for this
// process (a flag and a different MXSERVE_COMMUNICATOR already set are an error).
inline const std::set<std::string> kParallelValueFlags = {"--tensor-parallel-size", "--tp-size",
                                                          "--data-parallel-size", "--dp-size", "--ep-size", "--expert-parallel-size",
                                                          "--nnodes", "--node-rank", "--dist-init-addr", "--dist-timeout",
                                                          "--communicator"};
// --enable-expert-parallel: ep = tp x dp (vLLM); --enable-dp-attention: attention data-parallel (sglang);
// --disable-custom-all-reduce (vLLM): the unfused all-reduce, add and RMSNorm at tp > 1 (parallel/fused_path.h),
// handed to launch_model() as MXSERVE_FUSED_ALLREDUCE=0 (as --communicator is).
inline const std::set<std::string> kParallelBoolFlags = {"--enable-expert-parallel", "--enable-dp-attention",
                                                         "--disable-custom-all-reduce"};

Result<parallel::ParallelConfig> parse_parallel_flags(const Args& args);

}  // namespace mxserve::cli
