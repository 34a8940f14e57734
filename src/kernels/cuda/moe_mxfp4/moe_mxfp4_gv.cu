// Design 5 of the MXFP4 expert GEMMs (decode GEMV, tensor cores): one warp streams one 16-row weight tile
// over ALL of K, with kDepth 128-wide k steps of codes + scales in flight in a register ring, and no block
// barrier, shared memory or split-K reduction anywhere in the main loop.
//
// Why (ncu on the H200, docs/perf/moe-mxfp4.md): designs 2 and 3 issue ~5.7 instructions per weight at
// M = 1 (x addresses recomputed per MMA, the rare two-step scale multiply predicated on every pair, split-K
// reduction), so at 43-60% issue-slot use they read only 23-35% of DRAM bandwidth. Here, per 16x16 MMA of
// weights a lane runs 4 x (PRMT, SHF, 2 LOP3, HMUL2) + 1 HMMA + 1/2 x load, ~2.6 instructions per weight, and
// the scale's two-step form (E8M0 > 128, |w| >= 256: no real checkpoint) runs only on a warp vote. What
// limits it now (ncu + the bench's limit probe): that instruction stream takes as long as the weight stream.
//
// Fragments are design 2's (moe_mxfp4_tc.cu): weights are the MMA's A operand (rows g and g+8 of the tile),
// lane (g, t) owns the E8M0 block 4s + t of k step s (16 code bytes per row), and the k order inside an MMA
// is permuted to match, so token x values are read in the same permuted order (8 bytes per MMA); tokens are
// the B operand (n = 8: up to 8 rows of the expert per pass, lane g serves row g). x comes straight from
// global memory through L1 (it is tiny and shared by every warp of an expert) at the start of each step.
//
//   mxfp4_gv_kernel<kWarps, kDepth, kSplit, kSwiglu, kProbe>  grid (ceil(tiles / kWarps), active experts),
//       kWarps x kSplit warps: warp w of block x takes tile x * kWarps + w of expert active[y] (gate_up: 8
//       features = gate rows g and up rows g of the same feature, SwiGLU in registers; down: 16 output
//       features), kSplit 2 halves K between two warps; kProbe != 0 only for `bench-kernels moe --probe`.
//   mxfp4_gv_combine_kernel<8, kDepth>   one token (direct mode), down GEMM fused with the weighted
//       un-permute: block = 16 output features, warp w takes experts w, w + 8, ..., scales by the
//       routing weight in fp32, the warps sum through shared memory, and out[0] += the sum (no y buffer,
//       no un-permute launch).
// Launch order at M = 1: gate_up (waits for the router, then lets the down kernel launch at once), down
// (reads its expert ids, which the router wrote, and issues its first weight loads BEFORE waiting for
// gate_up), so the two weight streams overlap instead of draining between kernels.
#include <algorithm>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_epilogue.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_internal.h"
#include "kernels/cuda/moe_mxfp4/mxfp4_dequant.cuh"
#include "kernels/cuda/moe_mxfp4/mxfp4_row_stream.cuh"

namespace mxserve::kernels::cuda {
namespace {

// Lets the next programmatic-dependent kernel launch now (its griddepcontrol.wait still waits for this
// whole grid). Called only after this grid's own wait, so everything ITS predecessors wrote is complete.
__device__ __forceinline__ void gv_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The weights are streamed once (common/ld_stream.cuh: no L1 allocation, x keeps L1; an L2 miss brings the
// row's whole 256-byte segment, this lane quad's next 3 k steps of the row; a tile's 16 rows are 16 separate
// streams, each step 1 KB apart in time).
// One k step of one lane (GvStep) and the lane's view of one 16-row tile of one expert (GvTile: row pointers
// and the step count): mxfp4_row_stream.cuh.
using GvStep = Mxfp4RowStep;
using GvTile = Mxfp4RowStream;

// row_a, row_b: absolute weight rows ([E * rows] flattened) of the lane's rows g and g+8.
__device__ __forceinline__ GvTile gv_tile(const Mxfp4GemmArgs& p, int64_t row_a, int64_t row_b, int t) {
  GvTile tl;
  const int kb = p.k / 32;
  tl.qa = p.wq + row_a * (p.k / 2) + 16 * t;
  tl.qb = p.wq + row_b * (p.k / 2) + 16 * t;
  tl.sa = reinterpret_cast<const uint32_t*>(p.ws + row_a * kb);
  tl.sb = reinterpret_cast<const uint32_t*>(p.ws + row_b * kb);
  tl.n_steps = p.k / 128;
  return tl;
}

// x of one lane for one step: 32 bf16 of its token row at k = 32 (4s + t) .. +32 (64 bytes), or zeros.
struct GvX {
  uint4 v[4];
};
__device__ __forceinline__ GvX gv_load_x(const bf16* xrow, int s, int t) {
  GvX x;
  if (xrow) {
    const uint4* p = reinterpret_cast<const uint4*>(xrow + 32 * (4 * s + t));
#pragma unroll
    for (int q = 0; q < 4; ++q) x.v[q] = __ldg(p + q);
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) x.v[q] = make_uint4(0, 0, 0, 0);
  }
  return x;
}

// Probe 2's stand-in for a weight load: codes made in registers (no memory), scale 2^0.
__device__ __forceinline__ int t_of_lane() { return (threadIdx.x % 32) % 4; }
__device__ __forceinline__ GvStep gv_fake_step(int s, int t) {
  const uint32_t c = 0x9E3779B9u * static_cast<uint32_t>(s * 4 + t + 1);
  GvStep w;
  w.qa = make_uint4(c, c ^ 0x5555u, c + 7u, ~c);
  w.qb = make_uint4(c ^ 0xAAAAu, c + 3u, c * 5u, c >> 3);
  w.sa = w.sb = 0x7F7F7F7Fu;
  return w;
}

__device__ __forceinline__ uint32_t gv_word(const uint4& q, int i) {
  return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
}

// 8 MMAs of one k step. Factor bits: fa/fb = 2^(s-1) as bf16x2 (kTwoStep: 2^126 then 2^(s-127), see
// mxfp4_dequant.cuh). MMA jj takes bytes 2jj (k slots 2t, 2t+1) and 2jj+1 (2t+8, 2t+9) of each row's 16
// bytes, i.e. x elements 4jj .. 4jj+3 of the lane's 32 (x.v[jj / 2], half jj % 2).
template <bool kTwoStep>
__device__ __forceinline__ void gv_mma_step(float (&acc)[4], const GvStep& w, const GvX& x, const Mxfp4Factor& fa,
                                            const Mxfp4Factor& fb) {
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) {
    const uint32_t ca = gv_word(w.qa, wi), cb = gv_word(w.qb, wi);
    const uint32_t ca4 = ca << 4, cb4 = cb << 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // MMA jj = 2 wi + h: bytes 2h, 2h+1 of word wi
      uint32_t a[4];
      mxfp4_a_frag_word<kTwoStep>(ca, ca4, cb, cb4, h, fa, fb, a);
      // x elements 8 wi + 4h .. +4 of the lane's 32: uint4 v[wi], words 2h, 2h+1.
      const uint4& xv = x.v[wi];
      mma_bf16_m16n8k16(acc, a, h == 0 ? xv.x : xv.z, h == 0 ? xv.y : xv.w);
    }
  }
}

// One k step's math: the scale factors (the two-step form only on a warp vote), dequant and 8 MMAs.
__device__ __forceinline__ void gv_compute_step(float (&acc)[4], const GvStep& w, const GvX& xs, int t) {
  const uint32_t ea = (w.sa >> (8 * t)) & 0xFFu, eb = (w.sb >> (8 * t)) & 0xFFu;
  if (__any_sync(0xffffffffu, ea > 128u || eb > 128u)) {
    gv_mma_step<true>(acc, w, xs, mxfp4_factor(ea), mxfp4_factor(eb));
  } else {
    Mxfp4Factor fa, fb;  // 2^(s-1): exponent field s + 126, a bf16 normal for every s <= 128
    const uint32_t ha = (ea + 126u) << 7, hb = (eb + 126u) << 7;
    fa.f1 = ha | (ha << 16);
    fb.f1 = hb | (hb << 16);
    fa.f2 = fb.f2 = 0;
    fa.two_step = fb.two_step = false;
    gv_mma_step<false>(acc, w, xs, fa, fb);
  }
}

// Streams one tile over all of K: ring[] holds steps 0 .. kDepth-1 on entry (issued by the caller, so they
// can be in flight before a dependency wait); xrow is this lane's token row (nullptr: no token, zeros).
// x is loaded at the start of each step (L1 hits after the first warp of an SM touched the line).
// Refill order (measured, docs/perf/moe-mxfp4.md): kDepth 4 refills step s's slot BEFORE its MMAs (kDepth
// steps in flight; the new load takes other registers while the old are live, ~10 more registers), kDepth
// 8 after them (7 in flight, and the ring stays in place: the other order needs ~190 registers).
// kProbe (bench-kernels moe --probe only): 1 = the weight and x loads alone (folded into acc so they are
// not dead), 2 = dequant + MMAs on register-made codes (no weight loads).
template <int kDepth, int kProbe = 0>
__device__ __forceinline__ void gv_run(float (&acc)[4], const GvTile& tl, GvStep (&ring)[kDepth], const bf16* xrow,
                                       int t) {
  constexpr bool kRefillFirst = kDepth <= 4;
  const int n = tl.n_steps;
  for (int s0 = 0; s0 < n; s0 += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int s = s0 + d;
      if (s < n) {  // warp-uniform
        GvStep w = ring[d];
        if (kRefillFirst && s + kDepth < n) ring[d] = kProbe == 2 ? gv_fake_step(s + kDepth, t) : tl.load(s + kDepth);
        const GvX xs = gv_load_x(xrow, s, t);
        if constexpr (kProbe == 1) {
          const uint32_t v = w.qa.x ^ w.qa.y ^ w.qa.z ^ w.qa.w ^ w.qb.x ^ w.qb.y ^ w.qb.z ^ w.qb.w ^ w.sa ^ w.sb ^
                             xs.v[0].x ^ xs.v[1].y ^ xs.v[2].z ^ xs.v[3].w;
          acc[0] += __uint_as_float(v & 0x3FFFFFFFu);
          if (!kRefillFirst && s + kDepth < n) ring[d] = tl.load(s + kDepth);
          continue;
        }
        gv_compute_step(acc, w, xs, t);
        if (!kRefillFirst && s + kDepth < n) ring[d] = kProbe == 2 ? gv_fake_step(s + kDepth, t) : tl.load(s + kDepth);
      }
    }
  }
}

template <int kDepth, int kProbe = 0>
__device__ __forceinline__ void gv_prefetch(const GvTile& tl, GvStep (&ring)[kDepth]) {
#pragma unroll
  for (int d = 0; d < kDepth; ++d)
    if (d < tl.n_steps) ring[d] = kProbe == 2 ? gv_fake_step(d, t_of_lane()) : tl.load(d);
}

constexpr int kGvMaxRows = 8;  // token rows of an expert per pass (the MMA's n)
constexpr int kGvCombineWarps = 8;
// Occupancy floor: kDepth 4 -> 16 warps per SM (<= 128 registers: 4 per scheduler to cover the dequant's
// dependent chains and the L1 latency of x; 16 x 4 KB of weights in flight per SM); kDepth 8 spills under
// that cap, so it takes 8 warps per SM (8 x 8 KB in flight).
template <int kDepth>
constexpr int kGvWarpsPerSm = kDepth <= 4 ? 16 : 8;

// kSplit 2: two warps per tile, each half of the k steps (twice the warps and bytes in flight when the
// tiles alone leave SMs short of warps, e.g. one token: 1408 tiles for GLM-4.5-Air's gate_up over 132 SMs);
// the second half's partial sums pass through shared memory.
template <int kWarps, int kDepth, int kSplit, bool kSwiglu, int kProbe = 0>
__global__ void __launch_bounds__(kWarps * kSplit * 32, kGvWarpsPerSm<kDepth> / (kWarps * kSplit))
    mxfp4_gv_kernel(Mxfp4GemmArgs p) {
  constexpr int kFeat = kSwiglu ? 8 : 16;  // output features per tile
  __shared__ float red[kSplit > 1 ? kWarps : 1][4][32];
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int warp = (threadIdx.x / 32) % kWarps, half = threadIdx.x / 32 / kWarps;
  const bool direct = p.direct_ids != nullptr;
  // gate_up reads the permutation (or, direct, the router's ids) -> wait first, then free the down kernel
  // to launch. down only needs expert ids (permute/router output, complete before gate_up passed its
  // wait): it issues its first weight loads, then waits for gate_up's act.
  if (kSwiglu) {
    mxfp4_pdl_wait();
    gv_launch_dependents();
    if (direct && p.pair_row_out && blockIdx.x == 0 && blockIdx.y == 0)
      for (int i = threadIdx.x; i < p.max_active; i += blockDim.x) p.pair_row_out[i] = i;
  }
  const int y = blockIdx.y;
  const int n_act = direct ? p.max_active : *p.n_active;
  if (y >= n_act) {
    if (!kSwiglu) mxfp4_pdl_wait();  // NOTE: every block waits, so none exits while gate_up still runs
    return;
  }
  const int e = direct ? p.direct_ids[y] : p.active[y];
  if (direct && (e < 0 || e >= p.n_experts)) __trap();  // a corrupt routing id is a bug: fail loudly
  const int N = p.n;
  const int tile = blockIdx.x * kWarps + warp;
  const int f0 = tile * kFeat;
  const int64_t w_rows = kSwiglu ? 2ll * N : N;
  // Rows past N read row 0 of the expert (valid memory; MMA rows are independent) and are not stored.
  const int fa = f0 + g, fb = kSwiglu ? f0 + g : f0 + g + 8;
  const int64_t row_a = static_cast<int64_t>(e) * w_rows + (fa < N ? fa : 0);
  const int64_t row_b = static_cast<int64_t>(e) * w_rows + (fb < N ? (kSwiglu ? N + fb : fb) : 0);
  GvTile tl = gv_tile(p, row_a, row_b, t);
  const int s_begin = half * ((tl.n_steps + kSplit - 1) / kSplit);
  tl.qa += 64 * s_begin;
  tl.qb += 64 * s_begin;
  tl.sa += s_begin;
  tl.sb += s_begin;
  tl.n_steps = max(0, min(tl.n_steps - s_begin, (tl.n_steps + kSplit - 1) / kSplit));
  GvStep ring[kDepth];
  const bool live = f0 < N;  // warp-uniform; NOTE: with kSplit 2 a dead warp still meets the barriers
  if (live) gv_prefetch<kDepth, kProbe>(tl, ring);
  if (!kSwiglu) {
    mxfp4_pdl_wait();
    gv_launch_dependents();
  }
  if (!live && kSplit == 1) return;
  const int rb = direct ? y : p.row_offsets[e];
  const int rows_total = direct ? 1 : p.row_offsets[e + 1] - rb;
  for (int r0 = 0; r0 < rows_total; r0 += kGvMaxRows) {
    const int rows = min(kGvMaxRows, rows_total - r0);
    if (r0 > 0 && live) gv_prefetch<kDepth, kProbe>(tl, ring);
    const bf16* xrow = nullptr;
    if (g < rows) {
      const int64_t src = kSwiglu ? (direct ? 0 : p.row_token[rb + r0 + g]) : rb + r0 + g;
      xrow = p.a + src * p.k + 128 * s_begin;
    }
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (live) gv_run<kDepth, kProbe>(acc, tl, ring, xrow, t);
    if constexpr (kSplit > 1) {
      if (half == 1)
#pragma unroll
        for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
      __syncthreads();
      if (half == 1 || !live) {
        __syncthreads();  // the pass's partials are read before the next pass writes them
        continue;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] += red[warp][i][lane];
    }
    mxfp4_store_tile<kSwiglu>(acc, p.c, rb + r0, 0, rows, N, fa, fb, t);
    if constexpr (kSplit > 1) __syncthreads();
  }
}

// Direct mode (one token) down GEMM + weighted un-permute: out[0][f] += sum_k w_k (down_{ids[k]} act[k])[f].
template <int kWarps, int kDepth>
__global__ void __launch_bounds__(kWarps * 32, kGvWarpsPerSm<kDepth> / kWarps) mxfp4_gv_combine_kernel(Mxfp4GemmArgs p) {
  __shared__ float red[kWarps][4][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int N = p.n, top_k = p.max_active;
  const int f0 = blockIdx.x * 16;
  const int fa = f0 + g, fb = f0 + g + 8;
  float sum[4] = {0.f, 0.f, 0.f, 0.f};
  GvStep ring[kDepth];
  bool waited = false;
  for (int k = warp; k < top_k; k += kWarps) {
    const int e = p.direct_ids[k];
    if (e < 0 || e >= p.n_experts) __trap();
    const int64_t base = static_cast<int64_t>(e) * N;
    const GvTile tl = gv_tile(p, base + (fa < N ? fa : 0), base + (fb < N ? fb : 0), t);
    gv_prefetch(tl, ring);
    if (!waited) {  // first expert's loads are in flight: now wait for gate_up's act
      mxfp4_pdl_wait();
      gv_launch_dependents();
      waited = true;
    }
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    gv_run(acc, tl, ring, g == 0 ? p.a + static_cast<int64_t>(k) * p.k : nullptr, t);
    const float wk = p.combine_weights[k];
#pragma unroll
    for (int i = 0; i < 4; ++i) sum[i] += wk * acc[i];
  }
  if (!waited) mxfp4_pdl_wait();
#pragma unroll
  for (int i = 0; i < 4; ++i) red[warp][i][lane] = sum[i];
  __syncthreads();
  if (warp == 0 && t == 0) {  // token 0 = column 0: c0 (row g) and c2 (row g+8) of lanes t == 0
    float ca = 0.f, cb = 0.f;
#pragma unroll
    for (int w2 = 0; w2 < kWarps; ++w2) {
      ca += red[w2][0][lane];
      cb += red[w2][2][lane];
    }
    if (fa < N) p.combine_out[fa] = to_bf16(to_f32(p.combine_out[fa]) + ca);
    if (fb < N) p.combine_out[fb] = to_bf16(to_f32(p.combine_out[fb]) + cb);
  }
}

template <int kWarps, int kDepth, int kSplit>
void launch_gv(bool swiglu, const Mxfp4GemmArgs& a, cudaStream_t stream) {
  MX_CHECK_MSG(a.k % 128 == 0, "mxfp4 gv: K " << a.k << " must be a multiple of 128");
  // The kernel's 16-byte code / x loads and 4-byte scale-word loads would fault on these (K % 128 == 0 keeps
  // every row aligned once the bases are): say which pointer instead.
  MX_CHECK_MSG(reinterpret_cast<uintptr_t>(a.wq) % 16 == 0 && reinterpret_cast<uintptr_t>(a.a) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.ws) % 4 == 0,
               "mxfp4 gv: misaligned pointer (codes " << static_cast<const void*>(a.wq) << " and activations "
                                                       << static_cast<const void*>(a.a) << " need 16 bytes, scales "
                                                       << static_cast<const void*>(a.ws) << " 4 bytes)");
  if (!swiglu && a.combine_out != nullptr) {
    MX_CHECK_MSG(a.direct_ids != nullptr && a.n_tokens == 1, "mxfp4 gv: the fused combine needs one token");
    // One warp per expert slot (top_k <= 8: all of a row tile's experts stream at once), whatever kWarps.
    mxfp4_launch_pdl(mxfp4_gv_combine_kernel<kGvCombineWarps, kDepth>, dim3(ceil_div(a.n, 16)),
                     dim3(kGvCombineWarps * 32), 0, stream, a);
    return;
  }
  const int feat = swiglu ? 8 : 16;
  const int tiles = ceil_div(a.n, feat);
  const dim3 grid(ceil_div(tiles, kWarps), a.max_active), block(kWarps * kSplit * 32);
  if (swiglu && a.gv_probe == 1)
    mxfp4_launch_pdl(mxfp4_gv_kernel<kWarps, kDepth, kSplit, true, 1>, grid, block, 0, stream, a);
  else if (swiglu && a.gv_probe == 2)
    mxfp4_launch_pdl(mxfp4_gv_kernel<kWarps, kDepth, kSplit, true, 2>, grid, block, 0, stream, a);
  else if (swiglu) mxfp4_launch_pdl(mxfp4_gv_kernel<kWarps, kDepth, kSplit, true>, grid, block, 0, stream, a);
  else mxfp4_launch_pdl(mxfp4_gv_kernel<kWarps, kDepth, kSplit, false>, grid, block, 0, stream, a);
}

template <int kWarps, int kDepth, int kSplit>
struct GvLaunch {
  static void run(bool swiglu, const Mxfp4GemmArgs& a, cudaStream_t stream) {
    launch_gv<kWarps, kDepth, kSplit>(swiglu, a, stream);
  }
};
}  // namespace

const Mxfp4Launchers& mxfp4_gv_launchers() {
  static constexpr Mxfp4Launchers kLaunchers = mxfp4_design_launchers<MoeMxfp4Design::kGv, GvLaunch>();
  return kLaunchers;
}

}  // namespace mxserve::kernels::cuda
