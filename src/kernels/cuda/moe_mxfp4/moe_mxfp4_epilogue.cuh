// The epilogues the tensor-core MoE expert GEMMs share: one m16n8 accumulator tile of the "swapped" fragments
// (weights = operand A, tokens = operand B; MXFP4 designs 2-5) into the expert's output rows, and the wgmma
// accumulator of the wg_* grouped GEMMs (tokens = A, weights = B: moe_mxfp4_wg.cu, moe_bf16_wg.cu,
// moe_bf16_wg_ws.cu) into its rows.
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

// This thread's part of a wgmma m64 x kBN accumulator (kBN / 2 floats: token rows row_lo + 8 h, h = 0, 1, with
// row_lo = 64 warpgroup + 16 warp + g; accumulator column 8 j + 2 t (+1)) into rows row0 + row (row < rows) of
// c [*, N]. gate_up (kSwiglu): column groups alternate 8 gate / 8 up rows of the same features -> silu(gate) * up
// at feature fbase + 8 jp + 2 t (+1); down: feature fbase + 8 j + 2 t (+1). Features >= N are not stored.
template <int kBN, bool kSwiglu>
__device__ __forceinline__ void wg_store_acc(const float* acc, bf16* c, int row0, int row_lo, int rows, int N,
                                             int fbase, int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row_lo + 8 * h;
    if (row >= rows) continue;
    bf16* crow = c + static_cast<int64_t>(row0 + row) * N;
    if constexpr (kSwiglu) {
#pragma unroll
      for (int jp = 0; jp < kBN / 16; ++jp) {
        const int feat = fbase + jp * 8 + 2 * t;
        if (feat >= N) continue;
        const float g0 = acc[4 * (2 * jp) + 2 * h], g1 = acc[4 * (2 * jp) + 2 * h + 1];
        const float u0 = acc[4 * (2 * jp + 1) + 2 * h], u1 = acc[4 * (2 * jp + 1) + 2 * h + 1];
        *reinterpret_cast<__nv_bfloat162*>(crow + feat) =
            __floats2bfloat162_rn(g0 / (1.0f + expf(-g0)) * u0, g1 / (1.0f + expf(-g1)) * u1);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        const int feat = fbase + j * 8 + 2 * t;
        if (feat >= N) continue;
        *reinterpret_cast<__nv_bfloat162*>(crow + feat) =
            __floats2bfloat162_rn(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      }
    }
  }
}

}  // namespace mxserve::kernels::cuda
