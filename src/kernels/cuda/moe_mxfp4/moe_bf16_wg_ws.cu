// The warp-specialized variant of the prefill dequant path's bf16 grouped GEMM (moe_bf16_wg.h, ws = true): the same
// 128 x 256 block tile, tile schedule (moe_bf16_wg_schedule.h), swizzled layouts and epilogue as moe_bf16_wg.cu,
// with the loads moved off the MMA warps (the FA3 / CUTLASS "warp-specialized" structure of
// attention/paged_attention_wgmma_ws.cu, same primitives):
//   warpgroup 0  producer (setmaxnreg down to 40): per 64-wide k step, waits for the ring slot's empty barrier,
//                cp.asyncs the 128 token rows (gathered through a shared-memory row table) and the 256 weight rows
//                into it, and signals the slot's full barrier with cp.async.mbarrier.arrive.noinc (128 arrivals);
//   warpgroups 1-2  consumers (setmaxnreg up to 232), 64 expert rows each: wait full, fence.proxy.async, 4 wgmma
//                m64n256k16, keep one step in flight (wait_group 1), then release the previous step's slot on its
//                empty barrier (256 arrivals).
// No block-wide barrier in the k loop: the consumers issue MMAs back to back while the producer runs S - 1 steps
// ahead. Registers: 128 x 40 + 256 x 232 <= 64K. Requires sm_90a (compiled only in sm_90a device passes).
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/attention/sm90_sync.cuh"
#include "kernels/cuda/attention/wgmma_tile.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/wgmma_sm90.cuh"
#include "kernels/cuda/moe_mxfp4/moe_bf16_wg.h"
#include "kernels/cuda/moe_mxfp4/moe_bf16_wg_schedule.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_epilogue.cuh"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kBM = kMoeBf16WgTileM;
constexpr int kBN = 256;
constexpr int kBK = 64;
constexpr int kStages = 4;
constexpr int kThreads = 384;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
constexpr int kATile = kBM * 128, kBTile = kBN * 128, kStageBytes = kATile + kBTile;
constexpr int kBars = kStages * kStageBytes;            // full[S] then empty[S], 8 bytes each
constexpr int kRowTable = kBars + 2 * kStages * 8;      // int32 [kBM]: token row of each tile row, -1 past the tile
constexpr size_t kSmem = kRowTable + 4 * kBM + 1024;    // + alignment slack
static_assert(kSmem <= 227 * 1024, "moe_bf16_wg_ws: shared memory over 227 KiB");

__device__ __forceinline__ uint32_t swz128(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

template <bool kSwiglu>
__global__ void __launch_bounds__(kThreads, 1)
    moe_bf16_wg_ws_kernel(Mxfp4GemmArgs p, const bf16* __restrict__ wcopy, const int32_t* __restrict__ tile_offsets,
                          int n_wtiles) {
#if defined(MX_WGMMA_DEVICE)
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  int32_t* a_row = reinterpret_cast<int32_t*>(smem + kRowTable);
  auto bar_full = [&](int s) { return sbase + kBars + 8u * s; };
  auto bar_empty = [&](int s) { return sbase + kBars + 8u * (kStages + s); };

  const MoeBf16WgTile tl = moe_bf16_wg_tile(blockIdx.x, tile_offsets, p.n_experts, n_wtiles);
  if (!tl.valid) return;  // the whole block: before any barrier
  const int e = tl.expert;
  const int K = p.k, N = p.n, n_steps = K / kBK;
  const int64_t w_rows = kSwiglu ? 2ll * N : N;
  const int fbase = tl.wtile * (kSwiglu ? kBN / 2 : kBN);
  const int rb = p.row_offsets[e], rows_total = p.row_offsets[e + 1] - rb;
  const int r0 = tl.mtile * kBM;
  const int rows = min(kBM, rows_total - r0);

  const int tid = threadIdx.x;
  if (tid < kBM) a_row[tid] = tid < rows ? (kSwiglu ? p.row_token[rb + r0 + tid] : rb + r0 + tid) : -1;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(bar_full(s), 128);
      sm90::mbar_init(bar_empty(s), 256);
    }
  }
  __syncthreads();
  // Warp-uniform role (a broadcast): a divergent-looking branch would serialize the consumers' wgmmas (C7520).
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0), wtid = tid % 128;

  if (wg == 0) {
    // ---- producer: thread wtid copies 16-byte chunk c of tile rows rt + 16 i (A: i < 8, B: i < 16) ----
    sm90::setmaxnreg_dec<kProducerRegs>();
    const int c = wtid % 8, rt = wtid / 8;
    // B row rt + 16 i: gate_up -> feature fbase + 8 i + rt % 8, the gate (rt < 8) or up (rt >= 8) row of it;
    // down -> feature fbase + rt + 16 i.
    const int feat0 = kSwiglu ? fbase + (rt % 8) : fbase + rt;
    const int feat_step = kSwiglu ? 8 : 16;
    const int64_t grow0 = kSwiglu ? (rt < 8 ? feat0 : N + feat0) : feat0;
    const bf16* wbase = wcopy + (static_cast<int64_t>(e) * w_rows + grow0) * K + 8 * c;
    const bf16* abase = p.a + 8 * c;
    for (int ks = 0; ks < n_steps; ++ks) {
      const int s = ks % kStages;
      sm90::mbar_wait(bar_empty(s), ((ks / kStages) & 1) ^ 1);
      const uint32_t da = sbase + s * kStageBytes, db = da + kATile;
#pragma unroll 1  // the producer runs on 40 registers: no unrolled address sets
      for (int i = 0; i < kBM / 16; ++i) {
        const int r = rt + 16 * i, src = a_row[r];
        wgmma_tile::cp_async16(da + swz128(r, c), src >= 0 ? abase + static_cast<int64_t>(src) * K + ks * kBK : p.a,
                               src >= 0);
      }
#pragma unroll 1
      for (int i = 0; i < kBN / 16; ++i) {
        const bool ok = feat0 + feat_step * i < N;
        wgmma_tile::cp_async16(db + swz128(rt + 16 * i, c),
                               ok ? wbase + static_cast<int64_t>(feat_step) * i * K + ks * kBK : wcopy, ok);
      }
      sm90::cp_async_mbar_arrive(bar_full(s));
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy in flight behind an exiting thread
    return;
  }

  // ---- consumers: warpgroup cw owns tile rows 64 cw .. 64 cw + 63 ----
  sm90::setmaxnreg_inc<kConsumerRegs>();
  const int cw = wg - 1, wq = wtid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  float acc[kBN / 2];
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.f;
  for (int ks = 0; ks < n_steps; ++ks) {
    const int s = ks % kStages;
    sm90::mbar_wait(bar_full(s), (ks / kStages) & 1);
    wgmma::fence_proxy_async_smem();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
    const uint32_t a_addr = sbase + s * kStageBytes + cw * 64 * 128, b_addr = sbase + s * kStageBytes + kATile;
    wgmma::fence_regs(acc);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)
      wgmma::m64n256k16_ss(acc, wgmma::desc_sw128_kmajor(a_addr + 32 * kk), wgmma::desc_sw128_kmajor(b_addr + 32 * kk),
                           1);
    wgmma::commit_group();
    wgmma::fence_regs(acc);
    wgmma::wait_group<1>();  // step ks - 1 retired: its slot goes back to the producer
    wgmma::fence_regs(acc);
    if (ks > 0) sm90::mbar_arrive(bar_empty((ks - 1) % kStages));
  }
  wgmma::wait_group<0>();
  wgmma::fence_regs(acc);

  // Epilogue (as moe_bf16_wg.cu): row = 64 cw + 16 wq + g + 8 h, accumulator column 8 j + 2 t (+1).
  wg_store_acc<kBN, kSwiglu>(acc, p.c, rb + r0, cw * 64 + wq * 16 + g, rows, N, fbase, t);
#endif
}

template <bool kSwiglu>
void launch(const Mxfp4GemmArgs& p, const bf16* wcopy, const int32_t* tile_offsets, int64_t max_tiles,
            cudaStream_t stream) {
  auto* kernel = moe_bf16_wg_ws_kernel<kSwiglu>;
  MX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)));
  const int n_wtiles = ceil_div(p.n, kSwiglu ? kBN / 2 : kBN);
  const int64_t blocks = max_tiles * n_wtiles;
  MX_CHECK_MSG(blocks < (int64_t{1} << 31), "moe_bf16_wg_ws: " << blocks << " blocks");
  kernel<<<dim3(static_cast<unsigned>(blocks)), kThreads, kSmem, stream>>>(p, wcopy, tile_offsets, n_wtiles);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace

void moe_bf16_wg_ws_gemm(bool swiglu, const Mxfp4GemmArgs& p, const bf16* wcopy, const int32_t* tile_offsets,
                         int64_t max_tiles, cudaStream_t stream) {
  if (max_tiles <= 0) return;
  if (swiglu) launch<true>(p, wcopy, tile_offsets, max_tiles, stream);
  else launch<false>(p, wcopy, tile_offsets, max_tiles, stream);
}

}  // namespace mxserve::kernels::cuda
