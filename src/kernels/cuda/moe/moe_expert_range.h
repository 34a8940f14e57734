// Expert parallelism on CUDA: this rank's expert range [first, first + n_local) of the router's global ids.
// The routed-expert kernels (moe_experts_bf16, moe_experts_mxfp4) take local ids in [0, n_local) and the id
// kForeignExpert (-1) for a (token, slot) pair whose expert another rank holds: the pair is not permuted, not
// computed and adds nothing to the output (moe_permute.cuh). The MoE output is then this rank's partial sum,
// which the caller's all-reduce sums over the expert-parallel group (docs/parallel.md "Expert parallel").
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#if defined(__CUDACC__)
#define MX_MOE_RANGE_HD __host__ __device__
#else
#define MX_MOE_RANGE_HD
#endif

namespace mxserve::kernels::cuda {

constexpr int32_t kForeignExpert = -1;

// The local id of global router id `id`, or kForeignExpert when another rank holds it (host and device: the
// whole index rule of moe_local_expert_ids).
MX_MOE_RANGE_HD inline int32_t local_expert_id(int32_t id, int32_t first, int32_t n_local) {
  const int32_t local = id - first;
  return (local >= 0 && local < n_local) ? local : kForeignExpert;
}

// local[i] = local_expert_id(ids[i], first, n_local) for i < n (device pointers, on `stream`).
void moe_local_expert_ids(const int32_t* ids, int64_t n, int32_t first, int32_t n_local, int32_t* local,
                          cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
