// Design 6 of the MXFP4 expert GEMMs (prefill, Hopper warpgroup MMA, W4A16). The variants (wg_n{BN}_s{S})
// are rows of moe_mxfp4_variants.h; this unit instantiates them from it.
//
// Block tile: 128 rows of one expert (tokens = wgmma operand A, M) x BN weight rows (operand B, N; gate_up:
// BN / 2 features, gate and up rows interleaved in groups of 8) x 64 K per step; 256 threads = 2 warpgroups,
// warpgroup w owning tile rows [64 w, 64 w + 64) with a m64nBNk16 f32 accumulator (BN / 2 registers).
// Per 64-wide k step, in a S-stage cp.async ring: the tokens (128 rows x 128 B bf16, written straight into
// the 128-byte swizzle layout: 16-byte chunk c of row r at chunk c ^ (r % 8)), the packed E2M1 codes
// (BN x 32 B) and the scale word holding this step's two E8M0 bytes (BN x 4 B). The codes are dequantized
// to bf16 (mxfp4_dequant.cuh, exact) into one of two swizzled B tiles, BN rows x 128 B.
// Step ks: issue the 4 wgmmas of step ks (async) -> wait until this warpgroup's step ks - 1 is done ->
// wait for stage ks + 1's cp.async -> fence.proxy.async, barrier (everyone's step ks - 1 done: its ring
// slot and B tile are free; stage ks + 1 visible) -> refill that slot with stage ks + S - 1 -> dequantize
// stage ks + 1 into the free B tile while step ks's wgmmas run -> fence.proxy.async, barrier.
// Every generic-proxy shared write a wgmma reads (cp.async tokens, dequantized weights) is fenced by its
// writer (fence.proxy.async) before the barrier that precedes the wgmma.
// Epilogue straight from the accumulators (layout in common/wgmma_sm90.cuh): gate_up fuses SwiGLU (columns 16 i ..
// 16 i + 7 gate, 16 i + 8 .. 16 i + 15 up of the same 8 features), down writes y rows; bf16x2 stores.
// Grid: (weight-row tiles, active experts); a block walks every 128-row tile of its expert.
// Requires sm_90a (wgmma) and K % 128 == 0 (whole 64-wide steps, 4-byte aligned scale words); the launcher
// runs pf_t128 instead (saying so once) on any other device. The weight-row map and the load stage are the tile
// walker shared with design 8 (moe_mxfp4_wg_tile.cuh).

#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "core/logging.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/sm90_device.h"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/common/wgmma_sm90.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_epilogue.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_internal.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_wg_tile.cuh"
#include "kernels/cuda/moe_mxfp4/mxfp4_dequant.cuh"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kWgBM = 128;  // expert rows (tokens) per tile
constexpr int kWgBK = 64;   // K per step (one 128-byte swizzle row of bf16)
constexpr int kWgThreads = 256;

template <int kBN, int kStages>
struct WgLayout {  // byte offsets from the 1024-aligned base of dynamic shared memory
  static constexpr int kBTile = kBN * 128;  // one dequantized B tile
  static constexpr int kATile = kWgBM * 128;
  static constexpr int kCodes = kBN * 32;
  static constexpr int kScales = kBN * 4;
  static constexpr int kB0 = 0;
  static constexpr int kA0 = 2 * kBTile;
  static constexpr int kCodes0 = kA0 + kStages * kATile;
  static constexpr int kScales0 = kCodes0 + kStages * kCodes;
  static constexpr int kBytes = kScales0 + kStages * kScales;
  static constexpr size_t kSmem = kBytes + 1024;  // + alignment slack
};

template <int kBN, int kStages, bool kSwiglu>
__global__ void __launch_bounds__(kWgThreads, kBN == 128 ? 2 : 1) mxfp4_wg_kernel(Mxfp4GemmArgs p) {
  using L = WgLayout<kBN, kStages>;
  using Weights = WgWeightSources<kBN, kWgBK, kWgThreads, kSwiglu>;
  constexpr int kAcc = kBN / 2;                    // accumulator registers per thread
  constexpr int kCodeUnits = Weights::kCodeUnits;  // 16-byte code units (and dequant units) per thread per stage
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wg = warp / 4, wq = warp % 4;  // warpgroup, warp within it
  mxfp4_pdl_wait();

  const int n_act = *p.n_active;
  const int e = p.active[min(static_cast<int>(blockIdx.y), p.max_active - 1)];
  if (static_cast<int>(blockIdx.y) >= n_act) return;
  const int K = p.k, N = p.n, n_steps = K / kWgBK;
  const int64_t w_rows = kSwiglu ? 2ll * N : N;
  const int fbase = blockIdx.x * (kSwiglu ? kBN / 2 : kBN);
  const int rb = p.row_offsets[e], rows_total = p.row_offsets[e + 1] - rb;
  // This thread's weight sources (fixed over k): code unit u = tid + 256 i -> row u / 2, half u % 2; scale
  // word of row tid (+ 256 i).
  const Weights wsrc(p, e, K, N, w_rows, fbase, tid);

  for (int r0 = 0; r0 < rows_total; r0 += kWgBM) {
    const int rows = min(kWgBM, rows_total - r0);
    // Token rows of this thread's 4 A chunks: row tid / 8 + 32 i, chunk tid % 8.
    const WgTokenSources<4, kWgBK, bf16, kSwiglu> asrc(p, K, rb, r0, rows, tid);
    auto load_stage = [&](int ks, int slot) {
      asrc.template load<L::kA0, L::kATile>(smem, slot, ks, p, tid);
      wsrc.template load<L::kCodes0, L::kCodes, L::kScales0, L::kScales>(smem, slot, ks, p, tid);
    };
    // Dequantize stage ks (ring slot) into B tile `buf`: unit u = tid + 256 i -> row u / 2, 32-wide half u % 2.
    auto dequant = [&](int ks, int slot, int buf) {
#pragma unroll
      for (int i = 0; i < kCodeUnits; ++i) {
        const int u = tid + kWgThreads * i, row = u / 2, half = u % 2;
        const uint4 q = *reinterpret_cast<const uint4*>(smem + L::kCodes0 + slot * L::kCodes + u * 16);
        const Mxfp4Factor f = mxfp4_factor(smem[L::kScales0 + slot * L::kScales + row * 4 + (ks % 2) * 2 + half]);
        unsigned char* bt = smem + L::kB0 + buf * L::kBTile;
        const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int c = 0; c < 4; ++c)
          *reinterpret_cast<uint4*>(bt + wg_swz128(row, 4 * half + c)) = mxfp4_dequant_word(words[c], f);
      }
    };

    __syncthreads();  // the previous tile's wgmmas and dequant reads are done with every buffer
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_steps) load_stage(s, s);
      cp_async_commit_group();
    }
    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
    cp_async_wait_group<kStages - 2>();  // stage 0 landed (this thread's part)
    __syncthreads();
    dequant(0, 0, 0);
    wgmma::fence_proxy_async_smem();
    __syncthreads();

    for (int ks = 0; ks < n_steps; ++ks) {
      const uint32_t a_addr = sbase + L::kA0 + (ks % kStages) * L::kATile + wg * 64 * 128;
      const uint32_t b_addr = sbase + L::kB0 + (ks % 2) * L::kBTile;
      wg_mma_step<kBN, kWgBK>(acc, a_addr, b_addr);
      if (ks + 1 < n_steps) {
        // Groups committed so far cover stages 0 .. ks + S - 2; stage ks + 1 must have landed.
        cp_async_wait_group<kStages - 3>();
        wgmma::fence_proxy_async_smem();
      }
      __syncthreads();  // every warpgroup's step ks - 1 done; stage ks + 1 visible to all threads
      if (ks + kStages - 1 < n_steps) load_stage(ks + kStages - 1, (ks + kStages - 1) % kStages);
      cp_async_commit_group();
      if (ks + 1 < n_steps) {
        dequant(ks + 1, (ks + 1) % kStages, (ks + 1) % 2);
        wgmma::fence_proxy_async_smem();
      }
      __syncthreads();  // B tile of step ks + 1 complete and fenced
    }
    wgmma::wait_group<0>();
    wgmma::fence_regs(acc);
    cp_async_wait_group<0>();  // the trailing (empty) groups

    // Epilogue: row = 64 wg + 16 wq + g + 8 h, accumulator column 8 j + 2 t (+1).
    wg_store_acc<kBN, kSwiglu>(acc, p.c, rb + r0, wg * 64 + wq * 16 + g, rows, N, fbase, t);
  }
}

// sm_90 (Hopper) only: wgmma. Cached per process (one device per backend in this engine).
bool wg_device_ok() { return cuda_device_is_sm90(); }

template <int kBN, int kStages, bool kSwiglu>
void launch_wg(const Mxfp4GemmArgs& a, cudaStream_t stream) {
  if (!wg_device_ok() || a.k % 128 != 0) {
    MX_WARN_ONCE << "moe_mxfp4: the wg_* (Hopper wgmma) MXFP4 kernels need an sm_90 device and K % 128 == 0 (K "
                 << a.k << "); running pf_t128 instead (retune with `mxserve tune-moe` on this GPU)";
    mxfp4_pf_launchers()[moe_mxfp4_variant::kPfT128](kSwiglu, a, stream);
    return;
  }
  MX_CHECK_MSG(reinterpret_cast<uintptr_t>(a.ws) % 4 == 0 && reinterpret_cast<uintptr_t>(a.wq) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.a) % 16 == 0 && reinterpret_cast<uintptr_t>(a.c) % 4 == 0,
               "wg_* MXFP4 variants need 16-byte aligned codes and activations, 4-byte aligned scales and output");
  using L = WgLayout<kBN, kStages>;
  auto* kernel = mxfp4_wg_kernel<kBN, kStages, kSwiglu>;
  MX_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(L::kSmem)));
  const dim3 grid(ceil_div(a.n, kSwiglu ? kBN / 2 : kBN), a.max_active);
  mxfp4_launch_pdl(kernel, grid, dim3(kWgThreads), L::kSmem, stream, a);
}

template <int kBN, int kStages, int>
struct WgLaunch {
  static_assert(kBN == 128 || kBN == 256, "wg_*: BN is 128 or 256");
  static_assert(kStages >= 3, "wg_*: the k loop keeps one stage in flight beyond the next (S >= 3)");
  static_assert(WgLayout<kBN, kStages>::kSmem <= 227 * 1024, "wg_*: shared memory over 227 KiB");
  static void run(bool swiglu, const Mxfp4GemmArgs& a, cudaStream_t stream) {
    if (swiglu) launch_wg<kBN, kStages, true>(a, stream);
    else launch_wg<kBN, kStages, false>(a, stream);
  }
};

}  // namespace

const Mxfp4Launchers& mxfp4_wg_launchers() {
  static constexpr Mxfp4Launchers kLaunchers = mxfp4_design_launchers<MoeMxfp4Design::kWg, WgLaunch>();
  return kLaunchers;
}

}  // namespace mxserve::kernels::cuda
