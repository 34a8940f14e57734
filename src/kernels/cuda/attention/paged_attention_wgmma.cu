// Paged causal GQA prefill / extend attention on Hopper warpgroup MMA (wgmma, sm_90a), bf16 cache, head_dim 128.
// One block = 128 consecutive query rows (tokens) of one q head: two warpgroups of 64 rows each. Per 128-key
// tile: S = Q K^T with Q and K from 128B-swizzled shared memory (wgmma m64n128k16, both K-major), the online
// softmax in registers (exp2, fp32), P rounded to bf16 in registers as the A operand of O += P V with V read
// MN-major (transposed descriptor) from the same [keys][head_dim] tile layout as K. K/V tiles come through a
// two-stage cp.async pipeline, one paged-block lookup per key row, the swizzle applied by hand.
// Rows of different sequences in one block are served one sequence (contiguous run of rows) after the other:
// the block loads that sequence's keys, rows of other runs see every key masked (they keep their state).
// Invariants: token t attends to keys [0, kv_index[t]] of its sequence token_seq[t] (as the other kernels);
// masking is applied only to tiles that reach past some row's end (the causal diagonal, run edges); tiles past
// every row of a warpgroup are skipped. No split-KV: each block walks its rows' whole contexts.
// Not served here (the planner keeps them on the mma.sync kernels): FP8 caches, tree masks, other head dims.
// Design notes: docs/perf/prefill.md. wgmma primitives: wgmma.cuh; tile helpers: wgmma_tile.cuh.
#include <cuda_bf16.h>

#include <atomic>
#include <climits>
#include <cmath>

#include "core/check.h"
#include "kernels/cuda/attention/paged_attention_wgmma.h"
#include "kernels/cuda/attention/wgmma.cuh"
#include "kernels/cuda/attention/wgmma_tile.cuh"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kHeadDim = 128;
constexpr int kRows = kWgmmaRowsPerBlock;  // query rows per block (2 warpgroups x 64)
constexpr int kKeys = 128;                 // keys per tile
constexpr int kThreads = 256;
constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
// Shared memory (1024-byte aligned; every 8-row x 128-byte swizzle atom aligned):
//   Q      [warpgroup 2][column block 2][64 rows][128 B]          32 KB
//   stage  [K | V][column block 2][kKeys rows][128 B]  x 2 stages 128 KB
constexpr uint32_t kQBytes = kRows * kHeadDim * 2;
constexpr uint32_t kQWarpgroupBytes = kQBytes / 2;
constexpr uint32_t kTileBytes = kKeys * kHeadDim * 2;  // one of K or V
constexpr uint32_t kStageBytes = 2 * kTileBytes;
constexpr size_t kSmemBytes = kQBytes + 2 * kStageBytes + 1024;  // + alignment slack

#ifdef MX_WGMMA_DEVICE
constexpr uint32_t kQColBlockBytes = 64 * 128;         // one 64-wide column block of a warpgroup's Q
constexpr uint32_t kTileColBlockBytes = kKeys * 128;  // one 64-wide column block of a K or V tile
using wgmma_tile::cp_async16;
using wgmma_tile::cp_async_commit;
using wgmma_tile::cp_async_wait_all;
using wgmma_tile::pack_bf16;
using wgmma_tile::swz;
#endif

__global__ void __launch_bounds__(kThreads, 1)
    paged_attention_wgmma_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
                                 const bf16* __restrict__ v_cache, const int32_t* __restrict__ token_seq,
                                 const int32_t* __restrict__ kv_index, const int32_t* __restrict__ block_tables,
                                 bf16* __restrict__ out, AttentionParams p) {
#ifdef MX_WGMMA_DEVICE
  extern __shared__ unsigned char smem_raw[];
  __shared__ int row_seq[kRows], row_end[kRows];
  const uint32_t smem_raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t smem = (smem_raw_addr + 1023u) & ~1023u;
  const uint32_t q_smem = smem, stages_smem = smem + kQBytes;

  const int tid = threadIdx.x;
  const int wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, q4 = lane % 4;
  const int head = blockIdx.x;
  const int G = p.n_heads / p.n_kv_heads;
  const int kvh = head / G;
  const int64_t t0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * kRows;  // longest (causal) first
  const int n_valid = static_cast<int>(min(static_cast<int64_t>(kRows), static_cast<int64_t>(p.n_tokens) - t0));
  const int64_t kv_width = static_cast<int64_t>(p.n_kv_heads) * kHeadDim;
  const float c_log2 = p.scale * 1.4426950408889634f;

  if (tid < kRows) {
    const bool ok = tid < n_valid;
    row_seq[tid] = ok ? token_seq[t0 + tid] : -1;
    row_end[tid] = ok ? max(0, kv_index[t0 + tid] + 1) : 0;
  }
  // Q rows (zero past n_tokens): its own cp.async group, complete by the first tile's wait.
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = r < n_valid;
    const bf16* src = ok ? q + ((t0 + r) * p.n_heads + head) * kHeadDim + c * 8 : q;
    cp_async16(q_smem + (r / 64) * kQWarpgroupBytes + swz(r % 64, c, kQColBlockBytes), src, ok);
  }
  cp_async_commit();
  __syncthreads();

  // This thread's two rows (accumulator rows g and g + 8 of its warp's 16).
  const int row0 = wg * 64 + warp * 16 + g;
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  for (int r = 0; r < n_valid;) {  // each run of rows of one sequence
    const int seq = row_seq[r];
    int rb = r + 1, run_end = row_end[r];
    while (rb < n_valid && row_seq[rb] == seq) run_end = max(run_end, row_end[rb++]);
    const int lo = max(r, wg * 64), hi = min(rb, wg * 64 + 64);
    int wg_max = 0, wg_min = 0;  // rows of this warpgroup outside the run count as end 0
    if (lo < hi) {
      wg_min = (lo == wg * 64 && hi == wg * 64 + 64) ? INT_MAX : 0;
      for (int i = lo; i < hi; ++i) {
        wg_max = max(wg_max, row_end[i]);
        wg_min = min(wg_min, row_end[i]);
      }
    }
    int my_end[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int rr = row0 + 8 * hr;
      my_end[hr] = (rr >= r && rr < rb) ? row_end[rr] : 0;
    }
    const int32_t* table = block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
    const int n_tiles = (run_end + kKeys - 1) / kKeys;

    auto load_tile = [&](int stage, int tile) {
      const uint32_t kd = stages_smem + stage * kStageBytes, vd = kd + kTileBytes;
      const int c = tid % kChunks;
#pragma unroll
      for (int jj = 0; jj < kKeys / (kThreads / kChunks); ++jj) {
        const int j = tid / kChunks + jj * (kThreads / kChunks);
        const int key = tile * kKeys + j;
        const bool ok = key < run_end;  // past the run's end: zero-filled (finite; masked or P = 0)
        int64_t off = 0;
        if (ok) {
          const int64_t slot = static_cast<int64_t>(table[key / p.block_size]) * p.block_size + key % p.block_size;
          off = slot * kv_width + kvh * kHeadDim + c * 8;
        }
        const uint32_t at = swz(j, c, kTileColBlockBytes);
        cp_async16(kd + at, k_cache + off, ok);
        cp_async16(vd + at, v_cache + off, ok);
      }
    };

    if (n_tiles > 0) load_tile(0, 0);
    cp_async_commit();
    for (int it = 0; it < n_tiles; ++it) {
      cp_async_wait_all();
      wgmma::fence_proxy_async_smem();
      __syncthreads();  // tile `it` landed for every thread; every warpgroup is done with the other stage
      if (it + 1 < n_tiles) load_tile((it + 1) & 1, it + 1);
      cp_async_commit();
      const int k0 = it * kKeys;
      if (k0 >= wg_max) continue;  // warpgroup-uniform: every row of this warpgroup ends before the tile
      const uint32_t kd = stages_smem + (it & 1) * kStageBytes, vd = kd + kTileBytes;
      const uint32_t qd = q_smem + wg * kQWarpgroupBytes;

      float s[64];
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        const uint32_t koff = (ks % 4) * 32u;  // 16 bf16 along K inside the swizzled 128-byte row
        const uint64_t da = wgmma::desc_sw128(qd + (ks / 4) * kQColBlockBytes + koff, 16, 1024);
        const uint64_t db = wgmma::desc_sw128(kd + (ks / 4) * kTileColBlockBytes + koff, 16, 1024);
        wgmma::m64n128k16_ss(s, da, db, ks > 0 ? 1 : 0);
      }
      wgmma::commit_group();
      wgmma::wait_group<0>();
      wgmma::fence_regs(s);

      // Online softmax on rows (g, g + 8): s[4j + e] is key k0 + 8j + 2 q4 + (e & 1), row hr = e >> 1.
      if (k0 + kKeys > wg_min) {
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (k0 + 8 * j + 2 * q4 + (e & 1) >= my_end[e >> 1]) s[4 * j + e] = -INFINITY;
      }
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
      float alpha[2], m_use[2];
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
        const float m_new = fmaxf(m[hr], mx[hr] * c_log2);  // -inf while every key so far was masked
        alpha[hr] = m[hr] == -INFINITY ? 0.f : exp2f(m[hr] - m_new);
        m[hr] = m_new;
        m_use[hr] = m_new == -INFINITY ? 0.f : m_new;
        l[hr] *= alpha[hr];
      }
      uint32_t pa[kKeys / 16][4];
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        float pv[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          pv[e] = exp2f(fmaf(s[8 * kk + e], c_log2, -m_use[(e >> 1) & 1]));  // masked: exp2(-inf) = 0
          l[(e >> 1) & 1] += pv[e];
        }
        // A fragment of m64k16: (row g, keys 2q4..), (row g+8, keys 2q4..), (row g, keys 8+2q4..), (row g+8, ...).
        pa[kk][0] = pack_bf16(pv[0], pv[1]);
        pa[kk][1] = pack_bf16(pv[2], pv[3]);
        pa[kk][2] = pack_bf16(pv[4], pv[5]);
        pa[kk][3] = pack_bf16(pv[6], pv[7]);
      }
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[4 * j + e] *= alpha[e >> 1];

      wgmma::fence_regs(o);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        // V tile as the MN-major B operand: keys 16 kk .. +15 are two 8-row atoms (SBO 1024), head dims in two
        // 64-wide column blocks (LBO = one column block).
        const uint64_t db = wgmma::desc_sw128(vd + kk * 16 * 128, kTileColBlockBytes, 1024);
        wgmma::m64n128k16_rs_tb(o, pa[kk], db);
      }
      wgmma::commit_group();
      wgmma::wait_group<0>();
      wgmma::fence_regs(o);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) wgmma::fence_regs(pa[kk]);  // live until the MMAs read them
    }
    cp_async_wait_all();
    __syncthreads();  // the stages are reused by the next run
    r = rb;
  }
  cp_async_wait_all();

#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
    const int rr = row0 + 8 * hr;
    if (rr >= n_valid) continue;
    const float inv = l[hr] > 0.f ? 1.f / l[hr] : 0.f;
    bf16* dst = out + ((t0 + rr) * p.n_heads + head) * kHeadDim + 2 * q4;
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j)
      *reinterpret_cast<uint32_t*>(dst + 8 * j) = pack_bf16(o[4 * j + 2 * hr] * inv, o[4 * j + 2 * hr + 1] * inv);
  }
#else
  __trap();  // built for a device without wgmma: the host never launches it there (supports() is false)
#endif
}

// Compute capability of the current device, cached per device; 0 where none can be queried.
int current_device_sm() {
  static int cached[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();  // clear the non-sticky error for later launch checks
    return 0;
  }
  if (cached[dev] == 0) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    cached[dev] = major * 10 + minor;
  }
  return cached[dev];
}

}  // namespace

bool paged_attention_wgmma_supports(const AttentionParams& p, const char** why) {
  const char* reason = nullptr;
  if (p.head_dim != kHeadDim) reason = "head_dim is not 128";
  else if (p.k_scales != nullptr) reason = "FP8 KV cache (bf16 only)";
  else if (p.tree_mask != nullptr) reason = "tree mask";
  else if (p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0) reason = "n_heads not a multiple of n_kv_heads";
  else if (p.block_size <= 0) reason = "block_size <= 0";
  else if (current_device_sm() != 90) reason = "the device is not sm_90 (wgmma is Hopper-only)";
  if (why != nullptr) *why = reason;
  return reason == nullptr;
}

void paged_attention_wgmma_bf16(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                                const int32_t* kv_index, const int32_t* block_tables, void* out,
                                const AttentionParams& p, cudaStream_t stream) {
  if (p.n_tokens == 0) return;
  const char* why = nullptr;
  MX_CHECK_MSG(paged_attention_wgmma_supports(p, &why), "paged_attention_wgmma: " << why << " (planner bug)");
  // > 48 KB of dynamic shared memory needs an opt-in, once per device (the attribute is per device).
  static std::atomic<bool> configured[64];
  int dev = 0;
  MX_CUDA_CHECK(cudaGetDevice(&dev));
  MX_CHECK_LT(dev, 64);
  if (!configured[dev].load()) {
    MX_CUDA_CHECK(cudaFuncSetAttribute(paged_attention_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSmemBytes)));
    configured[dev].store(true);
  }
  const int64_t row_blocks = (static_cast<int64_t>(p.n_tokens) + kRows - 1) / kRows;
  MX_CHECK_LT(row_blocks, int64_t{65536});
  const dim3 grid(static_cast<unsigned>(p.n_heads), static_cast<unsigned>(row_blocks));
  paged_attention_wgmma_kernel<<<grid, kThreads, kSmemBytes, stream>>>(
      static_cast<const bf16*>(q), static_cast<const bf16*>(k_cache), static_cast<const bf16*>(v_cache), token_seq,
      kv_index, block_tables, static_cast<bf16*>(out), p);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
