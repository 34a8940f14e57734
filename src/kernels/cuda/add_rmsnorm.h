// Fused residual add + RMSNorm on bf16 rows (the tp == 1 seam between a layer's halves; tp > 1 fuses the
// all-reduce too: parallel/fused_add_norm.h). Invariant: the result is bit for bit add_bf16 then
// rmsnorm_bf16 (the residual rounded to bf16 once, the norm computed from the rounded residual, the same
// reduction order as rmsnorm's block kernel), so graphs, eager steps and the unfused path agree.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mxserve::kernels::cuda {

// residual[r, :] = bf16(residual + x); out[r, :] = bf16(rmsnorm(residual[r, :]) * w).
// x, residual, out: bf16 [rows, cols] (out may alias x; not residual); w bf16 [cols]; cols % 8 == 0.
// One launch where cols <= add_rmsnorm_max_fused_cols(), else add_bf16 then rmsnorm_bf16 (two launches).
void add_rmsnorm_bf16(const void* x, void* residual, const void* w, void* out, int64_t rows, int64_t cols, float eps,
                      cudaStream_t stream);
int64_t add_rmsnorm_max_fused_cols();

}  // namespace mxserve::kernels::cuda
