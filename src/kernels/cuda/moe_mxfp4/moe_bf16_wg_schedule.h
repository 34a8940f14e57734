// The tile schedule of the prefill dequant path's bf16 grouped GEMM (moe_bf16_wg.cu), host + device so a CPU
// test checks it: flat tile index -> (expert, weight tile, row tile). Expert e owns tiles
// [off[e] * NT, off[e + 1] * NT) (off = the permute's per-expert offsets in 128-row tiles, NT weight tiles per
// GEMM); inside, the row tiles are innermost, so consecutive blocks share a weight tile and an expert's blocks
// run together. Tiles past off[E] * NT are invalid (the grid is an upper bound).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxserve::kernels::cuda {

struct MoeBf16WgTile {
  bool valid = false;
  int expert = 0;
  int wtile = 0;  // weight tile: BN (down) or BN / 2 (gate_up features) wide
  int mtile = 0;  // row tile of the expert's segment: rows [128 mtile, 128 mtile + 128)
};

__host__ __device__ inline MoeBf16WgTile moe_bf16_wg_tile(int64_t tile, const int32_t* off, int n_experts,
                                                          int n_wtiles) {
  MoeBf16WgTile r;
  if (tile < 0 || tile >= static_cast<int64_t>(off[n_experts]) * n_wtiles) return r;
  int lo = 0, hi = n_experts - 1;  // the largest e with off[e] * NT <= tile (then off[e + 1] * NT > tile)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (static_cast<int64_t>(off[mid]) * n_wtiles <= tile) lo = mid;
    else hi = mid - 1;
  }
  const int mt = off[lo + 1] - off[lo];
  const int local = static_cast<int>(tile - static_cast<int64_t>(off[lo]) * n_wtiles);
  r.valid = true;
  r.expert = lo;
  r.wtile = local / mt;
  r.mtile = local % mt;
  return r;
}

}  // namespace mxserve::kernels::cuda
