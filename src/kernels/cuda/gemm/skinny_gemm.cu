// Skinny bf16 GEMM (skinny_gemm.h): one block per 16-row weight tile; its kWarps warps split K into
// contiguous ranges of 64-column chunks and stream them straight from global memory into mma.sync
// m16n8k16 fragments (weights = operand A, the <= 8 token rows = operand B, n = 8), fp32 accumulators;
// the warps' partial tiles are summed in shared memory and one pass adds the bias and stores.
//
// Fragment layout (no shuffles, no shared memory for operands): lane (g, t) loads 32 contiguous bytes of
// weight rows g and g + 8 at columns c0 + 16t .. c0 + 16t + 15 of chunk c0, and the same 32 bytes of token
// row g (zeros for g >= m). Of each 16-byte half, words x/y feed one MMA's k slots (2t, 2t+1) / (2t+8, 2t+9)
// and words z/w the next MMA's: A and B see the same permutation of k inside an MMA, and the four t lanes
// own disjoint columns, so the sums are the plain dot products (in another order than cuBLAS).
// Key invariant: every weight byte is loaded exactly once per call (rows >= n re-read row n - 1 and are not
// stored).
#include "kernels/cuda/gemm/skinny_gemm.h"

#include <algorithm>

#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/ld_stream.cuh"
#include "kernels/cuda/common/mma_sm80.cuh"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kChunk = 64;           // k columns per warp step
constexpr int kTargetWarps = 3000;   // enough warps in the grid to fill 132 SMs with bytes in flight

// One chunk's weights for one lane (streamed once: common/ld_stream.cuh): rows g (a) and g + 8 (b), two 16-byte halves each.
struct SkChunk {
  uint4 a[2], b[2];
};

__device__ __forceinline__ SkChunk sk_load(const bf16* wa, const bf16* wb, int col) {
  SkChunk c;
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    c.a[u] = ld_stream16(wa + col + 8 * u);
    c.b[u] = ld_stream16(wb + col + 8 * u);
  }
  return c;
}

// The chunk's 4 MMAs; token row g's 32 bytes at the same columns are read here (L1 hits after the first warp),
// so only the weights of the chunks in flight hold registers.
__device__ __forceinline__ void sk_mma(float (&acc)[4], const SkChunk& c, const bf16* xrow, int col) {
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const uint4 xv = xrow ? __ldg(reinterpret_cast<const uint4*>(xrow + col + 8 * u)) : make_uint4(0, 0, 0, 0);
    const uint32_t a0[4] = {c.a[u].x, c.b[u].x, c.a[u].y, c.b[u].y};
    mma_bf16_m16n8k16(acc, a0, xv.x, xv.y);
    const uint32_t a1[4] = {c.a[u].z, c.b[u].z, c.a[u].w, c.b[u].w};
    mma_bf16_m16n8k16(acc, a1, xv.z, xv.w);
  }
}

template <int kWarps, bool kF32Out>
__global__ void __launch_bounds__(kWarps * 32, (32 / kWarps > 0 ? 32 / kWarps : 1))
    skinny_gemm_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ bias,
                       void* __restrict__ out, int m, int n, int k) {
  __shared__ float red[kWarps][4][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * 16;
  const int ra = min(row0 + g, n - 1), rb = min(row0 + g + 8, n - 1);
  const bf16* wa = w + static_cast<int64_t>(ra) * k + 16 * t;
  const bf16* wb = w + static_cast<int64_t>(rb) * k + 16 * t;
  const bf16* xrow = g < m ? x + static_cast<int64_t>(g) * k + 16 * t : nullptr;
  const int n_chunks = k / kChunk;
  const int per_warp = (n_chunks + kWarps - 1) / kWarps;
  const int c_begin = warp * per_warp, c_end = min(n_chunks, c_begin + per_warp);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  int c = c_begin;
  for (; c + 1 < c_end; c += 2) {  // two chunks (4 KB of the warp's weights) in flight per lane
    const SkChunk c0 = sk_load(wa, wb, c * kChunk);
    const SkChunk c1 = sk_load(wa, wb, (c + 1) * kChunk);
    sk_mma(acc, c0, xrow, c * kChunk);
    sk_mma(acc, c1, xrow, (c + 1) * kChunk);
  }
  if (c < c_end) sk_mma(acc, sk_load(wa, wb, c * kChunk), xrow, c * kChunk);
#pragma unroll
  for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
  __syncthreads();
  // Thread j < 128 finishes accumulator i = j / 32 of lane j % 32: row g (i < 2) or g + 8, token 2t + i % 2.
  const int j = threadIdx.x;
  if (j >= 128) return;
  const int i = j / 32, l = j % 32;
  const int tok = 2 * (l % 4) + (i % 2), row = row0 + l / 4 + (i < 2 ? 0 : 8);
  if (tok >= m || row >= n) return;
  float v = 0.f;
#pragma unroll
  for (int w2 = 0; w2 < kWarps; ++w2) v += red[w2][i][l];
  if (bias) v += to_f32(bias[row]);
  if constexpr (kF32Out) static_cast<float*>(out)[static_cast<int64_t>(tok) * n + row] = v;
  else static_cast<bf16*>(out)[static_cast<int64_t>(tok) * n + row] = to_bf16(v);
}

template <int kWarps>
void launch_skinny(const void* x, const void* w, const void* bias, void* out, bool out_f32, int m, int n, int k,
                   cudaStream_t stream) {
  const dim3 grid((n + 15) / 16), block(kWarps * 32);
  const auto* xb = static_cast<const bf16*>(x);
  const auto* wb = static_cast<const bf16*>(w);
  const auto* bb = static_cast<const bf16*>(bias);
  if (out_f32) skinny_gemm_kernel<kWarps, true><<<grid, block, 0, stream>>>(xb, wb, bb, out, m, n, k);
  else skinny_gemm_kernel<kWarps, false><<<grid, block, 0, stream>>>(xb, wb, bb, out, m, n, k);
  MX_CUDA_CHECK_LAUNCH();
}

bool aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

const char* skinny_gemm_unsupported_reason(const void* x, const void* w, const void* bias, const void* out,
                                           int64_t m, int64_t n, int64_t k) {
  if (m < 1 || m > kSkinnyMaxRows) return "M outside 1..8";
  if (n < 1 || n > (int64_t{1} << 30)) return "N outside 1..2^30";
  if (k < kChunk || k % kChunk != 0 || k > (int64_t{1} << 30)) return "K not a positive multiple of 64";
  if (n * k > (int64_t{1} << 40)) return "weight too large";
  if (!aligned(x, 16) || !aligned(w, 16)) return "x or w not 16-byte aligned";
  if (!aligned(out, 4) || (bias && !aligned(bias, 2))) return "out or bias misaligned";
  return nullptr;
}

void skinny_gemm_bf16(const void* x, const void* w, const void* bias, void* out, bool out_f32, int64_t m, int64_t n,
                      int64_t k, cudaStream_t stream) {
  const char* why = skinny_gemm_unsupported_reason(x, w, bias, out, m, n, k);
  MX_CHECK_MSG(why == nullptr, "skinny_gemm_bf16: M=" << m << " N=" << n << " K=" << k << " unsupported: " << why);
  // Warps per 16-row tile: the fewest of 4 / 8 / 16 / 32 that put kTargetWarps warps in the grid, each with
  // at least one 64-column chunk (few tiles, e.g. Air's k/v projections: 64 tiles x 32 warps x 2 chunks).
  const int64_t tiles = (n + 15) / 16, chunks = k / kChunk;
  int warps = 4;
  while (warps < 32 && tiles * warps < kTargetWarps && chunks >= 2 * warps) warps *= 2;
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  if (warps == 4) launch_skinny<4>(x, w, bias, out, out_f32, mi, ni, ki, stream);
  else if (warps == 8) launch_skinny<8>(x, w, bias, out, out_f32, mi, ni, ki, stream);
  else if (warps == 16) launch_skinny<16>(x, w, bias, out, out_f32, mi, ni, ki, stream);
  else launch_skinny<32>(x, w, bias, out, out_f32, mi, ni, ki, stream);
}

}  // namespace mxserve::kernels::cuda
