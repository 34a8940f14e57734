// The shared-device communicator's reduction kernel (shared_device_reduce.cu): dst[i] = srcs[0][i] op ...
// op srcs[n-1][i] in rank order, accumulated in f32 and rounded once to the element type. Up to
// kMaxSharedDeviceRanks sources (the pointers travel by value in the launch).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace mxserve::parallel {

constexpr int kMaxSharedDeviceRanks = 16;

// elem: 0 f32, 1 bf16, 2 f16; max: false sum, true max. Asynchronous on `stream`.
cudaError_t launch_rank_order_reduce(void* dst, const void* const* srcs, int n_srcs, int64_t n, int elem, bool max,
                                     cudaStream_t stream);

}  // namespace mxserve::parallel
