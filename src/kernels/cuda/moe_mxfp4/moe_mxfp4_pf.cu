// Design 4 of the MXFP4 expert GEMMs (prefill, tensor cores, shared-memory tiles + cp.async pipeline).
// The variants (pf_t{T}) are rows of moe_mxfp4_variants.h; this unit instantiates them from it.
//
// Same "swapped" mma.sync m16n8k16 fragments and K permutation as design 2 (weights = operand A, 16 rows
// per m-tile; thread (g, t) owns bytes [16t, 16t+16) = one E8M0 block of each 128-wide k step; tokens =
// operand B, x[token][32t, 32t+32) contiguous), but every operand goes through shared memory:
//   - block tile: 128 weight rows (gate_up: 64 features, gate and up rows paired per m-tile as in design
//     2) x kBT tokens (kBT = 16 kNtW: 128 or 64) of one expert; 8 warps = 4 (weight rows, 32 each = 2
//     m-tiles) x 2 (tokens, kBT/2 each = kNtW n-tiles);
//   - per 128-wide k step one stage = packed codes 128 x 64 B + scales 128 x 4 B + tokens kBT x 256 B,
//     loaded with cp.async (16-byte, zero-fill past N / past the expert's rows) into a 3-stage ring, one
//     __syncthreads per k step;
//   - each weight element is dequantized once per warp per pass of kBT tokens (design 2: per 8..64
//     tokens), i.e. 2 dequant ops per 16 MMAs at kBT 128; tokens are reused by 4 warps from shared memory.
// Token tile layout: 16 units of 16 bytes per token row, unit u stored at u ^ ((u >> 3) & 1) ^ ((row & 1)
// << 1): a quarter-warp's 8 lanes (2 rows x 4 t) then hit 8 distinct 16-byte bank groups. Weight tile: 64
// bytes per row, a quarter-warp reads 2 rows x 64 contiguous bytes (conflict-free as is).
// Requires K % 128 == 0 (whole k steps, 4-byte aligned scale words): every GLM / gpt-oss shape.

#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_epilogue.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_internal.h"
#include "kernels/cuda/moe_mxfp4/mxfp4_dequant.cuh"

namespace mxserve::kernels::cuda {
namespace {

__device__ __forceinline__ int pf_swz(int u, int row) { return u ^ ((u >> 3) & 1) ^ ((row & 1) << 1); }

constexpr int kPfStages = 3;
constexpr int kPfRows = 128;  // weight rows per block
constexpr int kPfThreads = 256;

template <int kNtW>
constexpr size_t pf_stage_bytes() {
  return kPfRows * 64 + kPfRows * 4 + 16 * kNtW * 256;  // codes + scale words + tokens
}
template <int kNtW>
constexpr size_t pf_smem_bytes() {
  return kPfStages * pf_stage_bytes<kNtW>() + 16 * kNtW * sizeof(int64_t);
}

template <int kNtW, bool kSwiglu>
__global__ void __launch_bounds__(kPfThreads, 1) mxfp4_pf_kernel(Mxfp4GemmArgs p) {
  constexpr int kBT = 16 * kNtW;  // tokens per block tile
  constexpr int kStage = static_cast<int>(pf_stage_bytes<kNtW>());
  extern __shared__ __align__(16) unsigned char smem[];
  int64_t* tok_src = reinterpret_cast<int64_t*>(smem + kPfStages * kStage);  // [kBT] source row or -1
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wn = warp % 4, wt = warp / 4;  // weight-row group (32 rows), token half
  mxfp4_pdl_wait();

  const int n_act = *p.n_active;
  const int e = p.active[min(static_cast<int>(blockIdx.y), p.max_active - 1)];
  if (static_cast<int>(blockIdx.y) >= n_act) return;
  const int K = p.k, N = p.n, n_blocks = K / 32, n_steps = K / 128;
  const int64_t w_rows = kSwiglu ? 2ll * N : N;
  const int fbase = blockIdx.x * (kSwiglu ? kPfRows / 2 : kPfRows);
  const int rb = p.row_offsets[e], rows_total = p.row_offsets[e + 1] - rb;

  // Global weight row of smem row i (0..127) and whether it exists.
  auto wrow = [&](int i, bool& ok) -> int64_t {
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
  };
  // This thread's cp.async sources that do not change with k: 2 code units, 1 scale word (tid < 128).
  bool okc[2], oks = false;
  const uint8_t* srcc[2];
  const uint8_t* srcs = p.ws;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int idx = tid + kPfThreads * i, row = idx / 4, u = idx % 4;
    const int64_t gr = wrow(row, okc[i]);
    srcc[i] = p.wq + gr * (K / 2) + 16 * u;
  }
  if (tid < kPfRows) srcs = p.ws + wrow(tid, oks) * n_blocks;

  for (int r0 = 0; r0 < rows_total; r0 += kBT) {
    const int rows = min(kBT, rows_total - r0);
    __syncthreads();  // the previous tile's readers are done with the ring and tok_src
    if (tid < kBT) {
      const int r = r0 + tid;
      tok_src[tid] = r < rows_total ? (kSwiglu ? static_cast<int64_t>(p.row_token[rb + r]) : rb + r) : -1;
    }
    __syncthreads();
    auto load_stage = [&](int ks, int slot) {
      unsigned char* st = smem + slot * kStage;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int idx = tid + kPfThreads * i;  // row idx / 4, unit idx % 4
        cp_async_cg16_zfill(st + idx * 16, okc[i] ? srcc[i] + ks * 64 : p.wq, okc[i]);
      }
      if (tid < kPfRows) cp_async_ca4_zfill(st + kPfRows * 64 + tid * 4, oks ? srcs + ks * 4 : p.ws, oks);
      unsigned char* xt = st + kPfRows * 68;
#pragma unroll
      for (int i = 0; i < kBT * 16 / kPfThreads; ++i) {
        const int idx = tid + kPfThreads * i, row = idx / 16, u = idx % 16;
        const int64_t src = tok_src[row];
        cp_async_cg16_zfill(xt + row * 256 + pf_swz(u, row) * 16, src >= 0 ? p.a + src * K + ks * 128 + u * 8 : p.a,
                src >= 0);
      }
    };
#pragma unroll
    for (int s = 0; s < kPfStages - 1; ++s) {
      if (s < n_steps) load_stage(s, s);
      cp_async_commit_group();
    }
    float acc[2][kNtW][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNtW; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;

    for (int ks = 0; ks < n_steps; ++ks) {
      cp_async_wait_group<kPfStages - 2>();
      __syncthreads();  // stage ks visible to all; every warp is done with stage ks - 1
      if (ks + kPfStages - 1 < n_steps) load_stage(ks + kPfStages - 1, (ks + kPfStages - 1) % kPfStages);
      cp_async_commit_group();
      const unsigned char* st = smem + (ks % kPfStages) * kStage;
      const unsigned char* xt = st + kPfRows * 68;
      uint4 qa[2], qb[2];
      Mxfp4Factor fa[2], fb[2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int ra = wn * 32 + mt * 16 + g, rbw = ra + 8;
        qa[mt] = *reinterpret_cast<const uint4*>(st + ra * 64 + 16 * t);
        qb[mt] = *reinterpret_cast<const uint4*>(st + rbw * 64 + 16 * t);
        fa[mt] = mxfp4_factor(st[kPfRows * 64 + ra * 4 + t]);
        fb[mt] = mxfp4_factor(st[kPfRows * 64 + rbw * 4 + t]);
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // token unit q (x[32t + 8q, +8)) feeds MMAs 2q and 2q+1
        uint32_t xw[kNtW][4];
#pragma unroll
        for (int nt = 0; nt < kNtW; ++nt) {
          const int row = wt * (kBT / 2) + nt * 8 + g;
          const uint4 v = *reinterpret_cast<const uint4*>(xt + row * 256 + pf_swz(4 * t + q, row) * 16);
          xw[nt][0] = v.x;
          xw[nt][1] = v.y;
          xw[nt][2] = v.z;
          xw[nt][3] = v.w;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            uint32_t a[4];
            switch (2 * q + h) {
              case 0: mxfp4_a_frag<0>(qa[mt], qb[mt], fa[mt], fb[mt], a); break;
              case 1: mxfp4_a_frag<1>(qa[mt], qb[mt], fa[mt], fb[mt], a); break;
              case 2: mxfp4_a_frag<2>(qa[mt], qb[mt], fa[mt], fb[mt], a); break;
              case 3: mxfp4_a_frag<3>(qa[mt], qb[mt], fa[mt], fb[mt], a); break;
              case 4: mxfp4_a_frag<4>(qa[mt], qb[mt], fa[mt], fb[mt], a); break;
              case 5: mxfp4_a_frag<5>(qa[mt], qb[mt], fa[mt], fb[mt], a); break;
              case 6: mxfp4_a_frag<6>(qa[mt], qb[mt], fa[mt], fb[mt], a); break;
              default: mxfp4_a_frag<7>(qa[mt], qb[mt], fa[mt], fb[mt], a); break;
            }
#pragma unroll
            for (int nt = 0; nt < kNtW; ++nt) mma_bf16_m16n8k16(acc[mt][nt], a, xw[nt][2 * h], xw[nt][2 * h + 1]);
          }
        }
      }
    }
    cp_async_wait_group<0>();  // nothing of this tile left in flight (the trailing groups are empty)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int feat_a = kSwiglu ? fbase + wn * 16 + mt * 8 + g : fbase + wn * 32 + mt * 16 + g;
      const int feat_b = kSwiglu ? feat_a : feat_a + 8;
#pragma unroll
      for (int nt = 0; nt < kNtW; ++nt)
        mxfp4_store_tile<kSwiglu>(acc[mt][nt], p.c, rb + r0, wt * (kBT / 2) + nt * 8, rows, N, feat_a, feat_b, t);
    }
  }
}

template <int kNtW, bool kSwiglu>
void launch_pf(const Mxfp4GemmArgs& a, cudaStream_t stream) {
  MX_CHECK_MSG(reinterpret_cast<uintptr_t>(a.ws) % 4 == 0 && reinterpret_cast<uintptr_t>(a.wq) % 16 == 0,
               "pf_* MXFP4 variants need 16-byte aligned codes and 4-byte aligned scales");
  const size_t smem = pf_smem_bytes<kNtW>();
  auto* kernel = mxfp4_pf_kernel<kNtW, kSwiglu>;
  MX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(ceil_div(a.n, kSwiglu ? kPfRows / 2 : kPfRows), a.max_active);
  mxfp4_launch_pdl(kernel, grid, dim3(kPfThreads), smem, stream, a);
}

template <int kNtW, int, int>
struct PfLaunch {
  static void run(bool swiglu, const Mxfp4GemmArgs& a, cudaStream_t stream) {
    if (swiglu) launch_pf<kNtW, true>(a, stream);
    else launch_pf<kNtW, false>(a, stream);
  }
};

}  // namespace

const Mxfp4Launchers& mxfp4_pf_launchers() {
  static constexpr Mxfp4Launchers kLaunchers = mxfp4_design_launchers<MoeMxfp4Design::kPf, PfLaunch>();
  return kLaunchers;
}

}  // namespace mxserve::kernels::cuda
