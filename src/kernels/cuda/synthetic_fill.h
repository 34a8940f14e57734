// Launcher of the synthetic-weight kernel (kernels/synthetic_fill.h holds the value rule, shared with
// the CPU backend, so the bits match). dst is a device pointer; no synchronization.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/synthetic_fill.h"

namespace mxserve::kernels::cuda {

// kNormal / kMxfp4Dequant: dst f32 (dst_bf16 false) or bf16 [rows, cols]; kMxfp4: dst u8 [rows, cols/2] +
// scales u8 [rows, cols/32].
void synthetic_fill(const SyntheticFill& p, void* dst, bool dst_bf16, uint8_t* scales, cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
