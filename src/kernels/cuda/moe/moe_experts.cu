// Routed experts of one MoE layer on the GPU, bf16 weights, no host synchronization:
//   1. permute: count (token, slot) pairs per expert, scan to row offsets and m-tile offsets, scatter each
//      pair to a row of its expert's segment (row_token[row] = token, pair_row[pair] = row);
//   2. grouped GEMM 1 (+ fused SwiGLU): act[row] = silu(x[token] @ gate_e^T) * (x[token] @ up_e^T);
//      A rows are gathered from x on load, so the permuted copy of x is never written;
//   3. grouped GEMM 2: y[row] = act[row] @ down_e^T;
//   4. un-permute: out[t] += sum_k w[t, k] * y[pair_row[t, k]] in fp32, one rounding.
// The grouped GEMM is one launch over all experts: blockIdx.x walks a tile schedule (expert, m-tile)
// built on the device, so the grid is an upper bound and surplus blocks exit. Rows within an expert are
// independent, so the (atomic, unordered) scatter does not change any result.
// NOTE: tensor cores through WMMA (HMMA m16n16k16, bf16 in, fp32 accumulate) with a 3-stage cp.async
// pipeline. cp.async is the sm_80+ seam (a HIP port swaps it for plain loads); wgmma is later work.
#include <mma.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/moe/moe_expert_range.h"
#include "kernels/cuda/moe/moe_permute.cuh"

namespace mxserve::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;

// NOTE: a narrow weight tile (64 rows) and a deep k stage (64) keep enough blocks and bytes in flight
// at decode (1 token, 8 experts: 8 x 44 blocks for GEMM 1), where the kernel is weight-bandwidth bound.
constexpr int kBM = 32;       // rows (tokens) per tile
constexpr int kBW = 64;       // weight rows per tile: 32 gate + 32 up (SwiGLU) or 64 outputs (plain)
constexpr int kBK = 64;       // k per stage
constexpr int kStages = 3;
constexpr int kLd = kBK + 8;  // smem row stride (elements): 144 bytes, 16-byte aligned, fewer conflicts
constexpr int kThreads = 128;
constexpr int kLdc = kBW + 4;  // epilogue f32 tile stride

struct alignas(128) GemmSmem {
  union {
    struct {
      bf16 a[kStages][kBM][kLd];
      bf16 b[kStages][kBW][kLd];
    } pipe;
    float c[kBM][kLdc];
  };
};

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int bytes = valid ? 16 : 0;  // 0: zero-fill the 16 bytes
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// kSwiglu: A = x [T, K] gathered through row_token, W = gate_up [E, 2N, K], C = act [P, N].
// plain:   A = act [P, K] (row = permuted row),    W = down [E, N, K],    C = y [P, N].
template <bool kSwiglu>
__global__ void __launch_bounds__(kThreads)
    grouped_gemm_kernel(const bf16* __restrict__ A, const int32_t* __restrict__ row_token,
                        const bf16* __restrict__ W, bf16* __restrict__ C, const int32_t* __restrict__ row_offsets,
                        const int32_t* __restrict__ tile_offsets, int n_experts, int N, int K) {
  __shared__ GemmSmem sm;
  __shared__ int a_row_s[kBM];  // source row of A for each tile row, -1 past the expert's rows
  const int tile = blockIdx.x;
  if (tile >= tile_offsets[n_experts]) return;
  int lo = 0, hi = n_experts - 1;  // expert e with tile_offsets[e] <= tile < tile_offsets[e + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_offsets[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  const int e = lo;
  const int m0 = (tile - tile_offsets[e]) * kBM;
  const int row_begin = row_offsets[e] + m0;
  const int rows = min(kBM, row_offsets[e + 1] - row_begin);
  const int n0 = blockIdx.y * (kSwiglu ? kBW / 2 : kBW);
  const int64_t w_rows = kSwiglu ? 2 * N : N;
  const bf16* We = W + static_cast<int64_t>(e) * w_rows * K;

  if (threadIdx.x < kBM) {
    const int r = threadIdx.x;
    a_row_s[r] = r < rows ? (kSwiglu ? row_token[row_begin + r] : row_begin + r) : -1;
  }
  __syncthreads();

  auto load_stage = [&](int stage, int k0) {
#pragma unroll
    for (int i = 0; i < kBM * (kBK / 8) / kThreads; ++i) {  // A: kBM x kBK = 256 chunks of 8
      const int chunk = threadIdx.x + i * kThreads;
      const int r = chunk / (kBK / 8), c = chunk % (kBK / 8);
      const int k = k0 + c * 8;
      const int src = a_row_s[r];
      const bool ok = src >= 0 && k < K;
      cp_async16(&sm.pipe.a[stage][r][c * 8], ok ? A + static_cast<int64_t>(src) * K + k : A, ok);
    }
#pragma unroll
    for (int i = 0; i < kBW * (kBK / 8) / kThreads; ++i) {  // B: kBW x kBK = 512 chunks of 8
      const int chunk = threadIdx.x + i * kThreads;
      const int r = chunk / (kBK / 8), c = chunk % (kBK / 8);
      const int k = k0 + c * 8;
      int64_t wr;
      bool ok;
      if (kSwiglu) {
        const int col = n0 + (r % (kBW / 2));
        ok = col < N;
        wr = (r < kBW / 2) ? col : N + col;
      } else {
        ok = n0 + r < N;
        wr = n0 + r;
      }
      ok = ok && k < K;
      cp_async16(&sm.pipe.b[stage][r][c * 8], ok ? We + wr * K + k : We, ok);
    }
  };

  const int warp = threadIdx.x / 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];  // rows 0-15, 16-31 x this warp's 16 columns
#pragma unroll
  for (int i = 0; i < 2; ++i) wmma::fill_fragment(acc[i], 0.f);

  const int n_k = (K + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_k) load_stage(s, s * kBK);
    cp_async_commit();
  }
  for (int kt = 0; kt < n_k; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < n_k) load_stage(next % kStages, next * kBK);
    cp_async_commit();
    const int st = kt % kStages;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &sm.pipe.a[st][i * 16][kk], kLd);
      wmma::load_matrix_sync(fb, &sm.pipe.b[st][warp * 16][kk], kLd);
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[i], fa[i], fb, acc[i]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline buffers become the epilogue tile
#pragma unroll
  for (int i = 0; i < 2; ++i) wmma::store_matrix_sync(&sm.c[i * 16][warp * 16], acc[i], kLdc, wmma::mem_row_major);
  __syncthreads();

  constexpr int kOutCols = kSwiglu ? kBW / 2 : kBW;
  for (int i = threadIdx.x; i < kBM * kOutCols; i += kThreads) {
    const int r = i / kOutCols, c = i % kOutCols;
    if (r >= rows || n0 + c >= N) continue;
    float v;
    if (kSwiglu) {
      const float g = sm.c[r][c], u = sm.c[r][kBW / 2 + c];
      v = g / (1.0f + expf(-g)) * u;
    } else {
      v = sm.c[r][c];
    }
    C[static_cast<int64_t>(row_begin + r) * N + n0 + c] = to_bf16(v);
  }
}

// Decode path (few tokens): one warp per output row n of one active expert, weights streamed once with
// 16-byte loads (the MMA tiles would be 1/32 full); the expert's <= kGemvRows input rows sit in shared
// memory. kSwiglu: C[row, n] = silu(x W_gate[n]) * (x W_up[n]); plain: C[row, n] = x W[n].
constexpr int kGemvRows = 4;
constexpr int kGemvWarps = 8;

template <bool kSwiglu>
__global__ void __launch_bounds__(kGemvWarps * 32)
    moe_gemv_kernel(const bf16* __restrict__ A, const int32_t* __restrict__ row_token, const bf16* __restrict__ W,
                    bf16* __restrict__ C, const int32_t* __restrict__ row_offsets, const int32_t* __restrict__ active,
                    const int32_t* __restrict__ n_active, int N, int K) {
  extern __shared__ __align__(16) unsigned char gsm[];
  bf16* xs = reinterpret_cast<bf16*>(gsm);  // [kGemvRows][K]
  if (static_cast<int>(blockIdx.y) >= *n_active) return;
  const int e = active[blockIdx.y];
  const int rb = row_offsets[e], rows_total = row_offsets[e + 1] - rb;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * kGemvWarps + warp;
  const int64_t w_rows = kSwiglu ? 2ll * N : N;
  const bf16* wg = W + (static_cast<int64_t>(e) * w_rows + n) * K;
  const bf16* wu = wg + static_cast<int64_t>(N) * K;  // SwiGLU only
  const int chunks = K / 8;
  for (int r0 = 0; r0 < rows_total; r0 += kGemvRows) {
    const int rows = min(kGemvRows, rows_total - r0);
    __syncthreads();  // the previous chunk's readers are done with xs
    for (int i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
      const int r = i / chunks, c = i % chunks;
      const int64_t src = kSwiglu ? row_token[rb + r0 + r] : rb + r0 + r;
      *reinterpret_cast<uint4*>(xs + r * K + c * 8) = *reinterpret_cast<const uint4*>(A + src * K + c * 8);
    }
    __syncthreads();
    if (n >= N) continue;
    float ag[kGemvRows] = {}, au[kGemvRows] = {};
#pragma unroll 4
    for (int c = lane; c < chunks; c += 32) {
      float g8[8], u8[8];
      load8(wg + c * 8, g8);
      if (kSwiglu) load8(wu + c * 8, u8);
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        if (r < rows) {
          float x8[8];
          load8(xs + r * K + c * 8, x8);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            ag[r] += g8[j] * x8[j];
            if (kSwiglu) au[r] += u8[j] * x8[j];
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
      ag[r] = warp_sum(ag[r]);
      if (kSwiglu) au[r] = warp_sum(au[r]);
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        if (r < rows) {
          const float v = kSwiglu ? ag[r] / (1.0f + expf(-ag[r])) * au[r] : ag[r];
          C[static_cast<int64_t>(rb + r0 + r) * N + n] = to_bf16(v);
        }
      }
    }
  }
}

// NOTE: the GEMV path wins while each active expert has a handful of rows (decode); the crossover was
// not tuned (T <= 4 by construction: at most 4 rows per expert when a token's ids are distinct).
// KernelOptions::moe_kernel = "grouped" (s.force_grouped) forces the grouped GEMM (benchmark comparisons only).
bool use_gemv(const MoeShape& s) {
  if (s.force_grouped) return false;
  return s.n_tokens <= kGemvRows;
}

template <bool kSwiglu>
void launch_gemv(const void* a, const int32_t* row_token, const void* w, bf16* c, const MoeWorkspace& ws,
                 unsigned max_active, int64_t n, int64_t k, cudaStream_t stream) {
  const size_t smem = sizeof(bf16) * kGemvRows * k;
  static size_t configured = 48 * 1024;  // NOTE: opt-in above 48 KB of dynamic shared memory
  if (smem > configured) {
    MX_CUDA_CHECK(cudaFuncSetAttribute(moe_gemv_kernel<kSwiglu>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    configured = smem;
  }
  const dim3 grid(ceil_div(n, kGemvWarps), max_active);
  moe_gemv_kernel<kSwiglu><<<grid, kGemvWarps * 32, smem, stream>>>(
      static_cast<const bf16*>(a), row_token, static_cast<const bf16*>(w), c, ws.row_offsets, ws.active, ws.n_active,
      static_cast<int>(n), static_cast<int>(k));
  MX_CUDA_CHECK_LAUNCH();
}

void launch_grouped(const void* x, const void* gate_up, const void* down, const MoeWorkspace& w, const MoeShape& s,
                    int64_t P, cudaStream_t stream) {
  // Upper bound on the schedule's tiles: sum_e ceil(c_e / kBM) <= ceil(P / kBM) + min(E, P).
  const int64_t max_tiles = (P + kBM - 1) / kBM + std::min<int64_t>(s.n_experts, P);
  const dim3 grid1(static_cast<unsigned>(max_tiles), ceil_div(s.inter, kBW / 2));
  grouped_gemm_kernel<true><<<grid1, kThreads, 0, stream>>>(
      static_cast<const bf16*>(x), w.row_token, static_cast<const bf16*>(gate_up), w.act, w.row_offsets,
      w.tile_offsets, s.n_experts, static_cast<int>(s.inter), static_cast<int>(s.d_model));
  MX_CUDA_CHECK_LAUNCH();
  const dim3 grid2(static_cast<unsigned>(max_tiles), ceil_div(s.d_model, kBW));
  grouped_gemm_kernel<false><<<grid2, kThreads, 0, stream>>>(
      w.act, nullptr, static_cast<const bf16*>(down), w.y, w.row_offsets, w.tile_offsets, s.n_experts,
      static_cast<int>(s.d_model), static_cast<int>(s.inter));
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace

size_t moe_workspace_bytes(const MoeShape& s) { return moe_workspace_layout_bytes(s); }

void moe_experts_bf16(const void* x, const int32_t* topk_ids, const float* topk_weights, const void* gate_up,
                      const void* down, void* out, const MoeShape& s, void* workspace, cudaStream_t stream) {
  if (s.n_tokens == 0) return;
  MX_CHECK_MSG(s.d_model % 8 == 0 && s.inter % 8 == 0,
               "moe_experts_bf16: d_model " << s.d_model << " and inter " << s.inter << " must be multiples of 8");
  const int64_t P = s.n_tokens * s.top_k;
  MX_CHECK_LT(P, int64_t{1} << 31);
  const MoeWorkspace w = moe_carve_workspace(workspace, s);
  MX_CHECK_LE(s.n_experts, 4096);
  moe_permute_kernel<<<1, kPermuteThreads, 2 * sizeof(int32_t) * s.n_experts, stream>>>(
      topk_ids, P, s.n_experts, s.top_k, kBM, w.row_offsets, w.tile_offsets, w.row_token, w.pair_row, w.active,
      w.n_active);
  MX_CUDA_CHECK_LAUNCH();

  if (use_gemv(s)) {
    const unsigned max_active = static_cast<unsigned>(std::min<int64_t>(s.n_experts, P));
    launch_gemv<true>(x, w.row_token, gate_up, w.act, w, max_active, s.inter, s.d_model, stream);
    launch_gemv<false>(w.act, nullptr, down, w.y, w, max_active, s.d_model, s.inter, stream);
  } else {
    launch_grouped(x, gate_up, down, w, s, P, stream);
  }
  moe_unpermute_kernel<<<moe_grid_1d(s.n_tokens * s.d_model / 8), 256, 0, stream>>>(
      w.y, w.pair_row, topk_weights, static_cast<bf16*>(out), s.n_tokens, s.d_model, s.top_k);
  MX_CUDA_CHECK_LAUNCH();
}

namespace {
__global__ void moe_local_expert_ids_kernel(const int32_t* __restrict__ ids, int64_t n, int32_t first,
                                            int32_t n_local, int32_t* __restrict__ local) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    local[i] = local_expert_id(ids[i], first, n_local);
}
}  // namespace

void moe_local_expert_ids(const int32_t* ids, int64_t n, int32_t first, int32_t n_local, int32_t* local,
                          cudaStream_t stream) {
  if (n == 0) return;
  moe_local_expert_ids_kernel<<<moe_grid_1d(n), 256, 0, stream>>>(ids, n, first, n_local, local);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
