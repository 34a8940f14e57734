// Design 3 of the MXFP4 expert GEMMs (decode, tensor cores, split K): the same "swapped" mma.sync m16n8k16
// fragment layout as design 2 (moe_mxfp4_tc.cu: weights = operand A, 16 weight rows per warp, thread
// (g, t) owns weight bytes [16t, 16t+16) of each 128-wide k step; tokens = operand B, 8 per pass), but the
// block's W warps split K instead of taking different rows:
//   - warp w owns k steps [w*kSteps, (w+1)*kSteps) (W = ceil(K/128 / kSteps) <= 8, chosen at launch), and
//     issues ALL of its 16-byte weight loads for a 16-row tile (2 x kSteps per lane, + 2 x kSteps scale
//     bytes) before any math: kSteps x 32 bytes in flight per lane instead of design 2's ~2 steps.
//   - a block covers kRt row tiles (16 weight rows each); the loads of tile i+1 are issued before tile i's
//     dequant + MMAs (register double buffer), so the stream does not drain between tiles.
//   - the token rows are staged per warp (only the warp's own k slice: no block barrier) with cp.async,
//     issued after the weight loads so both are in flight together; the slice holds min(8, n_tokens) rows,
//     so at M = 1 it is one row (K/8 bytes per warp).
//   - the W partial 16x8 tiles are summed through shared memory (one __syncthreads per row tile, double-
//     buffered) and one warp (round robin) runs the epilogue (SwiGLU for gate_up, as in design 2).
// Why design 2 was slow at M = 1 (73.7 us for 73.6 MB, 24% of copy BW): each lane walked all of K with a
// prefetch distance of one k step (2 x 16 bytes in flight per lane), ~2.7 blocks x 4 warps per SM: the
// weight stream was latency-bound (K / 128 dependent round trips per lane: 32 for GLM-4.5-Air gate_up).
// Offered for decode-sized calls only (n_tokens <= 256): more than 8 rows of an expert re-stream its weights
// per pass of 8 (from L2 when they fit).
// The variants (dec_s{S}_r{R}[_o2]) are rows of moe_mxfp4_variants.h; this unit instantiates them from it.

#include <algorithm>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_epilogue.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_internal.h"
#include "kernels/cuda/moe_mxfp4/mxfp4_dequant.cuh"

namespace mxserve::kernels::cuda {
namespace {


__device__ __forceinline__ int swz16(int u) { return u ^ ((u >> 3) & 1); }


template <int kJ>
__device__ __forceinline__ void dec_mma_j(float (&acc)[4], const uint4& qa, const uint4& qb, const Mxfp4Factor& fa,
                                          const Mxfp4Factor& fb, const uint32_t (&xw)[4]) {
  uint32_t a[4];
  mxfp4_a_frag<kJ>(qa, qb, fa, fb, a);
  mma_bf16_m16n8k16(acc, a, xw[(kJ % 2) * 2], xw[(kJ % 2) * 2 + 1]);
}

// One lane's loads of a 16-row tile: 16 code bytes of rows g and g+8 per k step, and the E8M0 bytes as
// 32-bit words: word m of lane t holds blocks 4s .. 4s+3 (s = step0 + 4m + t) of its row, i.e. the scales
// of step s for all four lanes of the quad (shuffled out per step). 4 scale registers per 16 steps, not 32.
template <int kSteps>
struct WTile {
  static constexpr int kSw = (kSteps + 3) / 4;
  uint4 qa[kSteps], qb[kSteps];
  uint32_t sa[kSw], sb[kSw];
};

constexpr int kDecMaxWarps = 8;

// Register budget (ptxas -v, sm_90a): under a 128-register cap (2 blocks of 8 warps per SM) every
// instance spilled, so the kernel takes one 8-warp block per SM (<= 255 registers; ptxas then hoists the
// next tiles' loads itself: 168..232 registers, no spills). kSteps <= 4 double-buffers the row tiles
// explicitly (2 x 36 registers of loads); kSteps 8 (68 registers per tile) loads tile i+1 after tile i.
// In flight per SM at 8 warps: >= 8 x 4 KB of weights, the ~32 KB that 4.2 TB/s x ~1 us needs over 132 SMs.
// kOcc 2: the other trade, two 8-warp blocks per SM under a 128-register cap and no double buffer
// (tile i+1 is loaded after tile i's MMAs; the second block keeps the SM's loads in flight).
template <int kSteps, int kOcc>
constexpr bool kDecPrefetch = kSteps <= 4 && kOcc == 1;

template <int kSteps, int kRt, int kOcc, bool kSwiglu>
__global__ void __launch_bounds__(kDecMaxWarps * 32, kOcc) mxfp4_dec_kernel(Mxfp4GemmArgs p, int tile_rows) {
  constexpr int kFeat = kSwiglu ? 8 : 16;  // output features per row tile
  constexpr int kSlice = kSteps * 128;     // k columns per warp
  constexpr int kStride = kSlice + 16;     // smem row stride (bf16): 32 bytes apart mod 128
  constexpr int kUnits = kSlice / 8;       // 16-byte units per slice row
  extern __shared__ __align__(16) unsigned char smem[];
  const int nw = blockDim.x / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float* red = reinterpret_cast<float*>(smem);  // [2][nw][4][32]
  bf16* xs = reinterpret_cast<bf16*>(smem + 2 * nw * 4 * 32 * sizeof(float)) + warp * tile_rows * kStride;

  mxfp4_pdl_wait();
  // n_active and active[y] are independent loads (active has E + 1 slots): one round trip, not two.
  const bool direct = p.direct_ids != nullptr;
  if (direct && p.pair_row_out && blockIdx.x == 0 && blockIdx.y == 0)
    for (int i = threadIdx.x; i < p.max_active; i += blockDim.x) p.pair_row_out[i] = i;
  const int n_act = direct ? p.max_active : *p.n_active;
  const int e = direct ? p.direct_ids[blockIdx.y] : p.active[min(static_cast<int>(blockIdx.y), p.max_active - 1)];
  if (static_cast<int>(blockIdx.y) >= n_act) return;
  if (direct && (e < 0 || e >= p.n_experts)) __trap();  // a corrupt routing id is a bug: fail loudly
  const int K = p.k, N = p.n, n_blocks = K / 32, n_steps = (K + 127) / 128;
  const int64_t w_rows = kSwiglu ? 2ll * N : N;
  const int step0 = warp * kSteps;
  // 32-bit scale words need every row's scales 4-byte aligned: n_blocks % 4 == 0 and an aligned base.
  const bool scale_words = (n_blocks & 3) == 0 && (reinterpret_cast<uintptr_t>(p.ws) & 3) == 0;

  auto load_tile = [&](int rt, WTile<kSteps>& w) {
    const int nbase = (blockIdx.x * kRt + rt) * kFeat;
    const int feat_a = nbase + g, feat_b = kSwiglu ? nbase + g : nbase + g + 8;
    const bool ok_a = feat_a < N, ok_b = feat_b < N;
    const int64_t row_a = static_cast<int64_t>(e) * w_rows + feat_a;
    const int64_t row_b = static_cast<int64_t>(e) * w_rows + (kSwiglu ? N + feat_b : feat_b);
    const uint8_t* qa_p = p.wq + row_a * (K / 2);
    const uint8_t* qb_p = p.wq + row_b * (K / 2);
    const uint8_t* sa_p = p.ws + row_a * n_blocks;
    const uint8_t* sb_p = p.ws + row_b * n_blocks;
#pragma unroll
    for (int j = 0; j < kSteps; ++j) {
      const int blk = (step0 + j) * 4 + t;  // this lane's E8M0 block = its 16 code bytes
      w.qa[j] = w.qb[j] = make_uint4(0, 0, 0, 0);
      if (blk < n_blocks) {
        if (ok_a) w.qa[j] = __ldg(reinterpret_cast<const uint4*>(qa_p + 16 * blk));
        if (ok_b) w.qb[j] = __ldg(reinterpret_cast<const uint4*>(qb_p + 16 * blk));
      }
    }
#pragma unroll
    for (int m = 0; m < WTile<kSteps>::kSw; ++m) {
      const int s = step0 + 4 * m + t;
      w.sa[m] = w.sb[m] = 0x7F7F7F7Fu;
      if (4 * m + t < kSteps && s < n_steps) {
        if (scale_words) {  // n_blocks % 4 == 0: the word is aligned and inside the row
          if (ok_a) w.sa[m] = __ldg(reinterpret_cast<const uint32_t*>(sa_p + 4 * s));
          if (ok_b) w.sb[m] = __ldg(reinterpret_cast<const uint32_t*>(sb_p + 4 * s));
        } else {
          uint32_t va = 0, vb = 0;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const bool in = 4 * s + i < n_blocks;
            va |= (in && ok_a ? static_cast<uint32_t>(__ldg(sa_p + 4 * s + i)) : 127u) << (8 * i);
            vb |= (in && ok_b ? static_cast<uint32_t>(__ldg(sb_p + 4 * s + i)) : 127u) << (8 * i);
          }
          w.sa[m] = va;
          w.sb[m] = vb;
        }
      }
    }
  };

  constexpr bool kPf = kDecPrefetch<kSteps, kOcc>;
  WTile<kSteps> buf[kPf ? 2 : 1];
  load_tile(0, buf[0]);  // NOTE: issued before row_offsets is even read: only e is needed
  const int rb = direct ? static_cast<int>(blockIdx.y) : p.row_offsets[e];
  const int rows_total = direct ? 1 : p.row_offsets[e + 1] - rb;

  for (int r0 = 0; r0 < rows_total; r0 += tile_rows) {
    const int rows = min(tile_rows, rows_total - r0);
    if (r0 > 0) load_tile(0, buf[0]);
    // Stage x[rows][this warp's k slice] (cp.async, in flight together with the weight loads).
    __syncwarp();  // the previous pass's readers of this slice are done
    for (int i = lane; i < rows * kUnits; i += 32) {
      const int r = i / kUnits, u = i % kUnits;
      const int kcol = step0 * 128 + u * 8;
      if (kcol < K) {
        const int64_t src = kSwiglu ? (direct ? 0 : p.row_token[rb + r0 + r]) : rb + r0 + r;
        cp_async_cg16(xs + r * kStride + swz16(u) * 8, p.a + src * K + kcol);
      }
    }
    cp_async_wait_all();
    __syncwarp();

    // NOTE: without the double buffer the row-tile loop stays rolled: unrolled, ptxas hoists every tile's
    // 64-bit addresses out of the pass loop (~8 registers per tile) and the 128-register cap spills.
#pragma unroll(kPf ? kRt : 1)
    for (int rt = 0; rt < kRt; ++rt) {
      if constexpr (kPf) {
        if (rt + 1 < kRt) load_tile(rt + 1, buf[(rt + 1) & 1]);
      } else {
        if (rt > 0) load_tile(rt, buf[0]);
      }
      const WTile<kSteps>& w = buf[kPf ? (rt & 1) : 0];
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < kSteps; ++j) {
        if (step0 + j >= n_steps) break;  // warp-uniform
        // NOTE: keeps ptxas from hoisting later steps' shared loads (and their dequant) above this step's
        // MMAs, which pushed the kernel past 200 registers.
        asm volatile("" ::: "memory");
        const bool kin = (step0 + j) * 4 + t < n_blocks;
        // The quad's scale word of step j sits in lane (g, j % 4), word j / 4; this lane's block is byte t.
        const int src = (lane & ~3) | (j & 3);
        const uint32_t wa = __shfl_sync(0xffffffffu, w.sa[j / 4], src), wb = __shfl_sync(0xffffffffu, w.sb[j / 4], src);
        const Mxfp4Factor fa = mxfp4_factor((wa >> (8 * t)) & 0xFFu), fb = mxfp4_factor((wb >> (8 * t)) & 0xFFu);
        const bool xin = g < rows && kin;
        const bf16* xr = xs + g * kStride;
        // x unit q (8 elements) feeds MMAs 2q and 2q+1.
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint32_t xw[4] = {0, 0, 0, 0};
          if (xin) {
            const uint4 v = *reinterpret_cast<const uint4*>(xr + swz16(16 * j + 4 * t + q) * 8);
            xw[0] = v.x;
            xw[1] = v.y;
            xw[2] = v.z;
            xw[3] = v.w;
          }
          if (q == 0) { dec_mma_j<0>(acc, w.qa[j], w.qb[j], fa, fb, xw); dec_mma_j<1>(acc, w.qa[j], w.qb[j], fa, fb, xw); }
          if (q == 1) { dec_mma_j<2>(acc, w.qa[j], w.qb[j], fa, fb, xw); dec_mma_j<3>(acc, w.qa[j], w.qb[j], fa, fb, xw); }
          if (q == 2) { dec_mma_j<4>(acc, w.qa[j], w.qb[j], fa, fb, xw); dec_mma_j<5>(acc, w.qa[j], w.qb[j], fa, fb, xw); }
          if (q == 3) { dec_mma_j<6>(acc, w.qa[j], w.qb[j], fa, fb, xw); dec_mma_j<7>(acc, w.qa[j], w.qb[j], fa, fb, xw); }
        }
      }
      // Split-K sum over the block's warps, then the epilogue on one warp.
      float* rd = red + (rt & 1) * nw * 128;
#pragma unroll
      for (int i = 0; i < 4; ++i) rd[(warp * 4 + i) * 32 + lane] = acc[i];
      __syncthreads();
      if (warp == rt % nw) {
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        for (int w2 = 0; w2 < nw; ++w2)
#pragma unroll
          for (int i = 0; i < 4; ++i) c[i] += rd[(w2 * 4 + i) * 32 + lane];
        const int nbase = (blockIdx.x * kRt + rt) * kFeat;
        const int feat_a = nbase + g, feat_b = kSwiglu ? nbase + g : nbase + g + 8;
        mxfp4_store_tile<kSwiglu>(c, p.c, rb + r0, 0, rows, N, feat_a, feat_b, t);
      }
    }
    // NOTE: red[] is double-buffered by row tile; the next pass's first write to red[0] comes after this
    // pass's last __syncthreads, which every reader of red[0] passed after reading (kRt >= 2), or, for
    // kRt == 1, needs this barrier.
    if (kRt == 1) __syncthreads();
  }
}

template <int kSteps, int kRt, int kOcc, bool kSwiglu>
void launch_dec(const Mxfp4GemmArgs& a, cudaStream_t stream) {
  const int n_steps = (a.k + 127) / 128;
  const int nw = std::max(1, std::min(kDecMaxWarps, (n_steps + kSteps - 1) / kSteps));
  const int tile_rows = static_cast<int>(std::clamp<int64_t>(a.n_tokens, 1, 8));
  const size_t smem = sizeof(float) * 2 * nw * 128 + sizeof(bf16) * nw * tile_rows * (kSteps * 128 + 16);
  auto* kernel = mxfp4_dec_kernel<kSteps, kRt, kOcc, kSwiglu>;
  if (smem > 48 * 1024)  // NOTE: opt-in above 48 KB of dynamic shared memory
    MX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  constexpr int kFeatPerBlock = kRt * (kSwiglu ? 8 : 16);
  const dim3 grid(ceil_div(a.n, kFeatPerBlock), a.max_active);
  mxfp4_launch_pdl(kernel, grid, dim3(nw * 32), smem, stream, a, tile_rows);
}

template <int kSteps, int kRt, int kOcc>
struct DecLaunch {
  static void run(bool swiglu, const Mxfp4GemmArgs& a, cudaStream_t stream) {
    if (swiglu) launch_dec<kSteps, kRt, kOcc, true>(a, stream);
    else launch_dec<kSteps, kRt, kOcc, false>(a, stream);
  }
};

}  // namespace

const Mxfp4Launchers& mxfp4_dec_launchers() {
  static constexpr Mxfp4Launchers kLaunchers = mxfp4_design_launchers<MoeMxfp4Design::kDec, DecLaunch>();
  return kLaunchers;
}

}  // namespace mxserve::kernels::cuda
