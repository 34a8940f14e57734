// Paged causal GQA prefill / extend attention on Hopper warpgroup MMA (wgmma, sm_90a), bf16 or FP8 E4M3 cache,
// head_dim 128, warp-specialized (FlashAttention-3 structure). One block = 128 consecutive query rows (tokens) of
// one q head; 128-key tiles: S = Q K^T with Q and K from 128B-swizzled shared memory (wgmma m64n128k16, both K-major), the
// online softmax in registers (exp2, fp32), P rounded to bf16 in registers as the A operand of O += P V with V
// read MN-major (transposed descriptor) from the same [keys][head_dim] tile layout as K. Rows of different
// sequences in one block are served one sequence (contiguous run of rows) after the other: rows of other runs
// see every key masked (they keep their state). Masking is applied only to tiles that reach past some row's end
// (the causal diagonal, run edges); tiles past every row of a warpgroup are skipped. No split-KV.
//   warpgroup 0  producer (setmaxnreg down to 40): walks the block's runs and key tiles, gathers each K and V tile
//                row by row through the page table (one lookup per row, shared by shuffle) with cp.async into a
//                3-stage ring ([K | V][column block 2][128 keys][128 B], 128B-swizzled); each thread's
//                cp.async.mbarrier.arrive.noinc signals "K landed" / "V landed" on the stage's full barriers; it
//                refills a stage once both consumer warpgroups arrived on its empty barrier.
//                FP8 cache (kFp8): the producer dequantizes instead of copying. Each thread loads 16-code chunks
//                of 8 rows a tile into registers (plain 16-byte loads, two batches of 4 rows in flight), converts
//                them (fp8x16_to_bf16: the hardware e4m3x2 conversion; the mma.sync kernels' bf16 values, bit
//                for bit) and stores them into the same swizzled bf16 ring, then fence.proxy.async and a plain
//                mbarrier arrive.
//                The consumers are unchanged: the QK and PV MMAs stay bf16. Registers: producer 56, consumers 224.
//   warpgroups 1-2  consumers (setmaxnreg up to 232), 64 query rows each, Q in shared memory. Per tile j, FA3's
//                intra-warpgroup pipelining: S(j) = Q K(j)^T is issued, then O += P(j-1) V(j-1), and the
//                softmax of S(j) (in place, fp32) runs while the P V MMAs are in flight; O is rescaled and P(j)
//                rounded to bf16 (register A operand) only after they retire. Registers: O 64 + S 64 + P 32.
// Inter-warpgroup ping-pong (ping_pong = true, the planner's choice): the consumers take turns at issuing their
// MMAs through named barriers, so one warpgroup's softmax overlaps the other's MMAs (FA3); false lets them
// interleave freely on the tensor cores (kept for the comparison row of dev/kernels/bench_prefill_attention).
// Invariants: token t attends to keys [0, kv_index[t]] of its sequence token_seq[t] (as the other kernels).
// Not served here (the planner keeps them on the mma.sync kernels; paged_attention_wgmma_supports says why):
// tree masks, other head dims, devices other than sm_90. Issue 31 retired the first, non-specialized
// wgmma kernel (paged_attention_wgmma.cu, "wgmma"): auto always ran this one and the other had the same support
// rule, so it was no fallback.
// Design notes: docs/perf/prefill.md. Primitives: common/wgmma_sm90.cuh, wgmma_tile.cuh, sm90_sync.cuh.
#include <cuda_bf16.h>

#include <atomic>
#include <climits>
#include <cmath>

#include "core/check.h"
#include "kernels/cuda/attention/kv_fp8_load.cuh"
#include "kernels/cuda/attention/paged_attention_wgmma.h"
#include "kernels/cuda/attention/sm90_sync.cuh"
#include "kernels/cuda/attention/wgmma_tile.cuh"
#include "kernels/cuda/common/bf16.cuh"
#include "kernels/cuda/common/wgmma_sm90.cuh"
#include "kernels/cuda/common/cuda_check.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kHeadDim = 128;
constexpr int kRows = kWgmmaRowsPerBlock;  // query rows per block (2 consumer warpgroups x 64)
constexpr int kKeys = 128;                 // keys per tile
constexpr int kStages = 3;                 // K/V ring depth
constexpr int kThreads = 384;              // producer warpgroup + 2 consumer warpgroups
constexpr int kChunks = kHeadDim / 8;      // 16-byte chunks per row
// Shared memory (1024-byte aligned; every 8-row x 128-byte swizzle atom aligned), 226 KB + 1.1 KB static of the
// 227 KB a block may opt into:
//   Q      [consumer warpgroup 2][column block 2][64 rows][128 B]   32 KB
//   ring   [stage 3][K | V][column block 2][kKeys rows][128 B]      192 KB
constexpr uint32_t kQBytes = kRows * kHeadDim * 2;
constexpr uint32_t kQWarpgroupBytes = kQBytes / 2;
constexpr uint32_t kTileBytes = kKeys * kHeadDim * 2;  // one of K or V
constexpr uint32_t kStageBytes = 2 * kTileBytes;
constexpr size_t kSmemBytes = kQBytes + kStages * kStageBytes + 1024;  // + alignment slack

#ifdef MX_WGMMA_DEVICE
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128 x 40 + 256 x 232 <= 64K registers
constexpr int kProducerRegsFp8 = 56, kConsumerRegsFp8 = 224;  // 128 x 56 + 256 x 224 = 64512: two 8-row batches
                                                               // in flight without spilling
constexpr uint32_t kQColBlockBytes = 64 * 128;
constexpr uint32_t kTileColBlockBytes = kKeys * 128;
using wgmma_tile::cp_async16;
using wgmma_tile::pack_bf16;
using wgmma_tile::swz;

// The run of rows starting at r (rows of one sequence, consecutive in the block): its end rb and the largest
// key count of its rows.
__device__ __forceinline__ void run_at(const int* row_seq, const int* row_end, int n_valid, int r, int* rb,
                                       int* run_end) {
  const int seq = row_seq[r];
  int b = r + 1, e = row_end[r];
  while (b < n_valid && row_seq[b] == seq) e = max(e, row_end[b++]);
  *rb = b;
  *run_end = e;
}

// Online softmax of one 64 x 128 score tile, in place: s[4j + e] is key k0 + 8j + 2 q4 + (e & 1) of the thread's
// row hr = e >> 1 (rows g, g + 8 of its warp's 16). Masks keys >= my_end[hr] when `mask`; updates the running
// max m (log2 domain, scale folded in) and sum l (l scaled by alpha first), leaves exp2(s c - m) in s, and returns
// in alpha the factor the accumulator O must be scaled by.
__device__ __forceinline__ void softmax_tile(float (&s)[64], int k0, int q4, const int (&my_end)[2], bool mask,
                                             float c_log2, float (&m)[2], float (&l)[2], float (&alpha)[2]) {
  if (mask) {
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
  float m_use[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
    mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
    const float m_new = fmaxf(m[hr], mx[hr] * c_log2);  // -inf while every key so far was masked
    alpha[hr] = exp2f(m[hr] == -INFINITY ? -INFINITY : m[hr] - m_new);  // select, no branch: 0 on a fresh row
    m[hr] = m_new;
    m_use[hr] = m_new == -INFINITY ? 0.f : m_new;
    l[hr] *= alpha[hr];
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    s[i] = exp2f(fmaf(s[i], c_log2, -m_use[(i >> 1) & 1]));  // masked: exp2(-inf) = 0
    l[(i >> 1) & 1] += s[i];
  }
}

// P (bf16) as the m64k16 A fragments of the P V MMAs: per 16 keys kk, (row g, keys 2q4..), (row g+8, keys 2q4..),
// (row g, keys 8+2q4..), (row g+8, keys 8+2q4..).
__device__ __forceinline__ void pack_p(const float (&s)[64], uint32_t (&pa)[kKeys / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    pa[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

__device__ __forceinline__ void scale_o(float (&o)[64], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[4 * j + e] *= alpha[e >> 1];
}

// S = Q K^T (64 x 128, K-major Q and K tiles), issued and committed as one wgmma group.
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t qd, uint32_t kd) {
#pragma unroll
  for (int ks = 0; ks < kHeadDim / 16; ++ks) {
    const uint32_t koff = (ks % 4) * 32u;  // 16 bf16 along K inside the swizzled 128-byte row
    const uint64_t da = wgmma::desc_sw128(qd + (ks / 4) * kQColBlockBytes + koff, 16, 1024);
    const uint64_t db = wgmma::desc_sw128(kd + (ks / 4) * kTileColBlockBytes + koff, 16, 1024);
    wgmma::m64n128k16_ss(s, da, db, ks > 0 ? 1 : 0);
  }
  wgmma::commit_group();
}

// O += P V (V tile MN-major through the transposed descriptor), issued and committed as one wgmma group.
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pa)[kKeys / 16][4], uint32_t vd) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint64_t db = wgmma::desc_sw128(vd + kk * 16 * 128, kTileColBlockBytes, 1024);
    wgmma::m64n128k16_rs_tb(o, pa[kk], db);
  }
  wgmma::commit_group();
}
#endif

// Producer side of an FP8 tile. Thread t converts 16-code chunk c16 = t % 8 (bf16 chunks 2 c16, 2 c16 + 1) of
// tile rows frow + 16 i, frow = t / 8, i < 8: a warp's 32 threads cover 4 whole rows per i. A batch is 4 of those
// rows (i = 4 b .. 4 b + 3): 16-byte code loads into registers, then fp8x16_to_bf16 and two 16-byte stores per
// row into the swizzled bf16 tile (row + 16: + 2048 bytes, the same swizzle). Slots and scales come by shuffle from
// the lane that looked the row up (lane L of warp w: row 4 w + (L & 3) + 16 (L >> 2)).
#ifdef MX_WGMMA_DEVICE
struct Fp8Rows {
  uint4 codes[4];
};
__device__ __forceinline__ int fp8_src_lane(int i, int lane) { return 4 * i + (lane >> 3); }
__device__ __forceinline__ void fp8_load_rows(Fp8Rows& r, const uint8_t* base, int64_t row_bytes, int slot, int b,
                                              int lane) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int sl = __shfl_sync(0xffffffffu, slot, fp8_src_lane(4 * b + i, lane));
    r.codes[i] = sl >= 0 ? __ldg(reinterpret_cast<const uint4*>(base + static_cast<int64_t>(sl) * row_bytes))
                         : make_uint4(0u, 0u, 0u, 0u);  // past the run's keys: zero (finite; masked or P = 0)
  }
}
__device__ __forceinline__ void st_shared16(uint32_t dst, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void fp8_store_rows(const Fp8Rows& r, uint32_t dst0, uint32_t dst1, float scale, int b,
                                               int lane) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float sc = __shfl_sync(0xffffffffu, scale, fp8_src_lane(4 * b + i, lane));
    uint4 lo, hi;
    fp8x16_to_bf16(r.codes[i], sc, lo, hi);
    st_shared16(dst0 + (4 * b + i) * 2048, lo);
    st_shared16(dst1 + (4 * b + i) * 2048, hi);
  }
}
#endif

template <bool kPingPong, bool kFp8>
__global__ void __launch_bounds__(kThreads, 1)
    paged_attention_wgmma_ws_kernel(const bf16* __restrict__ q, const void* __restrict__ k_cache,
                                    const void* __restrict__ v_cache, const int32_t* __restrict__ token_seq,
                                    const int32_t* __restrict__ kv_index, const int32_t* __restrict__ block_tables,
                                    bf16* __restrict__ out, AttentionParams p) {
#ifdef MX_WGMMA_DEVICE
  extern __shared__ unsigned char smem_raw[];
  __shared__ int row_seq[kRows], row_end[kRows];
  // Per stage: K landed, V landed (128 producer arrivals each), slot free (256 consumer arrivals).
  __shared__ alignas(8) uint64_t bars[3 * kStages];
  const uint32_t smem_raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t smem = (smem_raw_addr + 1023u) & ~1023u;
  const uint32_t q_smem = smem, ring_smem = smem + kQBytes;
  const uint32_t bar0 = static_cast<uint32_t>(__cvta_generic_to_shared(bars));
  auto bar_k = [&](int s) { return bar0 + 8u * s; };
  auto bar_v = [&](int s) { return bar0 + 8u * (kStages + s); };
  auto bar_empty = [&](int s) { return bar0 + 8u * (2 * kStages + s); };

  const int tid = threadIdx.x;
  // Warpgroup index made warp-uniform for the compiler (a broadcast from lane 0): the role branch below must not
  // look divergent, or ptxas serializes the consumers' wgmmas (warning C7520).
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0), wtid = tid % 128;
  const int head = blockIdx.x;
  const int kvh = head / (p.n_heads / p.n_kv_heads);
  const int64_t t0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * kRows;  // longest (causal) first
  const int n_valid = static_cast<int>(min(static_cast<int64_t>(kRows), static_cast<int64_t>(p.n_tokens) - t0));

  if (tid < kRows) {
    const bool ok = tid < n_valid;
    row_seq[tid] = ok ? token_seq[t0 + tid] : -1;
    row_end[tid] = ok ? max(0, kv_index[t0 + tid] + 1) : 0;
  }
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(bar_k(s), 128);
      sm90::mbar_init(bar_v(s), 128);
      sm90::mbar_init(bar_empty(s), 256);
    }
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer: every run's key tiles, in the order the consumers walk them ----
    if constexpr (kFp8) sm90::setmaxnreg_dec<kProducerRegsFp8>();
    else sm90::setmaxnreg_dec<kProducerRegs>();
    const int64_t kv_width = static_cast<int64_t>(p.n_kv_heads) * kHeadDim;  // elements (bytes: FP8 codes)
    // This thread copies 16-byte chunk c of tile rows row_lo + 8 i (i < 16): the 16 threads of a half warp cover
    // one 256-byte row. The page-table lookup of each row is done once per tile, by one lane of the warp (lane L
    // of warp w: row 2 w + (L & 1) + 8 (L >> 1)), and fetched by shuffle: the producer's instruction count per
    // tile stays small next to the consumers' (they share the SM's issue slots).
    const int c = wtid % kChunks, row_lo = wtid / kChunks, half = row_lo & 1;
    const int lane = wtid % 32;
    // The row whose page-table entry this lane looks up (FP8: the 4-row-per-warp mapping above fp8_load_rows).
    const int my_row = kFp8 ? 4 * (wtid / 32) + (lane & 3) + 16 * (lane >> 2) : 2 * (wtid / 32) + (lane & 1) + 8 * (lane >> 1);
    const bf16* k_base = static_cast<const bf16*>(k_cache) + kvh * kHeadDim + c * 8;
    const bf16* v_base = static_cast<const bf16*>(v_cache) + kvh * kHeadDim + c * 8;
    const int c16 = wtid % 8, frow = wtid / 8;  // FP8: 16-code chunk and first row (fp8_load_rows)
    const uint8_t* k_codes = static_cast<const uint8_t*>(k_cache) + kvh * kHeadDim + c16 * 16;
    const uint8_t* v_codes = static_cast<const uint8_t*>(v_cache) + kvh * kHeadDim + c16 * 16;
    const uint32_t fdst0 = swz(frow, 2 * c16, kTileColBlockBytes), fdst1 = swz(frow, 2 * c16 + 1, kTileColBlockBytes);
    const uint32_t dst_lo = swz(row_lo, c, kTileColBlockBytes);  // row row_lo + 8 i: + 1024 i (same swizzle)
    const int bs = p.block_size;
    uint32_t it = 0;  // tiles issued so far (ring position)
    for (int r = 0; r < n_valid;) {
      int rb = 0, run_end = 0;
      run_at(row_seq, row_end, n_valid, r, &rb, &run_end);
      const int32_t* table = block_tables + static_cast<int64_t>(row_seq[r]) * p.max_blocks_per_seq;
      const int n_tiles = (run_end + kKeys - 1) / kKeys;
      for (int tile = 0; tile < n_tiles; ++tile, ++it) {
        const int key = tile * kKeys + my_row;
        const int slot = key < run_end ? table[key / bs] * bs + key % bs : -1;  // -1: past the run's keys
        const int s = it % kStages;
        const uint32_t kd = ring_smem + s * kStageBytes + dst_lo, vd = kd + kTileBytes;
        if constexpr (kFp8) {
          // The scales of this lane's lookup row (fetched by shuffle with the codes' rows), then K in two 8-row
          // batches and V in two, one batch's loads in flight while the other is stored. K lands first: the
          // consumers start S = Q K^T before V has.
          const int64_t sidx = slot >= 0 ? static_cast<int64_t>(slot) * p.n_kv_heads + kvh : 0;
          const float ks = slot >= 0 ? __ldg(p.k_scales + sidx) : 0.f;
          const float vs = slot >= 0 ? __ldg(p.v_scales + sidx) : 0.f;
          const uint32_t kt = ring_smem + s * kStageBytes, vt = kt + kTileBytes;
          Fp8Rows a, b;
          fp8_load_rows(a, k_codes, kv_width, slot, 0, lane);
          sm90::mbar_wait(bar_empty(s), ((it / kStages) & 1) ^ 1);
          fp8_load_rows(b, k_codes, kv_width, slot, 1, lane);
          fp8_store_rows(a, kt + fdst0, kt + fdst1, ks, 0, lane);
          fp8_load_rows(a, v_codes, kv_width, slot, 0, lane);
          fp8_store_rows(b, kt + fdst0, kt + fdst1, ks, 1, lane);
          wgmma::fence_proxy_async_smem();  // generic-proxy stores -> the consumers' wgmma (async proxy) reads
          sm90::mbar_arrive(bar_k(s));
          fp8_load_rows(b, v_codes, kv_width, slot, 1, lane);
          fp8_store_rows(a, vt + fdst0, vt + fdst1, vs, 0, lane);
          fp8_store_rows(b, vt + fdst0, vt + fdst1, vs, 1, lane);
          wgmma::fence_proxy_async_smem();
          sm90::mbar_arrive(bar_v(s));
          continue;
        }
        sm90::mbar_wait(bar_empty(s), ((it / kStages) & 1) ^ 1);
        // K then V: the consumers start S = Q K^T before V has landed. Keys past the run's end are zero-filled
        // (finite; masked or multiplied by P = 0).
#pragma unroll
        for (int i = 0; i < kKeys / 8; ++i) {
          const int sl = __shfl_sync(0xffffffffu, slot, 2 * i + half);
          cp_async16(kd + i * 1024, k_base + (sl >= 0 ? static_cast<int64_t>(sl) * kv_width : 0), sl >= 0);
        }
        sm90::cp_async_mbar_arrive(bar_k(s));
#pragma unroll
        for (int i = 0; i < kKeys / 8; ++i) {
          const int sl = __shfl_sync(0xffffffffu, slot, 2 * i + half);
          cp_async16(vd + i * 1024, v_base + (sl >= 0 ? static_cast<int64_t>(sl) * kv_width : 0), sl >= 0);
        }
        sm90::cp_async_mbar_arrive(bar_v(s));
      }
      r = rb;
    }
    // Leave no copy in flight behind an exiting thread (the ring's copies are in no commit group: wait_all).
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  // ---- consumers: warpgroup cw serves rows cw * 64 .. + 63 ----
  if constexpr (kFp8) sm90::setmaxnreg_inc<kConsumerRegsFp8>();
  else sm90::setmaxnreg_inc<kConsumerRegs>();
  const int cw = wg - 1, warp = wtid / 32, lane = tid % 32;
  const int g = lane / 4, q4 = lane % 4;
  const float c_log2 = p.scale * 1.4426950408889634f;
  const uint32_t qd = q_smem + cw * kQWarpgroupBytes;
  // This warpgroup's Q rows (zero past n_tokens), then a barrier among its 128 threads.
  for (int i = wtid; i < 64 * kChunks; i += 128) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = cw * 64 + r < n_valid;
    const bf16* src = ok ? q + ((t0 + cw * 64 + r) * p.n_heads + head) * kHeadDim + c * 8 : q;
    cp_async16(qd + swz(r, c, kQColBlockBytes), src, ok);
  }
  wgmma_tile::cp_async_commit();
  wgmma_tile::cp_async_wait_all();
  wgmma::fence_proxy_async_smem();
  sm90::named_bar_sync(1 + cw, 128);

  const int row0 = cw * 64 + warp * 16 + g;  // this thread's rows row0, row0 + 8
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float s[64];
  uint32_t pa[kKeys / 16][4];

  // Ping-pong (kPingPong): the two consumer warpgroups take turns at issuing their MMAs (named barriers 3 + cw,
  // 256 threads: this warpgroup's bar.sync + the other's bar.arrive), so one's softmax runs under the other's
  // MMAs. Every warpgroup takes n_tiles + 1 turns per run (one per computed tile, one for the last P V, an
  // empty one per skipped tile) so the counts match; warpgroup 0 goes first (warpgroup 1's opening arrival) and
  // ends with one more bar.sync that takes warpgroup 1's last arrival.
  auto turn_begin = [&]() {
    if constexpr (kPingPong) sm90::named_bar_sync(3 + cw, 256);
  };
  auto turn_end = [&]() {
    if constexpr (kPingPong) sm90::named_bar_arrive(3 + (cw ^ 1), 256);
  };
  if (cw == 1) turn_end();

  uint32_t it = 0;  // ring position of the run's first tile
  for (int r = 0; r < n_valid;) {
    int rb = 0, run_end = 0;
    run_at(row_seq, row_end, n_valid, r, &rb, &run_end);
    const int lo = max(r, cw * 64), hi = min(rb, cw * 64 + 64);
    int wg_max = 0, wg_min = 0;  // rows of this warpgroup outside the run count as end 0
    if (lo < hi) {
      wg_min = (lo == cw * 64 && hi == cw * 64 + 64) ? INT_MAX : 0;
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
    const int n_tiles = (run_end + kKeys - 1) / kKeys;
    const int n_mine = min(n_tiles, (wg_max + kKeys - 1) / kKeys);  // leading tiles some row of ours sees
    auto stage = [&](int j) { return static_cast<int>((it + j) % kStages); };
    auto parity = [&](int j) { return ((it + j) / kStages) & 1u; };
    auto kd_of = [&](int j) { return ring_smem + stage(j) * kStageBytes; };

    if (n_mine > 0) {
      float alpha[2];
      // Tile 0: S, softmax, P.
      sm90::mbar_wait(bar_k(stage(0)), parity(0));
      wgmma::fence_proxy_async_smem();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
      turn_begin();
      wgmma::fence();
      issue_qk(s, qd, kd_of(0));
      turn_end();
      wgmma::wait_group<0>();
      wgmma::fence_regs(s);
      softmax_tile(s, 0, q4, my_end, kKeys > wg_min, c_log2, m, l, alpha);
      scale_o(o, alpha);  // rows of an earlier run keep their state (alpha 1); fresh rows are 0 anyway
      pack_p(s, pa);
      for (int j = 1; j < n_mine; ++j) {
        // S(j) = Q K(j)^T and O += P(j-1) V(j-1) in flight together; the softmax of S(j) waits for the first only.
        // Both waits before the first MMA: a wait loop between wgmma.fence and an MMA makes ptxas insert another
        // fence (C7519). V(j-1) was copied before K(j), so the second wait rarely holds anything up.
        sm90::mbar_wait(bar_v(stage(j - 1)), parity(j - 1));
        sm90::mbar_wait(bar_k(stage(j)), parity(j));
        wgmma::fence_proxy_async_smem();
        turn_begin();
        wgmma::fence();
        issue_qk(s, qd, kd_of(j));
        issue_pv(o, pa, kd_of(j - 1) + kTileBytes);
        turn_end();
        wgmma::wait_group<1>();
        wgmma::fence_regs(s);
        const int k0 = j * kKeys;
        softmax_tile(s, k0, q4, my_end, k0 + kKeys > wg_min, c_log2, m, l, alpha);
        wgmma::wait_group<0>();
        wgmma::fence_regs(o);
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) wgmma::fence_regs(pa[kk]);  // live until the MMAs read them
        sm90::mbar_arrive(bar_empty(stage(j - 1)));
        scale_o(o, alpha);
        pack_p(s, pa);
      }
      sm90::mbar_wait(bar_v(stage(n_mine - 1)), parity(n_mine - 1));
      wgmma::fence_proxy_async_smem();
      turn_begin();
      wgmma::fence();
      issue_pv(o, pa, kd_of(n_mine - 1) + kTileBytes);
      turn_end();
      wgmma::wait_group<0>();
      wgmma::fence_regs(o);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) wgmma::fence_regs(pa[kk]);
      sm90::mbar_arrive(bar_empty(stage(n_mine - 1)));
    } else {
      turn_begin();  // the turn of the missing last P V
      turn_end();
    }
    // Tiles past every row of this warpgroup: wait for them to land (the producer may not refill a slot whose
    // copies are in flight) and hand them back.
    for (int j = n_mine; j < n_tiles; ++j) {
      sm90::mbar_wait(bar_k(stage(j)), parity(j));
      sm90::mbar_wait(bar_v(stage(j)), parity(j));
      sm90::mbar_arrive(bar_empty(stage(j)));
      turn_begin();
      turn_end();
    }
    it += n_tiles;
    r = rb;
  }
  if (cw == 0) turn_begin();  // takes warpgroup 1's last arrival: no named barrier is left half-arrived at exit

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
  else if (p.tree_mask != nullptr) reason = "tree mask";
  else if (p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0) reason = "n_heads not a multiple of n_kv_heads";
  else if (p.block_size <= 0) reason = "block_size <= 0";
  else if (current_device_sm() != 90) reason = "the device is not sm_90 (wgmma is Hopper-only)";
  if (why != nullptr) *why = reason;
  return reason == nullptr;
}

void paged_attention_wgmma_ws(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                                   const int32_t* kv_index, const int32_t* block_tables, void* out,
                                   const AttentionParams& p, cudaStream_t stream, bool ping_pong) {
  if (p.n_tokens == 0) return;
  const char* why = nullptr;
  MX_CHECK_MSG(paged_attention_wgmma_supports(p, &why), "paged_attention_wgmma_ws: " << why << " (planner bug)");
  // > 48 KB of dynamic shared memory needs an opt-in, once per device (the attribute is per device).
  static std::atomic<bool> configured[64];
  int dev = 0;
  MX_CUDA_CHECK(cudaGetDevice(&dev));
  MX_CHECK_LT(dev, 64);
  if (!configured[dev].load()) {
    for (const void* f : {reinterpret_cast<const void*>(paged_attention_wgmma_ws_kernel<true, false>),
                          reinterpret_cast<const void*>(paged_attention_wgmma_ws_kernel<false, false>),
                          reinterpret_cast<const void*>(paged_attention_wgmma_ws_kernel<true, true>),
                          reinterpret_cast<const void*>(paged_attention_wgmma_ws_kernel<false, true>)})
      MX_CUDA_CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes)));
    configured[dev].store(true);
  }
  const int64_t row_blocks = (static_cast<int64_t>(p.n_tokens) + kRows - 1) / kRows;
  MX_CHECK_LT(row_blocks, int64_t{65536});
  const dim3 grid(static_cast<unsigned>(p.n_heads), static_cast<unsigned>(row_blocks));
  const bool fp8 = p.fp8_kv();
  auto* kernel = ping_pong ? (fp8 ? paged_attention_wgmma_ws_kernel<true, true> : paged_attention_wgmma_ws_kernel<true, false>)
                           : (fp8 ? paged_attention_wgmma_ws_kernel<false, true> : paged_attention_wgmma_ws_kernel<false, false>);
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(static_cast<const bf16*>(q), k_cache, v_cache, token_seq, kv_index,
                                                 block_tables, static_cast<bf16*>(out), p);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
