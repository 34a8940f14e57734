// The epilogue every tensor-core MXFP4 expert GEMM shares (designs 2-5): one m16n8 accumulator tile of the
// "swapped" fragments (weights = operand A, tokens = operand B) into the expert's output rows.
#pragma once

#include <cstdint>

#include "kernels/cuda/common/bf16.cuh"

namespace mxserve::kernels::cuda {

// c[0] (weight row g, token tok0 + 2t), c[1] (row g, token tok0 + 2t + 1), c[2] / c[3] (row g + 8, the same
// tokens). gate_up (kSwiglu): rows g and g + 8 are the gate and up rows of feature feat_a -> silu(gate) * up;
// down: rows g and g + 8 are features feat_a and feat_b. Token r goes to out + (row0 + r) * N; tokens >= rows
// and features >= N are not stored.
template <bool kSwiglu>
__device__ __forceinline__ void mxfp4_store_tile(const float* c, bf16* out, int64_t row0, int tok0, int rows,
                                                 int N, int feat_a, int feat_b, int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int tok = tok0 + 2 * t + h;
    if (tok >= rows) continue;
    bf16* crow = out + (row0 + tok) * N;
    if (kSwiglu) {
      const float gv = c[h], uv = c[2 + h];
      if (feat_a < N) crow[feat_a] = to_bf16(gv / (1.0f + expf(-gv)) * uv);
    } else {
      if (feat_a < N) crow[feat_a] = to_bf16(c[h]);
      if (feat_b < N) crow[feat_b] = to_bf16(c[2 + h]);
    }
  }
}

}  // namespace mxserve::kernels::cuda
