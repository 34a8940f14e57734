// Hopper (sm_90a) attend step of absorbed MLA for sparse (DSA top-k) PREFILL rows, bf16 latent cache:
// o_lat[t, h, :] = softmax_j((q_abs . latent_j + q_rope . k_rope_j) * scale) latent_j over the token's top-k keys --
// the formula of the SIMT oracle (mla_attention.cu) and of the decode kernels (mla_decode_mma.cu,
// mla_decode_wgmma.cu). Selected by MlaAttendKernel::kWgmmaPrefill, or by kAuto for launches of at least
// kMlaSparsePrefillMinTokens sparse rows once kMlaAutoSparsePrefill is on (mla_dsa.h).
// Prefill is the opposite regime of decode: thousands of tokens, each with its own top-k set (2,048 gathered latent
// rows of 576 bf16), so there is no split-KV, no partials and no combine: one CTA per token (grid x = the token,
// so the CTAs resident at one time run neighbouring tokens, whose top-k sets mostly coincide: the gathered rows hit
// L2), all of the rank's heads (1..64) in the 64 wgmma rows (rows >= n_heads are zero-filled in shared memory,
// never read from HBM), o_lat written in bf16 by the CTA itself.
// Per CTA: the token's visible top-k entries are scanned once (the last visible entry bounds the tiles walked, so a
// token whose context is shorter than top_k walks only its own keys); Q = [q_abs | q_rope] (72 KB) stays in shared
// memory; 64-key latent tiles (72 KB, 9 column blocks of 128B-swizzled rows, mla_wgmma_layout.h) are gathered by
// cp.async into a 2-stage ring (tile j + 1 in flight while tile j multiplies; three schedules, kSched below), the
// loader also records which rows
// of the tile are visible keys (a -1 entry, an entry past the context or masked by the tree: zero-filled, masked).
// The two warpgroups score one half of the tile's keys each (36 x m64n32k16, both operands in shared memory),
// exchange row maxima and bf16 P fragments through shared memory, and each accumulates its 256 latent output
// columns (O += P V, 4 x m64n256k16, P from registers, V = the same tile read MN-major): the kWgmmaSplitS schedule
// of the decode kernel, whose device helpers are copied here (that file is not shared).
// Smem 216 KB + 1 KB alignment: one CTA per SM. The launcher never allocates nor synchronizes (graph capturable).
#include <cuda_bf16.h>

#include <atomic>
#include <cmath>

#include "core/check.h"
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

constexpr int kThreads = 256;                                                   // 2 warpgroups
constexpr int kHalfKeys = kKeys / 2;                                            // keys each warpgroup scores
constexpr size_t kSmemBytes = kTileBytes /* Q */ + kStages * kTileBytes + 1024;  // + alignment slack

#ifdef MX_WGMMA_DEVICE
using wgmma_tile::cp_async16;
using wgmma_tile::pack_bf16;

// S (64 rows x 32 keys starting at tile row kd's) = Q K^T over the 576 dims: 36 k16 steps, K-major operands.
__device__ __forceinline__ void issue_qk(float (&s)[kHalfKeys / 2], uint32_t qd, uint32_t kd) {
#pragma unroll
  for (int ks = 0; ks < kRow / 16; ++ks) {
    const uint32_t off = (ks / 4) * kColBlockBytes + (ks % 4) * 32u;
    wgmma::m64n32k16_ss(s, wgmma::desc_sw128(qd + off, 16, 1024), wgmma::desc_sw128(kd + off, 16, 1024),
                        ks > 0 ? 1 : 0);
  }
  wgmma::commit_group();
}

// O (64 rows x latent dims [256 cw, +256)) += P V over the tile's 64 keys (V MN-major: LBO = column-block stride).
__device__ __forceinline__ void issue_pv(float (&o)[128], const uint32_t (&pa)[kKeys / 16][4], uint32_t vd) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
    wgmma::m64n256k16_rs_tb(o, pa[kk], wgmma::desc_sw128(vd + kk * 16 * 128, kColBlockBytes, 1024));
  wgmma::commit_group();
}

__device__ __forceinline__ void scale_o(float (&o)[128], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
}
#endif

// The three schedules (kSched; the comment above the tile loop has the details). All do the same arithmetic in the
// same order: their outputs are bitwise equal.
constexpr int kSchedPlain = 0, kSchedOverlapPv = 1, kSchedEarlyGather = 2;

// Grid (tokens of the group). o_lat bf16 [n_tok, NH, 512] (group-local rows), q_abs bf16 [n_tok, NH, 512].
template <int kSched>
__global__ void __launch_bounds__(kThreads, 1)
    mla_sparse_prefill_wgmma_kernel(const bf16* __restrict__ q, const bf16* __restrict__ q_abs,
                                    const bf16* __restrict__ cache, const int32_t* __restrict__ topk,
                                    int64_t topk_width, const int32_t* __restrict__ token_seq,
                                    const int32_t* __restrict__ kv_index, const int32_t* __restrict__ block_tables,
                                    bf16* __restrict__ o_lat, int64_t t0, MlaParams p, AttentionParams ap) {
#ifdef MX_WGMMA_DEVICE
  constexpr bool kOverlapPv = kSched != kSchedPlain, kEarly = kSched == kSchedEarlyGather;
  extern __shared__ unsigned char smem_raw[];
  __shared__ float x_max[2 * kM], x_sum[2 * kM];  // row maxima / final row sums, one slice per warpgroup
  __shared__ uint32_t x_p[2 * 4 * 32 * 8];         // P fragments of each (warpgroup, warp, lane)
  __shared__ uint8_t key_ok[kStages][kKeys];       // tile row r of stage s holds a visible key (written by its loader)
  __shared__ int last_item;                        // the last visible top-k entry of the token (-1: none)
  const uint32_t smem = (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const uint32_t q_smem = smem, ring = smem + kTileBytes;

  const int tid = threadIdx.x, lane = tid % 32, warp8 = tid / 32, q4 = lane % 4;
  const int cw = __shfl_sync(0xffffffffu, tid / 128, 0), warp = warp8 % 4;  // warpgroup, warp in it
  const int NH = p.n_heads, bs = ap.block_size;
  const int64_t tl = blockIdx.x, t = t0 + tl;
  if (tid == 0) last_item = -1;

  // Q = [q_abs | q_rope] of the n_heads rows; rows >= n_heads are zero-filled (no global read).
  const int64_t q_stride = p.qk_nope_dim + kRope;
  for (int i = tid; i < kM * kChunks; i += kThreads) {
    const int m = i / kChunks, chunk = i % kChunks;
    const bool ok = m < NH;
    const int h = ok ? m : 0;
    const bf16* src = chunk < kLat / 8 ? q_abs + (tl * NH + h) * kLat + chunk * 8
                                       : q + (t * NH + h) * q_stride + p.qk_nope_dim + (chunk - kLat / 8) * 8;
    cp_async16(q_smem + tile_offset(m, chunk), ok ? src : q, ok);
  }
  wgmma_tile::cp_async_commit();

  const MlaVisibility tv = mla_visibility(kv_index, ap, t);
  const int32_t* table = block_tables + static_cast<int64_t>(token_seq[t]) * ap.max_blocks_per_seq;
  const int32_t* row_topk = topk + t * topk_width;
  __syncthreads();  // last_item initialized
  {
    int last = -1;
    for (int64_t i = tid; i < topk_width; i += kThreads)
      if (tv(static_cast<int64_t>(row_topk[i]))) last = static_cast<int>(i);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, off));
    if (lane == 0 && last >= 0) atomicMax(&last_item, last);
  }
  __syncthreads();
  const int64_t n_items = static_cast<int64_t>(last_item) + 1;
  const int n_tiles = static_cast<int>((n_items + kKeys - 1) / kKeys);

  const float c_log2 = p.scale * 1.4426950408889634f;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, s[kHalfKeys / 2], alpha[2], mx[2];
  const int key0 = kHalfKeys * cw;         // the first tile key this warpgroup scores
  const int row0 = acc_row(warp, lane, 0);  // this thread's rows row0, row0 + 8
  uint32_t pa[kKeys / 16][4] = {};

  // Tile j -> stage j % 2 (one cp.async group): lane i < 8 of warp w looks up tile row w + 8 i (top-k entry, block
  // table) and records whether it is a visible key; invisible rows are zero-filled and never looked up.
  auto load_tile = [&](int j) {
    const int stage = j % kStages;
    const int64_t item = static_cast<int64_t>(j) * kKeys + load_lookup_row(warp8, lane);
    long long slot = -1;
    if (item < n_items) {
      const int64_t key = static_cast<int64_t>(row_topk[item]);
      if (tv(key)) slot = mla_slot(table, key, bs);
    }
    if (lane < kRowsPerLoadWarp) key_ok[stage][load_row(warp8, lane)] = slot >= 0 ? 1 : 0;
    const uint32_t base = ring + static_cast<uint32_t>(stage) * kTileBytes;
#pragma unroll
    for (int i = 0; i < kRowsPerLoadWarp; ++i) {
      const long long sl = __shfl_sync(0xffffffffu, slot, i);
      const int row = load_row(warp8, i);
      const bf16* src = cache + (sl >= 0 ? sl * kRow : 0);
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        const int chunk = load_chunk(lane, c);
        if (chunk < kChunks) cp_async16(base + tile_offset(row, chunk), src + chunk * 8, sl >= 0);
      }
    }
    wgmma_tile::cp_async_commit();
  };

  // kEarly: warpgroup cw gathers only the parts of a tile that nothing but itself reads after the scores: latent
  // column blocks [4 cw, +4) (its P V operand) and rope chunks [4 cw, +4) of block 8; the two halves make the tile
  // (eg_row / eg_chunk, mla_wgmma_layout.h: warp w copies rows w + 4 i, lane l its chunks l and l + 32 of each). The
  // top-k entry of row w + 4 l (lane l < 16) is fetched two tiles ahead and its slot one tile ahead (ew_key /
  // ew_slot), so the dependent loads never sit between a tile's scores and its gather. Warpgroup 0 writes key_ok.
  const int ew_row = eg_row(warp, lane % kEgRowsPerWarp);
  auto ew_key = [&](int j) -> int32_t {
    const int64_t item = static_cast<int64_t>(j) * kKeys + ew_row;
    return j < n_tiles && item < n_items ? row_topk[item] : -1;
  };
  auto ew_slot = [&](int32_t key) -> long long {
    return tv(static_cast<int64_t>(key)) ? mla_slot(table, key, bs) : -1;
  };
  auto ew_gather = [&](int j, long long slot) {
    const int stage = j % kStages;
    if (cw == 0 && lane < kEgRowsPerWarp) key_ok[stage][ew_row] = slot >= 0 ? 1 : 0;
    const uint32_t base = ring + static_cast<uint32_t>(stage) * kTileBytes;
#pragma unroll
    for (int i = 0; i < kEgRowsPerWarp; ++i) {
      const long long sl = __shfl_sync(0xffffffffu, slot, i);
      const int row = eg_row(warp, i);
      const bf16* src = cache + (sl >= 0 ? sl * kRow : 0);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int chunk = eg_chunk(cw, lane, c);
        if (chunk >= 0) cp_async16(base + tile_offset(row, chunk), src + chunk * 8, sl >= 0);
      }
    }
    wgmma_tile::cp_async_commit();
  };
  long long ew_next_slot = -1;  // kEarly: the slot of this lane's row of the next tile to gather
  int32_t ew_next_key = -1;     // kEarly: the entry of this lane's row of the tile after that

  // Schedule (all three orders do the same arithmetic, so their outputs are bitwise equal):
  //   kOverlapPv false (the decode kernel's order): issue the gather of tile j + 1 into the other stage (freed by
  //     the barrier that closed iteration j - 1), wait for tile j, barrier, S, softmax, P V(j), wait for it, barrier.
  //     While a thread waits for tile j, tiles j and j + 1 are both in flight.
  //   kOverlapPv true: P V(j) is left in flight into the next iteration, where the tensor cores run it back to back
  //     with S(j + 1), and the closing barrier is gone; the gather of tile j + 1 is issued after the row-max barrier
  //     of iteration j (the first point where both warpgroups have waited for P V(j - 1), the last reader of its
  //     stage): a shorter lead, one tile in flight while a thread waits.
  //   kSchedEarlyGather: the overlap-PV order, but each warpgroup gathers its own half of tile j + 1 (ew_gather)
  //     as soon as its own P V(j - 1) has completed (wgmma.wait_group 1 right behind S(j)), with no barrier: the
  //     gather runs under S(j), the softmax and P V(j) (a longer lead), and no lookup latency sits in the loop.
  //     Safe without a barrier: the other warpgroup's last reads of those bytes (its S(j - 1)) ended before the
  //     row-max barrier of iteration j - 1, and its P V(j - 1) reads only its own column blocks.
  if constexpr (kEarly) {
    if (n_tiles > 0) ew_gather(0, ew_slot(ew_key(0)));
    if (n_tiles > 1) ew_gather(1, ew_slot(ew_key(1)));  // stage 1 is free from the start
    ew_next_slot = ew_slot(ew_key(2));
    ew_next_key = ew_key(3);
  } else if (n_tiles > 0) {
    load_tile(0);
  }
  for (int j = 0; j < n_tiles; ++j) {
    if (kEarly && j == 0 && n_tiles > 1) {
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // tile 0 and Q (tile 1 left in flight)
    } else if (!kOverlapPv && j + 1 < n_tiles) {
      load_tile(j + 1);
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // tile j (and Q on the first tile)
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    }
    wgmma::fence_proxy_async_smem();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
    __syncthreads();                  // tile j and key_ok[j % 2] complete for every thread
    const int stage = j % kStages;
    const uint32_t kd = ring + static_cast<uint32_t>(stage) * kTileBytes;
    wgmma::fence();
    issue_qk(s, q_smem, kd + key0 * 128);
    if constexpr (kEarly) {
      if (j > 0 && j + 1 < n_tiles) {
        wgmma::wait_group<1>();  // this warpgroup's P V(j - 1) (groups retire in order): its half of the stage is free
        ew_gather(j + 1, ew_next_slot);
        ew_next_slot = ew_slot(ew_next_key);  // tile j + 2 (entry fetched an iteration ago)
        ew_next_key = ew_key(j + 3);
      }
    }
    wgmma::wait_group<0>();  // kOverlapPv: P V(j - 1) as well
    wgmma::fence_regs(s);
    if constexpr (kOverlapPv) {
      wgmma::fence_regs(o);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) wgmma::fence_regs(pa[kk]);
    }
    // Mask invisible keys, this warpgroup's row maxima, then the maxima over both halves of the tile.
#pragma unroll
    for (int i = 0; i < kHalfKeys / 2; ++i)
      if (key_ok[stage][key0 + acc_col(q4, i)] == 0) s[i] = -INFINITY;
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int i = 0; i < kHalfKeys / 2; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
      mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
    }
    if (q4 == 0) {
      x_max[cw * kM + row0] = mx[0];
      x_max[cw * kM + row0 + 8] = mx[1];
    }
    __syncthreads();  // kOverlapPv: both warpgroups are past P V(j - 1): its stage takes tile j + 1
    if (kOverlapPv && !kEarly && j + 1 < n_tiles) load_tile(j + 1);
    mx[0] = fmaxf(mx[0], x_max[(cw ^ 1) * kM + row0]);
    mx[1] = fmaxf(mx[1], x_max[(cw ^ 1) * kM + row0 + 8]);
    // Online softmax (log2 domain, scale folded into c_log2): a row with no visible key so far keeps m = -inf,
    // alpha 0 and p 0 (no NaN).
    float m_use[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float m_new = fmaxf(m_run[hr], mx[hr] * c_log2);
      alpha[hr] = exp2f(m_run[hr] == -INFINITY ? -INFINITY : m_run[hr] - m_new);
      m_run[hr] = m_new;
      m_use[hr] = m_new == -INFINITY ? 0.f : m_new;
      l_run[hr] *= alpha[hr];
    }
#pragma unroll
    for (int i = 0; i < kHalfKeys / 2; ++i) {
      s[i] = exp2f(fmaf(s[i], c_log2, -m_use[(i >> 1) & 1]));
      l_run[(i >> 1) & 1] += s[i];
    }
    scale_o(o, alpha);
    // P of the whole tile as this thread's A fragments: its own half packed here, the other warpgroup's half (same
    // warp and lane: the same rows and in-slice columns) through shared memory.
    uint32_t own[kHalfKeys / 16][4];
#pragma unroll
    for (int kk = 0; kk < kHalfKeys / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) own[kk][r] = pack_bf16(s[pa_elem(kk, r, 0)], s[pa_elem(kk, r, 1)]);
    uint32_t* mine = x_p + ((cw * 4 + warp) * 32 + lane) * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) mine[i] = own[i / 4][i % 4];
    __syncthreads();
    const uint32_t* other = x_p + (((cw ^ 1) * 4 + warp) * 32 + lane) * 8;
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[kk][r] = kk / 2 == cw ? own[kk % 2][r] : other[(kk % 2) * 4 + r];
    wgmma::fence();
    issue_pv(o, pa, kd + 4 * cw * kColBlockBytes);
    if constexpr (!kOverlapPv) {
      wgmma::wait_group<0>();
      wgmma::fence_regs(o);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) wgmma::fence_regs(pa[kk]);
      __syncthreads();  // both warpgroups are done with stage j before tile j + 2 is gathered into it
    }
  }
  if constexpr (kOverlapPv) {  // the last P V
    wgmma::wait_group<0>();
    wgmma::fence_regs(o);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) wgmma::fence_regs(pa[kk]);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // Q's group when no tile ran

#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    l_run[hr] += __shfl_xor_sync(0xffffffffu, l_run[hr], 1);
    l_run[hr] += __shfl_xor_sync(0xffffffffu, l_run[hr], 2);
  }
  if (q4 == 0) {  // each warpgroup summed its own keys (same running max): add the other's sums
    x_sum[cw * kM + row0] = l_run[0];
    x_sum[cw * kM + row0 + 8] = l_run[1];
  }
  __syncthreads();
  l_run[0] += x_sum[(cw ^ 1) * kM + row0];
  l_run[1] += x_sum[(cw ^ 1) * kM + row0 + 8];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int h = acc_row(warp, lane, 2 * hr);
    if (h >= NH) continue;  // padding rows of a rank with fewer than 64 heads
    const float inv = l_run[hr] > 0.f ? 1.f / l_run[hr] : 0.f;  // no visible key: zeros, as the SIMT oracle
    bf16* dst = o_lat + (tl * NH + h) * kLat + 256 * cw;
#pragma unroll
    for (int jj = 0; jj < 32; ++jj)
      *reinterpret_cast<uint32_t*>(dst + acc_col(lane, 4 * jj)) =
          pack_bf16(o[4 * jj + 2 * hr] * inv, o[4 * jj + 2 * hr + 1] * inv);
  }
#else
  __trap();  // built for a device without wgmma: the host never launches it there
#endif
}

}  // namespace

void mla_sparse_prefill_wgmma(const void* q, const void* q_abs, const void* latent_cache, const int32_t* topk,
                              int64_t topk_width, const int32_t* token_seq, const int32_t* kv_index,
                              const int32_t* block_tables, void* o_lat, int64_t t0, int64_t group_tokens,
                              const MlaParams& p, const AttentionParams& ap, cudaStream_t stream, bool overlap_pv,
                              bool early_gather) {
  if (group_tokens == 0) return;
  const char* why = nullptr;
  MX_CHECK_MSG(mla_attend_wgmma_supported(p, &why), "mla_sparse_prefill_wgmma: " << why << " (dispatch bug)");
  MX_CHECK_MSG(topk != nullptr && topk_width > 0,
               "mla_sparse_prefill_wgmma: needs top-k rows (a top-k list per token); dense rows run mla_attend_wgmma");
  MX_CHECK_MSG(!p.fp8_cache, "mla_sparse_prefill_wgmma: reads a bf16 latent cache; an FP8 cache runs the mma attend");
  MX_CHECK_MSG(topk_width < (int64_t{1} << 31), "mla_sparse_prefill_wgmma: top-k width " << topk_width);
  MX_CHECK_MSG(group_tokens < (int64_t{1} << 31), "mla_sparse_prefill_wgmma: " << group_tokens << " tokens");
  static std::atomic<uint64_t> configured{0};  // one bit per device (the attribute is per device context)
  int dev = 0;
  MX_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if ((configured.load() & bit) == 0) {
    for (const void* f : {reinterpret_cast<const void*>(mla_sparse_prefill_wgmma_kernel<kSchedPlain>),
                          reinterpret_cast<const void*>(mla_sparse_prefill_wgmma_kernel<kSchedOverlapPv>),
                          reinterpret_cast<const void*>(mla_sparse_prefill_wgmma_kernel<kSchedEarlyGather>)})
      MX_CUDA_CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes)));
    configured.fetch_or(bit);
  }
  auto* kernel = early_gather ? mla_sparse_prefill_wgmma_kernel<kSchedEarlyGather>
                 : overlap_pv ? mla_sparse_prefill_wgmma_kernel<kSchedOverlapPv>
                              : mla_sparse_prefill_wgmma_kernel<kSchedPlain>;
  kernel<<<static_cast<unsigned>(group_tokens), kThreads, kSmemBytes, stream>>>(
      static_cast<const bf16*>(q), static_cast<const bf16*>(q_abs), static_cast<const bf16*>(latent_cache), topk,
      topk_width, token_seq, kv_index, block_tables, static_cast<bf16*>(o_lat), t0, p, ap);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
