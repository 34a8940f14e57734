// The tile walker shared by the Hopper wgmma MXFP4 designs 6 (moe_mxfp4_wg.cu, W4A16) and 8 (moe_mxfp4_wg8.cu,
// W4A8): which global weight row feeds each B-tile row, and the cp.async load stage of one k step -- the token
// rows (A) into the 128-byte swizzle layout, the packed E2M1 codes and the step's E8M0 scale word of every B row.
// What differs between the designs (bf16 dequantization vs e4m3 conversion of the codes, the step width, the
// epilogue) stays in their translation units. Issue 31 extracted this from the two kernels, unchanged.
//
// Layout contract (both designs): a block of kThreads threads owns BN weight rows (gate_up: BN / 2 features,
// gate and up rows interleaved in groups of 8; down: BN output features) of expert e, from feature fbase; one
// k step is kBK elements of K = 128 bytes of a token row (kBK 64 for bf16, 128 for e4m3), kBK / 2 code bytes
// of a weight row (kBK / 32 16-byte units) and the 4-byte scale word of its E8M0 bytes (one word covers
// 128 / kBK steps). Rows past N (and token rows past the tile) are zero-filled, never read.
#pragma once

#include <cstdint>

#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/common/wgmma_sm90.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_internal.h"

namespace mxserve::kernels::cuda {

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of 128-byte rows, 128B-swizzled (chunk ^ row % 8).
__device__ __forceinline__ int wg_swz128(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

// Global weight row (of the [E, w_rows, *] arrays; w_rows = 2 N for gate_up, N for down) of B-tile row i, and
// whether it exists (ok false: feature >= N, the row is zero-filled).
template <bool kSwiglu>
__device__ __forceinline__ int64_t wg_weight_row(int i, int e, int N, int64_t w_rows, int fbase, bool& ok) {
  int feat, grow;
  if (kSwiglu) {
    feat = fbase + (i / 16) * 8 + (i % 8);
    grow = (i % 16) < 8 ? feat : N + feat;
  } else {
    feat = fbase + i;
    grow = feat;
  }
  ok = feat < N;
  return static_cast<int64_t>(e) * w_rows + (ok ? grow : 0);
}

// This thread's weight sources, fixed over k: code unit u = tid + kThreads i -> B row u / (kBK / 32), 16-byte
// unit u % (kBK / 32) of the step; the scale word of B row tid + kThreads i.
template <int kBN, int kBK, int kThreads, bool kSwiglu>
struct WgWeightSources {
  static constexpr int kUnitsPerRow = kBK / 32;
  static constexpr int kCodeUnits = kBN * kUnitsPerRow / kThreads;
  static constexpr int kScaleRows = (kBN + kThreads - 1) / kThreads;
  static constexpr int kStepsPerScaleWord = 128 / kBK;
  bool okc[kCodeUnits], oks[kScaleRows];
  const uint8_t* srcc[kCodeUnits];
  const uint8_t* srcs[kScaleRows];

  // K, N, w_rows: the GEMM's (p.k, p.n, and the weight rows per expert).
  __device__ __forceinline__ WgWeightSources(const Mxfp4GemmArgs& p, int e, int K, int N, int64_t w_rows, int fbase,
                                             int tid) {
#pragma unroll
    for (int i = 0; i < kCodeUnits; ++i) {
      const int u = tid + kThreads * i;
      srcc[i] = p.wq + wg_weight_row<kSwiglu>(u / kUnitsPerRow, e, N, w_rows, fbase, okc[i]) * (K / 2) +
                16 * (u % kUnitsPerRow);
    }
#pragma unroll
    for (int i = 0; i < kScaleRows; ++i) {
      const int row = tid + kThreads * i;
      oks[i] = false;
      srcs[i] = p.ws;
      if (row < kBN) srcs[i] = p.ws + wg_weight_row<kSwiglu>(row, e, N, w_rows, fbase, oks[i]) * (K / 32);
    }
  }

  // cp.async this thread's part of step ks into ring slot `slot` of the shared-memory layout (byte offsets from
  // smem): code units at kCodes0 + slot * kCodesBytes ([BN][kBK / 2] bytes), scale words at
  // kScales0 + slot * kScalesBytes ([BN][4] bytes).
  template <int kCodes0, int kCodesBytes, int kScales0, int kScalesBytes>
  __device__ __forceinline__ void load(unsigned char* smem, int slot, int ks, const Mxfp4GemmArgs& p,
                                       int tid) const {
#pragma unroll
    for (int i = 0; i < kCodeUnits; ++i)
      cp_async_cg16_zfill(smem + kCodes0 + slot * kCodesBytes + (tid + kThreads * i) * 16,
                          okc[i] ? srcc[i] + ks * (kBK / 2) : p.wq, okc[i]);
#pragma unroll
    for (int i = 0; i < kScaleRows; ++i) {
      const int row = tid + kThreads * i;
      if (row < kBN)
        cp_async_ca4_zfill(smem + kScales0 + slot * kScalesBytes + row * 4,
                           oks[i] ? srcs[i] + (ks / kStepsPerScaleWord) * 4 : p.ws, oks[i]);
    }
  }
};

// This thread's token sources for one tile of expert rows [r0, r0 + rows): A chunk i = tile row tid / 8 + 32 i,
// 16-byte chunk tid % 8 of the step (gate_up gathers x's rows through row_token; down reads permuted rows).
// TA: bf16 (design 6: the tokens are p.a) or uint8_t e4m3 codes (design 8: p.a8).
template <int kChunks, int kBK, typename TA, bool kSwiglu>
struct WgTokenSources {
  static constexpr int kElemsPerChunk = static_cast<int>(16 / sizeof(TA));
  const TA* srca[kChunks];
  bool oka[kChunks];

  static __device__ __forceinline__ const TA* tokens(const Mxfp4GemmArgs& p) {
    if constexpr (sizeof(TA) == 1) return p.a8;
    else return p.a;
  }

  __device__ __forceinline__ WgTokenSources(const Mxfp4GemmArgs& p, int K, int rb, int r0, int rows, int tid) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int r = tid / 8 + 32 * i;
      oka[i] = r < rows;
      const int64_t src_row = !oka[i] ? 0 : kSwiglu ? static_cast<int64_t>(p.row_token[rb + r0 + r]) : rb + r0 + r;
      srca[i] = tokens(p) + src_row * K + kElemsPerChunk * (tid % 8);
    }
  }

  // cp.async this thread's chunks of step ks into the 128-byte-swizzled A tile of ring slot `slot` (byte offset
  // kA0 + slot * kATileBytes from smem); zero-filled chunks name the token base (never read).
  template <int kA0, int kATileBytes>
  __device__ __forceinline__ void load(unsigned char* smem, int slot, int ks, const Mxfp4GemmArgs& p, int tid) const {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int r = tid / 8 + 32 * i;
      cp_async_cg16_zfill(smem + kA0 + slot * kATileBytes + wg_swz128(r, tid % 8),
                          oka[i] ? srca[i] + ks * kBK : tokens(p), oka[i]);
    }
  }
};

// One k step of a warpgroup's m64 x kBN wgmma chain (designs 6 and moe_bf16_wg): kBK / 16 k16 MMAs from the
// 128B-swizzled K-major A / B tiles at shared addresses a_addr / b_addr into acc, committed as one group, then
// wait until the warpgroup's previous step is done (one group stays in flight).
template <int kBN, int kBK>
__device__ __forceinline__ void wg_mma_step(float (&acc)[kBN / 2], uint32_t a_addr, uint32_t b_addr) {
  wgmma::fence_regs(acc);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk) {
    const uint64_t da = wgmma::desc_sw128_kmajor(a_addr + 32 * kk);
    const uint64_t db = wgmma::desc_sw128_kmajor(b_addr + 32 * kk);
    if constexpr (kBN == 128) wgmma::m64n128k16_ss(acc, da, db, 1);
    else wgmma::m64n256k16_ss(acc, da, db, 1);
  }
  wgmma::commit_group();
  wgmma::fence_regs(acc);
  wgmma::wait_group<1>();  // this warpgroup's step ks - 1 is done
  wgmma::fence_regs(acc);
}

}  // namespace mxserve::kernels::cuda
