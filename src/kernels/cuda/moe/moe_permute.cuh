// Device-side token permutation shared by the bf16 (moe_experts.cu) and MXFP4 (moe_mxfp4/) routed-expert
// paths: the workspace layout, the one-block permute kernel (histogram + scan + scatter) and the weighted
// un-permute. Owns no GEMM. Key invariant: rows of expert e are [row_offsets[e], row_offsets[e+1]) of the
// permuted order; pair (t, k) lands on row pair_row[t*K+k] and row_token[row] = t.
// Expert parallelism: an id of kForeignExpert (-1, moe_expert_range.h) is another rank's expert: the pair gets
// no row (pair_row = -1) and the un-permute skips it, so the output is this rank's partial sum.
// NOTE: kernels live in an anonymous namespace, so each including .cu gets its own copy (no ODR clash).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace mxserve::kernels::cuda {
namespace {

// Permuted-row bookkeeping + the two intermediates, carved from one caller-owned workspace.
struct MoeWorkspace {
  int32_t* row_offsets;   // [E+1]
  int32_t* tile_offsets;  // [E+1] m-tiles of tile_m rows per expert (the bf16 grouped GEMM's schedule)
  int32_t* active;        // [E] experts with >= 1 row, ascending
  int32_t* n_active;      // [1]
  int32_t* row_token;     // [P] token of each permuted row
  int32_t* pair_row;      // [P] permuted row of each (token, slot)
  bf16* act;              // [P, inter] silu(gate) * up
  bf16* y;                // [P, d_model] down projection per row
};

inline size_t moe_align_up(size_t v) { return (v + 255) / 256 * 256; }

inline size_t moe_workspace_layout_bytes(const MoeShape& s) {
  const int64_t P = s.n_tokens * s.top_k;
  return 4 * moe_align_up(sizeof(int32_t) * (s.n_experts + 1)) + 2 * moe_align_up(sizeof(int32_t) * P) +
         moe_align_up(sizeof(bf16) * P * s.inter) + moe_align_up(sizeof(bf16) * P * s.d_model);
}

inline MoeWorkspace moe_carve_workspace(void* base, const MoeShape& s) {
  const int64_t P = s.n_tokens * s.top_k;
  auto* p = static_cast<char*>(base);
  auto take = [&](size_t bytes) {
    char* r = p;
    p += moe_align_up(bytes);
    return r;
  };
  MoeWorkspace w;
  w.row_offsets = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * (s.n_experts + 1)));
  w.tile_offsets = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * (s.n_experts + 1)));
  w.active = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * (s.n_experts + 1)));
  w.n_active = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * (s.n_experts + 1)));
  w.row_token = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * P));
  w.pair_row = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * P));
  w.act = reinterpret_cast<bf16*>(take(sizeof(bf16) * P * s.inter));
  w.y = reinterpret_cast<bf16*>(take(sizeof(bf16) * P * s.d_model));
  return w;
}

// One block does the whole permutation (P is at most a few hundred thousand pairs): shared-memory
// histogram, warp-0 scan to row offsets, m-tile offsets (tile_m rows) and the list of active experts,
// then the scatter. One launch instead of memset + count + scan + scatter.
constexpr int kPermuteThreads = 1024;

__global__ void __launch_bounds__(kPermuteThreads)
    moe_permute_kernel(const int32_t* __restrict__ ids, int64_t n_pairs, int n_experts, int top_k, int tile_m,
                       int32_t* __restrict__ row_offsets, int32_t* __restrict__ tile_offsets,
                       int32_t* __restrict__ row_token, int32_t* __restrict__ pair_row,
                       int32_t* __restrict__ active, int32_t* __restrict__ n_active) {
  extern __shared__ int32_t psm[];
  int32_t* count = psm;               // [E]
  int32_t* cursor = psm + n_experts;  // [E]
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n_pairs; i += blockDim.x) {
    const int e = ids[i];
    if (e == -1) continue;                  // another rank's expert (expert parallelism)
    if (e < 0 || e >= n_experts) __trap();  // a corrupt routing id is a bug: fail loudly
    atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int rows = 0, tiles = 0, acts = 0;
    for (int base = 0; base < n_experts; base += 32) {
      const int e = base + lane;
      const int c = e < n_experts ? count[e] : 0;
      const int tl = (c + tile_m - 1) / tile_m, a = c > 0 ? 1 : 0;
      int ic = c, it = tl, ia = a;  // inclusive scans
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int uc = __shfl_up_sync(0xffffffffu, ic, o), ut = __shfl_up_sync(0xffffffffu, it, o),
                  ua = __shfl_up_sync(0xffffffffu, ia, o);
        if (lane >= o) {
          ic += uc;
          it += ut;
          ia += ua;
        }
      }
      if (e < n_experts) {
        row_offsets[e] = rows + ic - c;
        cursor[e] = rows + ic - c;
        tile_offsets[e] = tiles + it - tl;
        if (a) active[acts + ia - 1] = e;
      }
      rows += __shfl_sync(0xffffffffu, ic, 31);
      tiles += __shfl_sync(0xffffffffu, it, 31);
      acts += __shfl_sync(0xffffffffu, ia, 31);
    }
    if (lane == 0) {
      row_offsets[n_experts] = rows;
      tile_offsets[n_experts] = tiles;
      *n_active = acts;
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n_pairs; i += blockDim.x) {
    const int e = ids[i];
    if (e == -1) {
      pair_row[i] = -1;
      continue;
    }
    const int row = atomicAdd(&cursor[e], 1);
    row_token[row] = static_cast<int32_t>(i / top_k);
    pair_row[i] = row;
  }
}

// out[t] += sum_k w[t, k] * y[pair_row[t, k]] in fp32, one rounding (pairs with pair_row -1, other ranks'
// experts, add nothing). One thread per (token, 8 columns).
__global__ void moe_unpermute_kernel(const bf16* __restrict__ y, const int32_t* __restrict__ pair_row,
                                     const float* __restrict__ weights, bf16* out, int64_t n_tokens,
                                     int64_t d_model, int top_k) {
  // NOTE: the MXFP4 path launches this kernel as a programmatic dependent of its down GEMM (sm_90); the
  // wait is a no-op for a plain launch (the bf16 path).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const int64_t chunks = d_model / 8;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_tokens * chunks;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / chunks, c = (i % chunks) * 8;
    float acc[8];
    load8(out + t * d_model + c, acc);
    for (int k = 0; k < top_k; ++k) {
      const int32_t row = pair_row[t * top_k + k];
      if (row < 0) continue;
      const float w = weights[t * top_k + k];
      float v[8];
      load8(y + static_cast<int64_t>(row) * d_model + c, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += w * v[j];
    }
    store8(out + t * d_model + c, acc);
  }
}

inline int moe_grid_1d(int64_t n) { return static_cast<int>(std::clamp<int64_t>((n + 255) / 256, 1, 65535 * 8)); }

}  // namespace
}  // namespace mxserve::kernels::cuda
