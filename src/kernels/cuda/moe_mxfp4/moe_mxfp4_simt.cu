// Design 1 of the MXFP4 expert GEMMs (CUDA cores, decode): one warp per output feature n of one active
// expert; lane l streams 16-byte chunks of packed codes (32 elements = exactly one E8M0 block) with the
// expert's rows (<= 4 per pass) in shared memory; fp32 FMA per block, then * 2^(s-127).
// NOTE: every element costs ~3 integer/bf16 ops to dequantize plus one FMA per row, so past ~2 rows per
// expert this is issue-bound, not bandwidth-bound (see docs/cuda.md "MXFP4 MoE kernels").
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_internal.h"
#include "kernels/cuda/moe_mxfp4/mxfp4_dequant.cuh"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kSimtRows = 4;
constexpr int kSimtWarps = 8;

// Dot of 32 dequantized (unscaled) elements (q: 16 packed bytes) with 32 bf16 of x (16-byte aligned).
__device__ __forceinline__ float dot32(const uint4& q, const bf16* x) {
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  float acc = 0.f;
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) {
    const uint32_t w = words[wi], w4 = w << 4;
    const uint4 xv = *reinterpret_cast<const uint4*>(x + wi * 8);  // elements 8wi .. 8wi+7
    const uint32_t xs[4] = {xv.x, xv.y, xv.z, xv.w};
    uint32_t raw[4] = {e2m1_pair_raw<0>(w, w4), e2m1_pair_raw<1>(w, w4), e2m1_pair_raw<2>(w, w4),
                       e2m1_pair_raw<3>(w, w4)};
#pragma unroll
    for (int b = 0; b < 4; ++b) {  // byte b: elements 2b (lo), 2b+1 (hi)
      const float2 wv = __bfloat1622float2(e2m1_pair_value(raw[b]));
      const float2 xf = __bfloat1622float2(as_bf162(xs[b]));
      acc = fmaf(wv.x, xf.x, acc);
      acc = fmaf(wv.y, xf.y, acc);
    }
  }
  return acc;
}

template <bool kSwiglu>
__global__ void __launch_bounds__(kSimtWarps * 32) mxfp4_simt_kernel(Mxfp4GemmArgs p) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* xs = reinterpret_cast<bf16*>(smem);  // [kSimtRows][K]
  mxfp4_pdl_wait();
  if (static_cast<int>(blockIdx.y) >= *p.n_active) return;
  const int e = p.active[blockIdx.y];
  const int rb = p.row_offsets[e], rows_total = p.row_offsets[e + 1] - rb;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * kSimtWarps + warp;
  const int K = p.k, N = p.n;
  const int64_t w_rows = kSwiglu ? 2ll * N : N;
  const int64_t row_g = static_cast<int64_t>(e) * w_rows + n, row_u = row_g + N;
  const uint8_t* qg = p.wq + row_g * (K / 2);
  const uint8_t* sg = p.ws + row_g * (K / 32);
  const uint8_t* qu = p.wq + row_u * (K / 2);
  const uint8_t* su = p.ws + row_u * (K / 32);
  const int blocks = K / 32, chunks8 = K / 8;
  for (int r0 = 0; r0 < rows_total; r0 += kSimtRows) {
    const int rows = min(kSimtRows, rows_total - r0);
    __syncthreads();  // the previous pass's readers are done with xs
    for (int i = threadIdx.x; i < rows * chunks8; i += blockDim.x) {
      const int r = i / chunks8, c = i % chunks8;
      const int64_t src = kSwiglu ? p.row_token[rb + r0 + r] : rb + r0 + r;
      *reinterpret_cast<uint4*>(xs + r * K + c * 8) = *reinterpret_cast<const uint4*>(p.a + src * K + c * 8);
    }
    __syncthreads();
    if (n >= N) continue;
    float ag[kSimtRows] = {}, au[kSimtRows] = {};
#pragma unroll 2
    for (int b = lane; b < blocks; b += 32) {
      const uint4 cg = __ldg(reinterpret_cast<const uint4*>(qg) + b);
      const float fg = e8m0_to_f32(__ldg(sg + b));
      uint4 cu{};
      float fu = 0.f;
      if (kSwiglu) {
        cu = __ldg(reinterpret_cast<const uint4*>(qu) + b);
        fu = e8m0_to_f32(__ldg(su + b));
      }
#pragma unroll
      for (int r = 0; r < kSimtRows; ++r) {
        if (r < rows) {
          ag[r] = fmaf(dot32(cg, xs + r * K + b * 32), fg, ag[r]);
          if (kSwiglu) au[r] = fmaf(dot32(cu, xs + r * K + b * 32), fu, au[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kSimtRows; ++r) {
      ag[r] = warp_sum(ag[r]);
      if (kSwiglu) au[r] = warp_sum(au[r]);
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kSimtRows; ++r) {
        if (r < rows) {
          const float v = kSwiglu ? ag[r] / (1.0f + expf(-ag[r])) * au[r] : ag[r];
          p.c[static_cast<int64_t>(rb + r0 + r) * N + n] = to_bf16(v);
        }
      }
    }
  }
}

template <bool kSwiglu>
void launch(const Mxfp4GemmArgs& a, cudaStream_t stream) {
  const size_t smem = sizeof(bf16) * kSimtRows * a.k;
  if (smem > 48 * 1024)  // NOTE: opt-in above 48 KB of dynamic shared memory
    MX_CUDA_CHECK(cudaFuncSetAttribute(mxfp4_simt_kernel<kSwiglu>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  const dim3 grid(ceil_div(a.n, kSimtWarps), a.max_active);
  mxfp4_launch_pdl(mxfp4_simt_kernel<kSwiglu>, grid, dim3(kSimtWarps * 32), smem, stream, a);
}

template <int, int, int>
struct SimtLaunch {
  static void run(bool swiglu, const Mxfp4GemmArgs& a, cudaStream_t stream) {
    if (swiglu) launch<true>(a, stream);
    else launch<false>(a, stream);
  }
};

}  // namespace

const Mxfp4Launchers& mxfp4_simt_launchers() {
  static constexpr Mxfp4Launchers kLaunchers = mxfp4_design_launchers<MoeMxfp4Design::kSimt, SimtLaunch>();
  return kLaunchers;
}

}  // namespace mxserve::kernels::cuda
