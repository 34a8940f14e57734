// Design 2 of the MXFP4 expert GEMMs (tensor cores): "swapped" mma.sync m16n8k16 (bf16 in, fp32 acc) with
// the WEIGHTS as the A operand (M = 16 weight rows per warp) and the expert's tokens as B (N = 8 per
// n-tile, kTokens per pass). Weights go global -> registers (16-byte loads, no shared memory), are
// dequantized in registers (mxfp4_dequant.cuh) and fed to the MMA; the pass's token rows sit in shared
// memory, KC columns at a time. A block = kWarps warps over adjacent weight rows of one active expert.
//
// K permutation (exact: a dot product does not care about k order, A and B use the same one): for each
// 128-wide k step, thread (g = lane/4, t = lane%4) owns weight bytes [16t, 16t+16) of its rows (elements
// [32t, 32t+32), one E8M0 block), and MMA step j (0..7) takes its bytes 2j (A regs 0/1) and 2j+1 (regs
// 2/3), i.e. physical k 32t+4j+{0,1} and 32t+4j+{2,3}. B then needs x[token][32t .. 32t+32), contiguous.
// SwiGLU (gate_up): MMA rows 0-7 are gate rows n..n+7 and rows 8-15 the up rows of the same features,
// so each thread holds gate and up of the same (feature, token) in c0/c2 and c1/c3.
// Shared x tile [kTokens][KC + 16] bf16: 16-byte units swizzled u ^ ((u >> 3) & 1) and rows 32 bytes
// apart mod 128, so the four 16-byte loads of a quad's 8 lanes hit 8 distinct bank groups.
#include <algorithm>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_epilogue.cuh"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_internal.h"
#include "kernels/cuda/moe_mxfp4/mxfp4_dequant.cuh"

namespace mxserve::kernels::cuda {
namespace {


__device__ __forceinline__ int swz(int u) { return u ^ ((u >> 3) & 1); }

// The 8 MMA A-fragments of one 128-wide k step from 16 packed bytes of row g (qa) and row g+8 (qb).
__device__ __forceinline__ void dequant_step(const uint4& qa, const uint4& qb, const Mxfp4Factor& fa,
                                             const Mxfp4Factor& fb, uint32_t (&a)[8][4]) {
  const uint32_t wa[4] = {qa.x, qa.y, qa.z, qa.w}, wb[4] = {qb.x, qb.y, qb.z, qb.w};
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) {  // word wi = bytes 4wi..4wi+3 = steps 2wi (bytes 0,1), 2wi+1 (bytes 2,3)
    const uint32_t x = wa[wi], x4 = x << 4, y = wb[wi], y4 = y << 4;
    a[2 * wi][0] = mxfp4_apply(e2m1_pair_raw<0>(x, x4), fa);
    a[2 * wi][2] = mxfp4_apply(e2m1_pair_raw<1>(x, x4), fa);
    a[2 * wi + 1][0] = mxfp4_apply(e2m1_pair_raw<2>(x, x4), fa);
    a[2 * wi + 1][2] = mxfp4_apply(e2m1_pair_raw<3>(x, x4), fa);
    a[2 * wi][1] = mxfp4_apply(e2m1_pair_raw<0>(y, y4), fb);
    a[2 * wi][3] = mxfp4_apply(e2m1_pair_raw<1>(y, y4), fb);
    a[2 * wi + 1][1] = mxfp4_apply(e2m1_pair_raw<2>(y, y4), fb);
    a[2 * wi + 1][3] = mxfp4_apply(e2m1_pair_raw<3>(y, y4), fb);
  }
}

template <int kWarps, int kTokens, bool kSwiglu>
__global__ void __launch_bounds__(kWarps * 32) mxfp4_tc_kernel(Mxfp4GemmArgs p, int kc) {
  constexpr int kNt = kTokens / 8;
  constexpr int kFeat = kSwiglu ? 8 : 16;  // output features per warp
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* xs = reinterpret_cast<bf16*>(smem);  // [kTokens][kc + 16], swizzled 16-byte units
  const int stride = kc + 16;
  mxfp4_pdl_wait();
  if (static_cast<int>(blockIdx.y) >= *p.n_active) return;
  const int e = p.active[blockIdx.y];
  const int rb = p.row_offsets[e], rows_total = p.row_offsets[e + 1] - rb;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int K = p.k, N = p.n, n_blocks = K / 32;
  const int nbase = (blockIdx.x * kWarps + warp) * kFeat;
  const int64_t w_rows = kSwiglu ? 2ll * N : N;
  const int feat_a = nbase + g, feat_b = kSwiglu ? nbase + g : nbase + g + 8;
  const bool ok_a = feat_a < N, ok_b = feat_b < N;
  const int64_t row_a = static_cast<int64_t>(e) * w_rows + feat_a;
  const int64_t row_b = static_cast<int64_t>(e) * w_rows + (kSwiglu ? N + feat_b : feat_b);
  const uint8_t* qa_p = p.wq + row_a * (K / 2) + 16 * t;
  const uint8_t* qb_p = p.wq + row_b * (K / 2) + 16 * t;
  const uint8_t* sa_p = p.ws + row_a * n_blocks + t;
  const uint8_t* sb_p = p.ws + row_b * n_blocks + t;

  for (int r0 = 0; r0 < rows_total; r0 += kTokens) {
    const int rows = min(kTokens, rows_total - r0);
    float acc[kNt][4];
#pragma unroll
    for (int i = 0; i < kNt; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    for (int k0 = 0; k0 < K; k0 += kc) {
      const int klen = min(kc, K - k0), units = klen / 8;
      __syncthreads();  // the previous chunk's readers are done with xs
      for (int i = threadIdx.x; i < rows * units; i += blockDim.x) {
        const int r = i / units, u = i % units;
        const int64_t src = kSwiglu ? p.row_token[rb + r0 + r] : rb + r0 + r;
        *reinterpret_cast<uint4*>(xs + r * stride + swz(u) * 8) =
            *reinterpret_cast<const uint4*>(p.a + src * K + k0 + u * 8);
      }
      __syncthreads();
      // This thread's 16 code bytes + E8M0 byte of rows g and g+8 for the k step at kk (zeros past K or N).
      auto load_w = [&](int kk, uint4& qa, uint4& qb, uint32_t& sa, uint32_t& sb) {
        qa = qb = make_uint4(0, 0, 0, 0);
        sa = sb = 127;
        if ((k0 + kk) / 32 + t >= n_blocks) return;
        if (ok_a) {
          qa = __ldg(reinterpret_cast<const uint4*>(qa_p + (k0 + kk) / 2));
          sa = __ldg(sa_p + (k0 + kk) / 32);
        }
        if (ok_b) {
          qb = __ldg(reinterpret_cast<const uint4*>(qb_p + (k0 + kk) / 2));
          sb = __ldg(sb_p + (k0 + kk) / 32);
        }
      };
      // NOTE: the next step's weights are requested before this step's dequant + MMAs (software prefetch,
      // distance 1) so two steps of 16-byte loads are in flight per lane (decode is latency x bytes bound).
      uint4 qa, qb;
      uint32_t sa, sb;
      load_w(0, qa, qb, sa, sb);
#pragma unroll 2
      for (int kk = 0; kk < klen; kk += 128) {
        const bool kin = (k0 + kk) / 32 + t < n_blocks;
        uint4 na = make_uint4(0, 0, 0, 0), nb = make_uint4(0, 0, 0, 0);
        uint32_t nsa = 127, nsb = 127;
        if (kk + 128 < klen) load_w(kk + 128, na, nb, nsa, nsb);
        uint32_t a[8][4];
        dequant_step(qa, qb, mxfp4_factor(sa), mxfp4_factor(sb), a);
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
          const int tok = nt * 8 + g;
          uint32_t xw[16];
          if (tok < rows && kin) {
            const bf16* xr = xs + tok * stride;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const uint4 v = *reinterpret_cast<const uint4*>(xr + swz(kk / 8 + 4 * t + q) * 8);
              xw[4 * q] = v.x;
              xw[4 * q + 1] = v.y;
              xw[4 * q + 2] = v.z;
              xw[4 * q + 3] = v.w;
            }
          } else {
#pragma unroll
            for (int i = 0; i < 16; ++i) xw[i] = 0;
          }
#pragma unroll
          for (int j = 0; j < 8; ++j) mma_bf16_m16n8k16(acc[nt], a[j], xw[2 * j], xw[2 * j + 1]);
        }
        qa = na;
        qb = nb;
        sa = nsa;
        sb = nsb;
      }
    }
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) mxfp4_store_tile<kSwiglu>(acc[nt], p.c, rb + r0, nt * 8, rows, N, feat_a, feat_b, t);
  }
}

template <int kWarps, int kTokens, bool kSwiglu>
void launch(const Mxfp4GemmArgs& a, cudaStream_t stream) {
  // KC: as many k columns as fit a 64 KB shared-memory budget, a multiple of 128, no more than K rounded up.
  // NOTE: at T 8 this is all of K = 4096 (GLM-4.5-Air gate_up): one barrier pair per pass, so the weight
  // stream of a decode step never drains at a chunk boundary; 3 blocks per SM is more than decode fills.
  constexpr int budget = 64 * 1024;
  const int k_up = (a.k + 127) / 128 * 128;
  const int kc = std::min(k_up, std::max(128, budget / (2 * kTokens) / 128 * 128));
  const size_t smem = sizeof(bf16) * kTokens * (kc + 16);
  auto* kernel = mxfp4_tc_kernel<kWarps, kTokens, kSwiglu>;
  if (smem > 48 * 1024)  // NOTE: opt-in above 48 KB of dynamic shared memory
    MX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  constexpr int kFeatPerBlock = kWarps * (kSwiglu ? 8 : 16);
  const dim3 grid(ceil_div(a.n, kFeatPerBlock), a.max_active);
  mxfp4_launch_pdl(kernel, grid, dim3(kWarps * 32), smem, stream, a, kc);
}

template <int kWarps, int kTokens, int>
struct TcLaunch {
  static void run(bool swiglu, const Mxfp4GemmArgs& a, cudaStream_t stream) {
    if (swiglu) launch<kWarps, kTokens, true>(a, stream);
    else launch<kWarps, kTokens, false>(a, stream);
  }
};

}  // namespace

const Mxfp4Launchers& mxfp4_tc_launchers() {
  static constexpr Mxfp4Launchers kLaunchers = mxfp4_design_launchers<MoeMxfp4Design::kTc, TcLaunch>();
  return kLaunchers;
}

}  // namespace mxserve::kernels::cuda
