// Internal to moe_mxfp4/ (moe_prefill_dequant.cu): the bf16 x bf16 grouped GEMM on the Hopper wgmma tile of
// design 6 (moe_bf16_wg.cu), run on the bf16 expert copies the prefill dequant path makes.
//   gate_up (swiglu): A = x [T, K] gathered through p.row_token, W = wcopy [slot, 2N, K], C = act [P, N]
//   down (plain):     A = act [P, K],                          W = wcopy [slot, N, K],  C = y [P, N]
// Expert e's weights are wcopy + e * rows * K (copies indexed by expert id). One block per (expert, BN weight
// rows, kMoeBf16WgTileM expert rows): tile_offsets are the permute's per-expert offsets in tiles of
// kMoeBf16WgTileM rows ([E + 1], device), max_tiles bounds their total (ceil(P / 128) + min(E, P)).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_internal.h"

namespace mxserve::kernels::cuda {

inline constexpr int kMoeBf16WgTileM = 128;

// bn: 128 or 256. Needs sm_90a, K % 64 == 0, 16-byte aligned A / wcopy, 4-byte aligned C (checked).
void moe_bf16_wg_gemm(bool swiglu, int bn, const Mxfp4GemmArgs& p, const bf16* wcopy, const int32_t* tile_offsets,
                      int64_t max_tiles, cudaStream_t stream);
// The warp-specialized variant (moe_bf16_wg_ws.cu): BN 256, a producer warpgroup feeding a 4-stage ring through
// mbarriers, two consumer warpgroups; same arguments and schedule.
void moe_bf16_wg_ws_gemm(bool swiglu, const Mxfp4GemmArgs& p, const bf16* wcopy, const int32_t* tile_offsets,
                         int64_t max_tiles, cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
