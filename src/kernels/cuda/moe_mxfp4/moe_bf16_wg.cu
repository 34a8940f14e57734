// The bf16 grouped GEMM of the MXFP4 prefill dequant path (moe_bf16_wg.h): design 6's block tile (128 expert
// rows x BN weight rows, 2 warpgroups, m64nBNk16 wgmma, 128-byte swizzled shared tiles, the gate/up row
// interleave and the SwiGLU epilogue of moe_mxfp4_wg.cu) with the weight operand already bf16 in global
// memory: both operands go through one S-stage cp.async ring of 64-wide k steps, nothing is converted.
// Schedule: one block per (expert, BN-wide weight tile, 128-row tile), flat in blockIdx.x and expert-major, the
// row tiles innermost: tile t of expert e's range [off[e] * NT, off[e + 1] * NT) (off = the permute's 128-row
// tile offsets, NT weight tiles) is weight tile (t - off[e] NT) / mt_e, row tile (t - off[e] NT) % mt_e. So the
// blocks of one expert run together: its row tiles share each weight tile and its weight tiles share each row
// tile through L2 (design 6's walk, one block per weight tile looping over the row tiles, re-streams the weight
// tile from HBM per row tile: fine for 4-bit codes, 4x the bytes here), and a hot expert spreads over the SMs.
// Step ks: wait for stage ks (cp.async group accounting: S - 2 stages in flight ahead), fence.proxy.async,
// barrier (stage ks visible; every warpgroup finished step ks - 2, so its slot is free) -> refill that slot with
// stage ks + S - 2 -> issue the 4 wgmmas of step ks -> wait for this warpgroup's step ks - 1.
// One slot more than the prefetch depth is the price of a single barrier per step.
// Requires sm_90a (wgmma); the caller (moe_prefill_dequant.cu) checks the device and K % 128 == 0.

#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/common/wgmma_sm90.cuh"
#include "kernels/cuda/moe_mxfp4/moe_bf16_wg.h"
#include "kernels/cuda/moe_mxfp4/moe_bf16_wg_schedule.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_epilogue.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_wg_tile.cuh"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kBM = kMoeBf16WgTileM;  // expert rows (tokens) per tile
constexpr int kBK = 64;   // K per step: one 128-byte swizzle row of bf16
constexpr int kThreads = 256;

template <int kBN, int kStages>
struct Bf16WgLayout {  // byte offsets from the 1024-aligned base of dynamic shared memory
  static constexpr int kATile = kBM * 128;
  static constexpr int kBTile = kBN * 128;
  static constexpr int kA0 = 0;
  static constexpr int kB0 = kStages * kATile;
  static constexpr int kBytes = kB0 + kStages * kBTile;
  static constexpr size_t kSmem = kBytes + 1024;  // + alignment slack
};

template <int kBN, int kStages, bool kSwiglu>
__global__ void __launch_bounds__(kThreads, kBN == 128 ? 2 : 1)
    moe_bf16_wg_kernel(Mxfp4GemmArgs p, const bf16* __restrict__ wcopy, const int32_t* __restrict__ tile_offsets,
                       int n_wtiles) {
  using L = Bf16WgLayout<kBN, kStages>;
  constexpr int kAcc = kBN / 2;
  constexpr int kBChunks = kBN * 8 / kThreads;  // 16-byte B chunks per thread per step
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wg = warp / 4, wq = warp % 4;

  const MoeBf16WgTile tl = moe_bf16_wg_tile(blockIdx.x, tile_offsets, p.n_experts, n_wtiles);
  if (!tl.valid) return;
  const int e = tl.expert;
  const int K = p.k, N = p.n, n_steps = K / kBK;
  const int64_t w_rows = kSwiglu ? 2ll * N : N;
  const int fbase = tl.wtile * (kSwiglu ? kBN / 2 : kBN);
  const int rb = p.row_offsets[e], rows_total = p.row_offsets[e + 1] - rb;
  const int r0 = tl.mtile * kBM;

  // This thread's B sources, fixed over k: chunk u = tid + 256 i -> B row u / 8, 16-byte chunk u % 8.
  const bf16* srcb[kBChunks];
  bool okb[kBChunks];
#pragma unroll
  for (int i = 0; i < kBChunks; ++i) {
    const int u = tid + kThreads * i;
    srcb[i] = wcopy + wg_weight_row<kSwiglu>(u / 8, e, N, w_rows, fbase, okb[i]) * K + 8 * (u % 8);
  }

  {
    const int rows = min(kBM, rows_total - r0);
    const WgTokenSources<4, kBK, bf16, kSwiglu> asrc(p, K, rb, r0, rows, tid);
    auto load_stage = [&](int ks, int slot) {
      asrc.template load<L::kA0, L::kATile>(smem, slot, ks, p, tid);
#pragma unroll
      for (int i = 0; i < kBChunks; ++i) {
        const int u = tid + kThreads * i;
        cp_async_cg16_zfill(smem + L::kB0 + slot * L::kBTile + wg_swz128(u / 8, u % 8),
                            okb[i] ? srcb[i] + ks * kBK : wcopy, okb[i]);
      }
    };

#pragma unroll
    for (int s = 0; s < kStages - 2; ++s) {
      if (s < n_steps) load_stage(s, s);
      cp_async_commit_group();
    }
    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

    for (int ks = 0; ks < n_steps; ++ks) {
      // Groups committed: stages 0 .. ks + S - 3 (one per stage, some empty); stage ks must have landed.
      cp_async_wait_group<kStages - 3>();
      wgmma::fence_proxy_async_smem();
      __syncthreads();  // stage ks visible; every warpgroup's step ks - 2 done (its wait_group<1> at ks - 1)
      if (ks + kStages - 2 < n_steps) load_stage(ks + kStages - 2, (ks + kStages - 2) % kStages);
      cp_async_commit_group();
      const int slot = ks % kStages;
      const uint32_t a_addr = sbase + L::kA0 + slot * L::kATile + wg * 64 * 128;
      const uint32_t b_addr = sbase + L::kB0 + slot * L::kBTile;
      wg_mma_step<kBN, kBK>(acc, a_addr, b_addr);
    }
    wgmma::wait_group<0>();
    wgmma::fence_regs(acc);
    cp_async_wait_group<0>();  // the trailing (empty) groups

    // Epilogue (as design 6): row = 64 wg + 16 wq + g + 8 h, accumulator column 8 j + 2 t (+1).
    wg_store_acc<kBN, kSwiglu>(acc, p.c, rb + r0, wg * 64 + wq * 16 + g, rows, N, fbase, t);
  }
}

template <int kBN, int kStages, bool kSwiglu>
void launch(const Mxfp4GemmArgs& p, const bf16* wcopy, const int32_t* tile_offsets, int64_t max_tiles,
            cudaStream_t stream) {
  using L = Bf16WgLayout<kBN, kStages>;
  static_assert(kStages >= 3, "moe_bf16_wg: one slot beyond the prefetch depth (S >= 3)");
  static_assert(L::kSmem <= 227 * 1024, "moe_bf16_wg: shared memory over 227 KiB");
  auto* kernel = moe_bf16_wg_kernel<kBN, kStages, kSwiglu>;
  MX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(L::kSmem)));
  const int n_wtiles = ceil_div(p.n, kSwiglu ? kBN / 2 : kBN);
  const int64_t blocks = max_tiles * n_wtiles;
  MX_CHECK_MSG(blocks < (int64_t{1} << 31), "moe_bf16_wg_gemm: " << blocks << " blocks");
  kernel<<<dim3(static_cast<unsigned>(blocks)), kThreads, L::kSmem, stream>>>(p, wcopy, tile_offsets, n_wtiles);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace

void moe_bf16_wg_gemm(bool swiglu, int bn, const Mxfp4GemmArgs& p, const bf16* wcopy, const int32_t* tile_offsets,
                      int64_t max_tiles, cudaStream_t stream) {
  MX_CHECK_MSG(bn == 128 || bn == 256, "moe_bf16_wg_gemm: BN " << bn << " (expected 128 or 256)");
  MX_CHECK_MSG(p.k % kBK == 0 && p.k > 0 && p.n > 0, "moe_bf16_wg_gemm: K " << p.k << " must be a positive multiple of 64");
  MX_CHECK_MSG(reinterpret_cast<uintptr_t>(wcopy) % 16 == 0 && reinterpret_cast<uintptr_t>(p.a) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.c) % 4 == 0,
               "moe_bf16_wg_gemm: needs 16-byte aligned weights and activations, 4-byte aligned output");
  MX_CHECK_MSG(p.n_experts > 0 && tile_offsets != nullptr, "moe_bf16_wg_gemm: no tile schedule");
  if (max_tiles <= 0) return;
  if (bn == 256) {
    if (swiglu) launch<256, 4, true>(p, wcopy, tile_offsets, max_tiles, stream);
    else launch<256, 4, false>(p, wcopy, tile_offsets, max_tiles, stream);
  } else {
    if (swiglu) launch<128, 3, true>(p, wcopy, tile_offsets, max_tiles, stream);
    else launch<128, 3, false>(p, wcopy, tile_offsets, max_tiles, stream);
  }
}

}  // namespace mxserve::kernels::cuda
