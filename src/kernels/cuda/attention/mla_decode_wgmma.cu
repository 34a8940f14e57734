// Hopper (sm_90a) attend step of absorbed MLA (glm_moe_dsa) on warpgroup MMA, bf16 or FP8 latent cache:
// o_lat[t, h, :] = softmax_j((q_abs . latent_j + q_rope . k_rope_j) * scale) latent_j -- the formula of the SIMT
// oracle (mla_attention.cu) and of the mma.sync kernel (mla_decode_mma.cu). kAuto runs this one on sm_90
// (kMlaAutoHopperKernel, mla_dsa.h: the kWgmmaSplitS variant since the H100 run of 2026-12-06; docs/perf/glm5.md).
// Shape: kv_lora_rank 512, qk_rope_dim 64, 1..64 heads per rank (TP8 / TP4 / TP2 / DP attention: 8/16/32/64).
// M packing: the 64 wgmma rows are (token slot, head) pairs, row m = head m % H of slot m / H. Dense rows pack
// 64 / H consecutive tokens per CTA (8 at TP8): tokens of one sequence (MTP / tree rows) form a run that shares
// every latent tile; tokens of different sequences are served run after run (rows outside the current run see
// every key masked and keep their softmax state), so the latent bytes are still read once per token and none of
// the M rows is padding at 8 heads with MTP. Sparse (top-k) rows keep one token per CTA (own key list).
// Layout (index math in mla_wgmma_layout.h): one CTA per (token slots, KV split), 2 warpgroups (256 threads, up
// to 255 registers each: O alone is 128 f32 a thread, more than a producer / consumer split's 168-register cap
// leaves once ptxas sizes the kernel for 384 threads).
//   Q = [bf16 q_abs | q_rope] of the 64 rows in shared memory (72 KB, [9 column blocks][64 rows][128 B],
//   128B-swizzled). Latent tiles of 64 keys (72 KB, same layout) stream through a 2-stage ring: both warpgroups
//   gather tile j + 1 (block table, top-k list; zero-filled where the key is invisible) with cp.async while tile
//   j multiplies, so every latent byte is read from HBM once per (token run, split) and shared by all heads.
//   Each warpgroup computes the full S = Q K^T (64 x 64 keys over 576 dims: 36 wgmma m64n64k16, both operands in
//   shared memory -- the redundant half costs tensor time the memory-bound loop has spare and saves a
//   cross-warpgroup softmax exchange), the online softmax (exp2, fp32) in registers, and O[:, 256 cw, +256) +=
//   P V (P bf16 from registers, V = the same tile read MN-major, 4 wgmma m64n256k16).
// Split-KV: each split writes its normalized partial (fp32) and (max log2, denominator); the combine kernel writes
// o_lat (bf16). One split writes o_lat directly. Smem 216 KB (FP8: 218 KB) + 1 KB alignment: one CTA per SM.
// Precision: q_abs and P enter the MMAs as bf16 (fp32 accumulate and softmax), as the mma.sync kernel.
// FP8 latent cache (p.fp8_cache, kFp8: packed 656-byte rows, kernels/mla_fp8.h; layout in mla_wgmma_layout.h):
// the copy streams each tile's codes + scales (528 B a row) into a 2-stage raw ring and its bf16 rope tails
// straight into a 2-stage rope column block; once a tile lands, all 256 threads dequantize it (code x its
// 128-column block's scale, one f32 then one bf16 rounding: the bf16 values of the mma.sync kernel's FP8 path)
// into ONE bf16 latent tile in the same swizzled layout, and the unchanged wgmma math runs. 0.57x the HBM bytes
// of bf16. The dequantization (16 chunks of 8 codes a thread a tile) runs in two halves: the score MMAs over
// column blocks 0..3 run while blocks 4..7 are dequantized (one latent tile: a second one does not fit beside
// the raw ring, so P V and the first half are not overlapped). kWgmmaSplitS's P exchange lives in the dequantized
// raw stage.
// The launcher never allocates nor synchronizes (CUDA-graph capturable): partials live in the caller's workspace.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>

#include "core/check.h"
#include "kernels/attention_split_table.h"
#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/attention/mla_visibility.cuh"
#include "kernels/cuda/attention/mla_wgmma_layout.h"
#include "kernels/cuda/attention/wgmma_tile.cuh"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/wgmma_sm90.cuh"

namespace mxserve::kernels::cuda {
namespace {

using namespace mla_wgmma;  // NOLINT: the layout constants are this file's vocabulary

constexpr int kThreads = 256;  // 2 warpgroups, each owning half of the latent output dims
constexpr size_t kSmemBytes = kTileBytes /* Q */ + kStages * kTileBytes + 1024;  // + alignment slack
constexpr size_t kSmemBytesFp8 = kFp8SmemBytes + 1024;

#ifdef MX_WGMMA_DEVICE
using wgmma_tile::cp_async16;
using wgmma_tile::pack_bf16;

// S (64 rows x kN keys from tile row kd's) = Q K^T over the 576 dims: 36 k16 steps, both operands K-major
// 128B-swizzled (kN = 64: the whole tile; 32: this warpgroup's half of it, kWgmmaSplitS).
// The tile's rope column block (block 8) sits at kd8: kd + 8 column blocks for bf16, its own stage for FP8.
// k16 steps [kBegin, kEnd) (FP8 issues them in two batches around the second dequantization half).
template <int kN, int kBegin = 0, int kEnd = kRow / 16>
__device__ __forceinline__ void issue_qk(float (&s)[kN / 2], uint32_t qd, uint32_t kd, uint32_t kd8) {
#pragma unroll
  for (int ks = kBegin; ks < kEnd; ++ks) {
    const uint32_t off = (ks / 4) * kColBlockBytes + (ks % 4) * 32u;
    const uint32_t koff = ks / 4 < 8 ? kd + off : kd8 + (ks % 4) * 32u;
    const uint64_t da = wgmma::desc_sw128(qd + off, 16, 1024), db = wgmma::desc_sw128(koff, 16, 1024);
    if constexpr (kN == 64) wgmma::m64n64k16_ss(s, da, db, ks > 0 ? 1 : 0);
    else wgmma::m64n32k16_ss(s, da, db, ks > 0 ? 1 : 0);
  }
  wgmma::commit_group();
}

// O (64 rows x latent dims [256 cw, +256)) += P V: V = the tile's column blocks 4 cw .. 4 cw + 3, MN-major
// (LBO = the column-block stride, SBO = one 8-key atom), 4 k16 steps over the tile's 64 keys.
__device__ __forceinline__ void issue_pv(float (&o)[128], const uint32_t (&pa)[kKeys / 16][4], uint32_t vd) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
    wgmma::m64n256k16_rs_tb(o, pa[kk], wgmma::desc_sw128(vd + kk * 16 * 128, kColBlockBytes, 1024));
  wgmma::commit_group();
}

// Online softmax of the thread's 2 rows x kR / 2 keys of a tile, in place (log2 domain, scale folded into c_log2),
// in two steps so the warpgroups can exchange row maxima in between when they split the tile's keys:
// mask_and_max -- vis(hr, key in tile) false -> -inf, then the quad-reduced raw row max; softmax_update -- the new
// running max from mx, alpha (the factor O must be scaled by), exp2 in place, the thread's partial row sums.
template <int kR, typename Vis>
__device__ __forceinline__ void mask_and_max(float (&s)[kR], int q4, int col0, bool mask, const Vis& vis,
                                             float (&mx)[2]) {
  if (mask) {
#pragma unroll
    for (int i = 0; i < kR; ++i)
      if (!vis((i >> 1) & 1, col0 + acc_col(q4, i))) s[i] = -INFINITY;
  }
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int i = 0; i < kR; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
    mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
  }
}
template <int kR>
__device__ __forceinline__ void softmax_update(float (&s)[kR], const float (&mx)[2], float c_log2, float (&m)[2],
                                               float (&l)[2], float (&alpha)[2]) {
  float m_use[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const float m_new = fmaxf(m[hr], mx[hr] * c_log2);
    alpha[hr] = exp2f(m[hr] == -INFINITY ? -INFINITY : m[hr] - m_new);
    m[hr] = m_new;
    m_use[hr] = m_new == -INFINITY ? 0.f : m_new;
    l[hr] *= alpha[hr];
  }
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    s[i] = exp2f(fmaf(s[i], c_log2, -m_use[(i >> 1) & 1]));
    l[(i >> 1) & 1] += s[i];
  }
}

// P (bf16) as the A fragments of kR / 8 k16 steps (pa_elem: the m16n8k16 A layout).
template <int kR>
__device__ __forceinline__ void pack_p(const float (&s)[kR], uint32_t (&pa)[kR / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kR / 8; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) pa[kk][r] = pack_bf16(s[pa_elem(kk, r, 0)], s[pa_elem(kk, r, 1)]);
}

__device__ __forceinline__ void scale_o(float (&o)[128], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
}

// Two e4m3 codes (low byte first) x scale -> bf16x2: the hardware widening to f16 is exact (as the bit shift of
// fp8x2_e4m3_to_float2), then f32 x scale (one rounding) and bf16 RN -- the values mla_fp8_row_chunk gives the
// mma.sync kernel, from fewer instructions.
__device__ __forceinline__ uint32_t e4m3x2_scaled_bf16x2(uint32_t two, float scale) {
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(static_cast<uint16_t>(two)));
  __half2 h;
  *reinterpret_cast<uint32_t*>(&h) = h2;
  const float2 f = __half22float2(h);
  return pack_bf16(f.x * scale, f.y * scale);
}

// Half kHalf of the landed raw stage (codes + scales of 64 rows) -> the bf16 latent tile's column blocks
// 4 kHalf .. 4 kHalf + 3 (swizzled as tile_offset): 8 chunks of 8 codes a thread (mla_wgmma_layout.h,
// fp8_item_*). Zero-filled rows stay zero.
template <int kHalf>
__device__ __forceinline__ void dequant_half(uint32_t raw, uint32_t lat, int tid) {
#pragma unroll 4
  for (int k = 0; k < kFp8DequantHalfItems / kThreads; ++k) {
    const int i = tid + kThreads * k, row = fp8_item_row(i), chunk = fp8_item_chunk(kHalf, i);
    uint32_t c0, c1;
    float scale;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(c0), "=r"(c1) : "r"(raw + fp8_codes_offset(row, chunk)));
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(scale) : "r"(raw + fp8_scale_offset(row, chunk)));
    const uint32_t o0 = e4m3x2_scaled_bf16x2(c0 & 0xffffu, scale), o1 = e4m3x2_scaled_bf16x2(c0 >> 16, scale);
    const uint32_t o2 = e4m3x2_scaled_bf16x2(c1 & 0xffffu, scale), o3 = e4m3x2_scaled_bf16x2(c1 >> 16, scale);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(lat + tile_offset(row, chunk)), "r"(o0), "r"(o1),
                 "r"(o2), "r"(o3)
                 : "memory");
  }
}

#endif

// Grid (n_splits, ceil(tokens / tpc)). o_lat bf16 [tg, NH, 512] when n_splits == 1, else part_o f32
// [tg, n_splits, NH, 512] (normalized) and part_ml f32 [tg, n_splits, NH, 2] (max in log2 units, denominator).
// cache_raw: bf16 [n_slots, 576] rows, or (kFp8) packed FP8 rows u8 [n_slots, 656].
template <bool kSparse, bool kSplitS, bool kFp8>
__global__ void __launch_bounds__(kThreads, 1)
    mla_attend_wgmma_kernel(const bf16* __restrict__ q, const bf16* __restrict__ q_abs, const void* __restrict__ cache_raw,
                            const int32_t* __restrict__ topk, int64_t topk_width, const int32_t* __restrict__ token_seq,
                            const int32_t* __restrict__ kv_index, const int32_t* __restrict__ block_tables,
                            bf16* __restrict__ o_lat, float* __restrict__ part_o, float* __restrict__ part_ml,
                            int64_t t0, int64_t n_tok, int tpc, int n_splits, int64_t keys_per_split, MlaParams p,
                            AttentionParams ap) {
#ifdef MX_WGMMA_DEVICE
  extern __shared__ unsigned char smem_raw[];
  __shared__ int slot_seq[kM], slot_ctx[kM];
  // kSplitS: warpgroup cw scores keys [32 cw, +32) of each tile; row maxima, P fragments and the final row sums
  // are exchanged through these (written after one barrier, read after the next).
  constexpr int kSKeys = kSplitS ? kKeys / 2 : kKeys, kSR = kSKeys / 2;
  __shared__ float x_max[kSplitS ? 2 * kM : 1], x_sum[kSplitS ? 2 * kM : 1];
  __shared__ uint32_t x_p[kSplitS && !kFp8 ? 2 * 4 * 32 * 8 : 1];  // kFp8: in the dequantized raw stage
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t smem = (smem_base + 1023u) & ~1023u;
  const uint32_t q_smem = smem, ring = smem + kTileBytes;
  unsigned char* const smem_gen = smem_raw + (smem - smem_base);  // generic pointer of `smem`
  const bf16* const cache = static_cast<const bf16*>(cache_raw);
  const uint8_t* const cache8 = static_cast<const uint8_t*>(cache_raw);

  const int tid = threadIdx.x, lane = tid % 32, warp8 = tid / 32, q4 = lane % 4;
  const int cw = __shfl_sync(0xffffffffu, tid / 128, 0), warp = warp8 % 4;  // warpgroup, warp in it
  const int NH = p.n_heads, split = blockIdx.x, bs = ap.block_size;
  const int64_t tl0 = static_cast<int64_t>(blockIdx.y) * tpc;  // the CTA's first token (group-local)
  const int n_slots = static_cast<int>(min(static_cast<int64_t>(tpc), n_tok - tl0));
  if (tid < n_slots) {
    slot_seq[tid] = token_seq[t0 + tl0 + tid];
    slot_ctx[tid] = kv_index[t0 + tl0 + tid] + 1;
  }
  // Q = [q_abs | q_rope] of the 64 rows (zeros for padding rows), one cp.async group of its own.
  const int64_t q_stride = p.qk_nope_dim + kRope;
  for (int i = tid; i < kM * kChunks; i += kThreads) {
    const int m = i / kChunks, chunk = i % kChunks, slot = row_slot(m, NH), h = row_head(m, NH);
    const bool ok = m < tpc * NH && tl0 + slot < n_tok;
    const int64_t tl = tl0 + (ok ? slot : 0);
    const bf16* src = chunk < kLat / 8 ? q_abs + (tl * NH + h) * kLat + chunk * 8
                                       : q + ((t0 + tl) * NH + h) * q_stride + p.qk_nope_dim + (chunk - kLat / 8) * 8;
    cp_async16(q_smem + tile_offset(m, chunk), ok ? src : q, ok);
  }
  wgmma_tile::cp_async_commit();
  __syncthreads();  // slot_seq / slot_ctx

  const float c_log2 = p.scale * 1.4426950408889634f;
  int my_slot[2];
  MlaVisibility my_vis[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int m = acc_row(warp, lane, 2 * hr);
    my_slot[hr] = m < tpc * NH ? row_slot(m, NH) : kM;  // rows past the packed slots: padding
    my_vis[hr] = my_slot[hr] < n_slots ? mla_visibility(kv_index, ap, t0 + tl0 + my_slot[hr]) : MlaVisibility{0, 0, 0};
  }
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, s[kSR], alpha[2], mx[2];
  const int key0 = kSplitS ? kSKeys * cw : 0;  // the first tile key this warpgroup scores
  const int row0 = acc_row(warp, lane, 0);      // this thread's rows row0, row0 + 8
  uint32_t pa[kKeys / 16][4];
  uint32_t it = 0;  // ring position of the run's first tile
  for (int r = 0; r < n_slots;) {
    int rb = 0;
    int64_t n_items = 0, begin = 0, end = 0, run_min_ctx = 0;
    run_at<kSparse>(slot_seq, slot_ctx, n_slots, r, topk_width, &rb, &n_items, &run_min_ctx);
    split_range(split, n_splits, keys_per_split, n_items, &begin, &end);
    const int n_tiles = static_cast<int>((end - begin + kKeys - 1) / kKeys);
    const bool in_run[2] = {my_slot[0] >= r && my_slot[0] < rb, my_slot[1] >= r && my_slot[1] < rb};
    const bool single_full_run = r == 0 && rb == n_slots && n_slots * NH == kM;  // every wgmma row in this run
    const int64_t t = t0 + tl0 + r;
    const MlaVisibility tv = mla_visibility(kv_index, ap, t);  // sparse: the run's single token
    const int32_t* table = block_tables + static_cast<int64_t>(slot_seq[r]) * ap.max_blocks_per_seq;
    // Copies tile j of the run into stage (it + j) % 2 (one cp.async group): dense, every key below the run's
    // largest context (a row that may not see it masks it); sparse, the token's visible top-k entries (an invalid
    // entry is zero-filled and never looked up in the block table).
    auto load_tile = [&](int j) {
      const int64_t item = begin + static_cast<int64_t>(j) * kKeys + load_lookup_row(warp8, lane);
      long long slot = -1;
      if (item < end) {
        const int64_t key = kSparse ? static_cast<int64_t>(topk[t * topk_width + item]) : item;
        if (!kSparse || tv(key)) slot = mla_slot(table, key, bs);
      }
      const uint32_t stage = static_cast<uint32_t>((it + j) % kStages);
      const uint32_t base = ring + stage * kTileBytes;
#pragma unroll
      for (int i = 0; i < kRowsPerLoadWarp; ++i) {
        const long long sl = __shfl_sync(0xffffffffu, slot, i);
        const int row = load_row(warp8, i);
        if constexpr (kFp8) {  // 41 chunks: codes + scales -> the raw ring, the bf16 rope tail -> the rope block
          const uint8_t* src = cache8 + (sl >= 0 ? sl * kFp8Row : 0);
          const uint32_t raw = smem + kFp8RawOff + stage * kFp8RawStageBytes;
          const uint32_t rope = smem + kFp8RopeOff + stage * kColBlockBytes;
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int ch = load_chunk(lane, c);
            if (ch < kFp8Chunks)
              cp_async16(ch < kFp8QuantChunks ? raw + fp8_raw_offset(row, ch) : rope + fp8_rope_offset(row, ch),
                         src + ch * 16, sl >= 0);
          }
        } else {
          const bf16* src = cache + (sl >= 0 ? sl * kRow : 0);
#pragma unroll
          for (int c = 0; c < 3; ++c) {
            const int chunk = load_chunk(lane, c);
            if (chunk < kChunks) cp_async16(base + tile_offset(row, chunk), src + chunk * 8, sl >= 0);
          }
        }
      }
      wgmma_tile::cp_async_commit();
    };
    auto softmax_of = [&](int j) {
      const int64_t k0 = begin + static_cast<int64_t>(j) * kKeys;
      const bool mask = tile_needs_mask(kSparse, single_full_run, ap.tree_mask != nullptr, k0, run_min_ctx, end);
      if (kSparse) {
        mask_and_max(s, q4, key0, mask,
                     [&](int hr, int col) {
                       const int64_t item = k0 + col;
                       return in_run[hr] && item < end && tv(static_cast<int64_t>(topk[t * topk_width + item]));
                     },
                     mx);
      } else {
        mask_and_max(s, q4, key0, mask,
                     [&](int hr, int col) {
                       const int64_t key = k0 + col;
                       return in_run[hr] && key < end && my_vis[hr](key);
                     },
                     mx);
      }
      if constexpr (kSplitS) {  // the row max over both halves of the tile
        if (q4 == 0) {
          x_max[cw * kM + row0] = mx[0];
          x_max[cw * kM + row0 + 8] = mx[1];
        }
        __syncthreads();
        mx[0] = fmaxf(mx[0], x_max[(cw ^ 1) * kM + row0]);
        mx[1] = fmaxf(mx[1], x_max[(cw ^ 1) * kM + row0 + 8]);
      }
      softmax_update(s, mx, c_log2, m_run, l_run, alpha);
    };
    // P of the whole tile as this thread's A fragments: kSplitS packs its own half and takes the other
    // warpgroup's half (same warp, same lane: the same rows and in-slice columns) through shared memory.
    auto make_p = [&](uint32_t* xp) {
      if constexpr (kSplitS) {
        uint32_t own[kSR / 8][4];
        pack_p(s, own);
        uint32_t* mine = xp + ((cw * 4 + warp) * 32 + lane) * 8;
#pragma unroll
        for (int i = 0; i < 8; ++i) mine[i] = own[i / 4][i % 4];
        __syncthreads();
        const uint32_t* other = xp + (((cw ^ 1) * 4 + warp) * 32 + lane) * 8;
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
          for (int r = 0; r < 4; ++r) pa[kk][r] = kk / 2 == cw ? own[kk % 2][r] : other[(kk % 2) * 4 + r];
      } else {
        pack_p(s, pa);
      }
    };
    // Double buffer: tile j + 1 is in flight while tile j multiplies; the barrier after P V(j) frees stage j for
    // tile j + 2. (The first wait also covers Q's group.)
    if (n_tiles > 0) load_tile(0);
    for (int j = 0; j < n_tiles; ++j) {
      if (j + 1 < n_tiles) {
        load_tile(j + 1);
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
      } else {
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
      }
      const uint32_t stage = static_cast<uint32_t>((it + j) % kStages);
      const uint32_t kd = kFp8 ? smem + kFp8LatOff : ring + stage * kTileBytes;
      const uint32_t kd8 = kFp8 ? smem + kFp8RopeOff + stage * kColBlockBytes : kd + 8 * kColBlockBytes;
      if constexpr (kFp8) {
        // Every thread's copies of tile j landed -> dequantize column blocks 0..3, score over them (async) while
        // blocks 4..7 are dequantized, then the rest of the score (same k order as the bf16 path).
        const uint32_t raw = smem + kFp8RawOff + stage * kFp8RawStageBytes;
        __syncthreads();
        dequant_half<0>(raw, kd, tid);
        wgmma::fence_proxy_async_smem();  // st.shared (generic proxy) writes -> wgmma (async proxy) reads
        __syncthreads();
        wgmma::fence();
        issue_qk<kSKeys, 0, kLat / 32>(s, q_smem, kd + key0 * 128, kd8 + key0 * 128);
        dequant_half<1>(raw, kd, tid);
        wgmma::fence_proxy_async_smem();  // + the rope block's cp.async writes
        __syncthreads();
        wgmma::fence();
        issue_qk<kSKeys, kLat / 32, kRow / 16>(s, q_smem, kd + key0 * 128, kd8 + key0 * 128);
      } else {
        wgmma::fence_proxy_async_smem();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
        __syncthreads();
        wgmma::fence();
        issue_qk<kSKeys>(s, q_smem, kd + key0 * 128, kd8 + key0 * 128);
      }
      wgmma::wait_group<0>();
      wgmma::fence_regs(s);
      softmax_of(j);
      scale_o(o, alpha);
      // kFp8: the raw stage of tile j is free until tile j + 2 is copied into it (after the closing barrier).
      make_p(kFp8 ? reinterpret_cast<uint32_t*>(smem_gen + kFp8RawOff + stage * kFp8RawStageBytes) : x_p);
      wgmma::fence();
      issue_pv(o, pa, kd + 4 * cw * kColBlockBytes);
      wgmma::wait_group<0>();
      wgmma::fence_regs(o);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) wgmma::fence_regs(pa[kk]);
      __syncthreads();  // both warpgroups are done with stage j before tile j + 2 is copied into it
    }
    it += n_tiles;
    r = rb;
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // Q's group when no tile ran

#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    l_run[hr] += __shfl_xor_sync(0xffffffffu, l_run[hr], 1);
    l_run[hr] += __shfl_xor_sync(0xffffffffu, l_run[hr], 2);
  }
  if constexpr (kSplitS) {  // each warpgroup summed its own keys (same running max): add the other's sums
    if (q4 == 0) {
      x_sum[cw * kM + row0] = l_run[0];
      x_sum[cw * kM + row0 + 8] = l_run[1];
    }
    __syncthreads();
    l_run[0] += x_sum[(cw ^ 1) * kM + row0];
    l_run[1] += x_sum[(cw ^ 1) * kM + row0 + 8];
  }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    if (my_slot[hr] >= n_slots) continue;
    const int h = row_head(acc_row(warp, lane, 2 * hr), NH);
    const int64_t tl = tl0 + my_slot[hr];
    const float inv = l_run[hr] > 0.f ? 1.f / l_run[hr] : 0.f;
    if (n_splits == 1) {
      bf16* dst = o_lat + (tl * NH + h) * kLat + 256 * cw;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<uint32_t*>(dst + acc_col(lane, 4 * j)) =
            pack_bf16(o[4 * j + 2 * hr] * inv, o[4 * j + 2 * hr + 1] * inv);
    } else {
      const int64_t part = (tl * n_splits + split) * NH + h;
      float* dst = part_o + part * kLat + 256 * cw;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(dst + acc_col(lane, 4 * j)) =
            make_float2(o[4 * j + 2 * hr] * inv, o[4 * j + 2 * hr + 1] * inv);
      if (cw == 0 && q4 == 0) {
        part_ml[2 * part] = m_run[hr];
        part_ml[2 * part + 1] = l_run[hr];
      }
    }
  }
#else
  __trap();  // built for a device without wgmma: the host never launches it there
#endif
}

// Grid (tokens of the group, heads): o_lat = sum_s w_s o_s / sum_s w_s, w_s = l_s 2^(m_s - M), bf16 out.
__global__ void mla_wgmma_combine_kernel(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                         bf16* __restrict__ o_lat, int n_splits, int n_heads) {
  __shared__ float w_s[kMaxSplits];
  __shared__ float inv_s;
  const int64_t tl = blockIdx.x;
  const int h = blockIdx.y;
  const float* ml = part_ml + (tl * n_splits * n_heads + h) * 2;
  if (threadIdx.x == 0) {
    float M = -INFINITY;
    for (int s = 0; s < n_splits; ++s)
      if (ml[s * n_heads * 2 + 1] > 0.f) M = fmaxf(M, ml[s * n_heads * 2]);
    float denom = 0.f;
    for (int s = 0; s < n_splits; ++s) {
      const float l = ml[s * n_heads * 2 + 1];
      w_s[s] = l > 0.f ? l * exp2f(ml[s * n_heads * 2] - M) : 0.f;
      denom += w_s[s];
    }
    inv_s = denom > 0.f ? 1.f / denom : 0.f;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < kLat; c += blockDim.x) {
    float v = 0.f;
    for (int s = 0; s < n_splits; ++s)
      if (w_s[s] != 0.f) v += w_s[s] * part_o[((tl * n_splits + s) * n_heads + h) * kLat + c];
    o_lat[(tl * n_heads + h) * kLat + c] = to_bf16(v * inv_s);
  }
}

int sm_count() {
  static std::atomic<int> cached{0};
  int n = cached.load();
  if (n == 0) {
    int dev = 0;
    MX_CUDA_CHECK(cudaGetDevice(&dev));
    MX_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    cached.store(n);
  }
  return n;
}

// Compute capability of the current device (cached per device); 0 where none can be queried.
int device_sm() {
  static std::atomic<int> cached[64];
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return 0;
  }
  if (const int c = cached[dev].load(); c != 0) return c;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  cached[dev].store(major * 10 + minor);
  return major * 10 + minor;
}

int64_t part_rows_bound(int64_t group_tokens, int n_heads, int forced_splits) {
  int64_t bound = 0;
  for (const bool sparse : {false, true}) {
    const int64_t tpc = tokens_per_cta(n_heads, sparse), ctas = (group_tokens + tpc - 1) / tpc;
    const int64_t splits = forced_splits > 0 ? std::min(forced_splits, kMaxSplits)
                           : ctas < sm_count() ? std::min<int64_t>(std::max<int64_t>(sm_count() / ctas, 1), kMaxSplits)
                                               : 1;
    if (splits > 1) bound = std::max(bound, ctas * tpc * splits * n_heads);
  }
  return bound;
}

}  // namespace

bool mla_attend_wgmma_supported(const MlaParams& p, const char** why) {
  const char* reason = nullptr;
  if (p.kv_lora_rank != kLat || p.qk_rope_dim != kRope) reason = "kv_lora_rank / qk_rope_dim are not 512 / 64";
  else if (p.n_heads < 1 || p.n_heads > kM) reason = "more than 64 heads per rank";
  else if (p.qk_nope_dim % 32 != 0 || p.v_dim % 64 != 0) reason = "qk_nope_dim % 32 or v_dim % 64 (absorb GEMMs)";
  else if (device_sm() != 90) reason = "the device is not sm_90 (wgmma is Hopper-only)";
  if (why != nullptr) *why = reason;
  return reason == nullptr;
}

MlaSplitPlan mla_attend_wgmma_split_plan(int64_t group_tokens, int64_t max_items, const MlaParams& p, bool sparse,
                                         int forced_splits, const AttentionSplitTable* table) {
  const int64_t tpc = tokens_per_cta(p.n_heads, sparse), ctas = (group_tokens + tpc - 1) / tpc;
  int tuned = 0;
  if (forced_splits <= 0 && table != nullptr) {
    // One wave of CTAs at most: the workspace bound (part_rows_bound) assumes it.
    tuned = std::min<int>(lookup_attention_splits(*table, group_tokens, max_items),
                          static_cast<int>(std::max<int64_t>(1, sm_count() / std::max<int64_t>(ctas, 1))));
  }
  SplitPlan sp = split_plan(ctas, max_items, sm_count(), forced_splits > 0 ? forced_splits : tuned);
  if (forced_splits <= 0 && tuned > 0) {  // a tuned count drops the trailing splits its rounding leaves empty
    sp.n_splits = static_cast<int>((std::max<int64_t>(max_items, 1) + sp.keys_per_split - 1) / sp.keys_per_split);
  }
  MlaSplitPlan plan;
  plan.n_splits = sp.n_splits;
  plan.keys_per_split = sp.keys_per_split;
  return plan;
}

size_t mla_attend_wgmma_workspace_bytes(int64_t group_tokens, const MlaParams& p, int forced_splits) {
  return static_cast<size_t>(part_rows_bound(group_tokens, p.n_heads, forced_splits)) * (kLat + 2) * sizeof(float);
}

void mla_attend_wgmma(const void* q, const void* q_abs, const void* latent_cache, const int32_t* topk,
                      int64_t topk_width, const int32_t* token_seq, const int32_t* kv_index,
                      const int32_t* block_tables, void* o_lat, int64_t t0, int64_t group_tokens, int64_t max_items,
                      const MlaParams& p, const AttentionParams& ap, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream, int forced_splits, const AttentionSplitTable* table, bool split_s) {
  if (group_tokens == 0) return;
  const char* why = nullptr;
  MX_CHECK_MSG(mla_attend_wgmma_supported(p, &why), "mla_attend_wgmma: " << why << " (dispatch bug)");
  const bool sparse = topk != nullptr;
  const int tpc = tokens_per_cta(p.n_heads, sparse);
  const MlaSplitPlan plan = mla_attend_wgmma_split_plan(group_tokens, max_items, p, sparse, forced_splits, table);
  const int64_t ctas = (group_tokens + tpc - 1) / tpc;
  MX_CHECK_MSG(ctas < 65536, "mla_attend_wgmma: " << ctas << " token CTAs (grid y < 65536)");
  const int64_t part_rows = plan.n_splits > 1 ? group_tokens * plan.n_splits * p.n_heads : 0;
  const size_t need = static_cast<size_t>(part_rows) * (kLat + 2) * sizeof(float);
  MX_CHECK_MSG(need <= workspace_bytes, "mla_attend_wgmma: workspace " << workspace_bytes << " bytes < " << need
                                                                       << " for " << group_tokens << " tokens x "
                                                                       << plan.n_splits << " splits");
  float* part_o = static_cast<float*>(workspace);
  float* part_ml = part_o + part_rows * kLat;
  static std::atomic<uint64_t> configured{0};  // one bit per device (the attribute is per device context)
  int dev = 0;
  MX_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev & 63);
  using Kernel = void (*)(const bf16*, const bf16*, const void*, const int32_t*, int64_t, const int32_t*,
                         const int32_t*, const int32_t*, bf16*, float*, float*, int64_t, int64_t, int, int, int64_t,
                         MlaParams, AttentionParams);
  // [fp8][sparse][split_s]
  static const Kernel kKernels[2][2][2] = {
      {{mla_attend_wgmma_kernel<false, false, false>, mla_attend_wgmma_kernel<false, true, false>},
       {mla_attend_wgmma_kernel<true, false, false>, mla_attend_wgmma_kernel<true, true, false>}},
      {{mla_attend_wgmma_kernel<false, false, true>, mla_attend_wgmma_kernel<false, true, true>},
       {mla_attend_wgmma_kernel<true, false, true>, mla_attend_wgmma_kernel<true, true, true>}}};
  if ((configured.load() & bit) == 0) {
    for (int f8 = 0; f8 < 2; ++f8)
      for (const auto& by_sparse : kKernels[f8])
        for (const Kernel f : by_sparse)
          MX_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(f),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(f8 ? kSmemBytesFp8 : kSmemBytes)));
    configured.fetch_or(bit);
  }
  const dim3 grid(static_cast<unsigned>(plan.n_splits), static_cast<unsigned>(ctas));
  const Kernel kernel = kKernels[p.fp8_cache ? 1 : 0][sparse ? 1 : 0][split_s ? 1 : 0];
  kernel<<<grid, kThreads, p.fp8_cache ? kSmemBytesFp8 : kSmemBytes, stream>>>(
      static_cast<const bf16*>(q), static_cast<const bf16*>(q_abs), latent_cache, topk,
      topk_width, token_seq, kv_index, block_tables, static_cast<bf16*>(o_lat), part_o, part_ml, t0, group_tokens, tpc,
      plan.n_splits, plan.keys_per_split, p, ap);
  MX_CUDA_CHECK_LAUNCH();
  if (plan.n_splits == 1) return;
  const dim3 cgrid(static_cast<unsigned>(group_tokens), static_cast<unsigned>(p.n_heads));
  mla_wgmma_combine_kernel<<<cgrid, 128, 0, stream>>>(part_o, part_ml, static_cast<bf16*>(o_lat), plan.n_splits,
                                                       p.n_heads);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
