// Index math of the Hopper absorbed-MLA decode kernel (mla_decode_wgmma.cu), kept apart from the kernel so a
// CPU test (tests/unit/kernels/test_mla_wgmma_layout.cpp) can emulate it on the host: the shared-memory layout
// of a [rows][576] bf16 operand in 9 column blocks of 128-byte-swizzled rows, the producer's copy assignment,
// the wgmma accumulator fragment, the packing of (token slot, head) pairs into the 64 wgmma rows and the
// KV-split plan, and the FP8-cache staging (packed 656-byte rows, kernels/mla_fp8.h) and its dequantization
// into the same bf16 tile. Invariant: every function here is the one the kernel calls (no second copy of the math).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/mla_fp8.h"

#if defined(__CUDACC__)
#define MX_MLA_HD __host__ __device__ __forceinline__
#else
#define MX_MLA_HD inline
#endif

namespace mxserve::kernels::cuda::mla_wgmma {

constexpr int kLat = 512, kRope = 64, kRow = kLat + kRope;  // a cached latent row: 576 bf16 = 1152 bytes
constexpr int kM = 64;                                       // wgmma rows: (token slot, head) pairs
constexpr int kKeys = 64;                                    // keys per latent tile
constexpr int kStages = 2;                                   // latent tile ring (double-buffered)
constexpr int kColBlocks = kRow / 64;                        // 9 column blocks of 64 bf16 (128 B)
constexpr int kChunks = kRow / 8;                            // 72 16-byte chunks per row
constexpr uint32_t kColBlockBytes = 64u * 128u;              // 64 rows x 128 B (Q has kM = 64 rows too)
constexpr uint32_t kTileBytes = kColBlocks * kColBlockBytes; // 73,728 B: one latent tile, or Q
constexpr int kLoadWarps = 8;                                // both warpgroups copy the tiles
constexpr int kRowsPerLoadWarp = kKeys / kLoadWarps;         // 8
constexpr int kMaxSplits = 256;
constexpr int kMinKeysPerSplit = 256;  // 4 tiles: below that the ring's fill dominates a split

// Byte offset of 16-byte chunk `chunk` (0..71) of row `row` in a [column block 9][64 rows][128 B] operand:
// column block chunk / 8, the chunk's 16 bytes XOR-swizzled by row % 8 inside each 8-row (1024-byte) atom.
MX_MLA_HD uint32_t tile_offset(int row, int chunk) {
  return static_cast<uint32_t>(chunk >> 3) * kColBlockBytes + static_cast<uint32_t>(row) * 128u +
         (static_cast<uint32_t>((chunk & 7) ^ (row & 7)) << 4);
}

// FP8 latent cache (p.fp8_cache): rows of [512 e4m3 | 4 f32 scales | 64 bf16 rope] = 656 bytes (41 16-byte
// chunks). Shared memory of the FP8 variant: Q (kTileBytes) | ONE bf16 latent tile, column blocks 0..7 (the MMAs
// read it; the dequantization writes it) | the rope column block (block 8) x kStages, filled by cp.async straight
// from the rows' bf16 tails | the raw ring x kStages: codes + scales (528 bytes a row) of the tile in flight.
// 223,232 bytes (+ 1 KB alignment): the bf16 layout's second latent stage would not fit beside the raw ring.
constexpr int kFp8Row = 656;                        // mla_fp8_row_bytes(512, 64)
constexpr int kFp8Quant = 528;                      // codes + scales: mla_fp8_tail_offset(512)
constexpr int kFp8Chunks = kFp8Row / 16;            // 41 16-byte chunks a row
constexpr int kFp8QuantChunks = kFp8Quant / 16;     // 33: chunks [0, 33) -> the raw ring, [33, 41) -> rope block
constexpr uint32_t kFp8RawStageBytes = kKeys * kFp8Quant;              // 33,792
constexpr uint32_t kFp8LatOff = kTileBytes;                            // bf16 column blocks 0..7
constexpr uint32_t kFp8RopeOff = kFp8LatOff + 8u * kColBlockBytes;     // + stage * kColBlockBytes
constexpr uint32_t kFp8RawOff = kFp8RopeOff + kStages * kColBlockBytes;  // + stage * kFp8RawStageBytes
constexpr uint32_t kFp8SmemBytes = kFp8RawOff + kStages * kFp8RawStageBytes;
static_assert(kFp8Row == mxserve::kernels::mla_fp8_row_bytes(kLat, kRope) &&
                  kFp8Quant == mxserve::kernels::mla_fp8_tail_offset(kLat),
              "the FP8 staging assumes the 512 / 64 packed row of kernels/mla_fp8.h");
static_assert(kFp8RopeOff % 1024 == 0, "the rope block is a 128B-swizzle operand: 1024-byte aligned");
static_assert(kFp8SmemBytes + 1024 + 4096 <= 232448, "the FP8 variant must fit one CTA per SM");
// Where the copy puts chunk ch (0..40) of tile row `row`'s packed row: ch < 33 raw ring bytes (relative to the
// stage); ch >= 33 the rope block (relative to the stage's block), swizzled as tile_offset's column block 8.
MX_MLA_HD uint32_t fp8_raw_offset(int row, int ch) {
  return static_cast<uint32_t>(row) * kFp8Quant + static_cast<uint32_t>(ch) * 16u;
}
MX_MLA_HD uint32_t fp8_rope_offset(int row, int ch) {
  const int c = ch - kFp8QuantChunks;  // 0..7: bf16 rope chunk
  return static_cast<uint32_t>(row) * 128u + (static_cast<uint32_t>(c ^ (row & 7)) << 4);
}
// The dequantization, in two halves so the score MMAs of the first overlap the second: half h (0: column blocks
// 0..3, 1: blocks 4..7) has 2048 items, thread tid takes tid + 256 k (k < 8); item i is latent chunk
// fp8_item_chunk(h, i) (8 codes) of tile row fp8_item_row(i): codes at fp8_codes_offset, their block's f32 scale
// at fp8_scale_offset (raw stage relative), the 8 bf16 written at tile_offset(row, chunk) of the latent tile. A
// warp reads 256 contiguous code bytes.
constexpr int kFp8DequantHalfItems = kKeys * (kLat / 16);  // 2048
MX_MLA_HD int fp8_item_row(int i) { return i / (kLat / 16); }
MX_MLA_HD int fp8_item_chunk(int half, int i) { return (kLat / 16) * half + i % (kLat / 16); }
MX_MLA_HD uint32_t fp8_codes_offset(int row, int chunk) {
  return static_cast<uint32_t>(row) * kFp8Quant + 8u * static_cast<uint32_t>(chunk);
}
MX_MLA_HD uint32_t fp8_scale_offset(int row, int chunk) {
  return static_cast<uint32_t>(row) * kFp8Quant + kLat + 4u * static_cast<uint32_t>(chunk / (kMlaFp8Block / 8));
}

// Where the hardware reads 16-byte chunk c16 (0..7) of row `row` of a K-major 128B-swizzled operand whose
// descriptor starts at `start` (a multiple of 32 bytes inside a 1024-aligned atom: the k16 slice), SBO 1024:
// the PTX swizzle rule applied to the absolute address (bits 4-6 ^= bits 7-9). Host emulation only.
MX_MLA_HD uint32_t sw128_read_offset(uint32_t start, int row, int c16) {
  const uint32_t linear = start + static_cast<uint32_t>(row / 8) * 1024u + static_cast<uint32_t>(row % 8) * 128u +
                          static_cast<uint32_t>(c16) * 16u;
  return linear ^ (((linear >> 7) & 7u) << 4);
}

// The copy of one tile: warp w (0..7) copies tile rows w + 8 i (i < 8); for row i its lanes copy chunks
// lane + 32 c (c < 3, chunk < 72): 512 contiguous bytes per instruction. The row's cache slot is looked up once
// per tile by lane i (lanes 8..31 repeat 0..7) and broadcast by shuffle.
MX_MLA_HD int load_row(int warp, int i) { return warp + kLoadWarps * i; }
MX_MLA_HD int load_lookup_row(int warp, int lane) { return load_row(warp, lane & 7); }
MX_MLA_HD int load_chunk(int lane, int c) { return lane + 32 * c; }

// Accumulator fragment of a wgmma m64nN (f32): element i of thread (warp w of the warpgroup, lane) is row
// 16 w + lane / 4 + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 (lane % 4) + (i & 1).
// The sparse-prefill kernel's early-gather schedule (mla_sparse_prefill_wgmma.cu): warpgroup cw copies, for every
// tile row, only the chunks that no one but itself reads after the scores -- latent column blocks [4 cw, +4) (its
// P V operand) and rope chunks [4 cw, +4) -- so it can refill them as soon as its own P V retires. Warp w (0..3) of
// the warpgroup copies rows eg_row(w, i), i < 16; lane l copies eg_chunk(cw, l, c), c < 2 (-1: none); the slot of
// row eg_row(w, i) is looked up by lane i (< 16) of the same warp.
constexpr int kEgRowsPerWarp = kKeys / 4, kEgChunksPerRow = kChunks / 2;  // 16 rows, 36 chunks a warpgroup
MX_MLA_HD int eg_row(int warp, int i) { return warp + 4 * i; }
MX_MLA_HD int eg_chunk(int cw, int lane, int c) {
  const int ci = lane + 32 * c;
  return ci >= kEgChunksPerRow ? -1 : ci < 32 ? 32 * cw + ci : kLat / 8 + 4 * cw + (ci - 32);
}

MX_MLA_HD int acc_row(int warp, int lane, int i) { return 16 * warp + lane / 4 + 8 * ((i >> 1) & 1); }
MX_MLA_HD int acc_col(int lane, int i) { return 8 * (i >> 2) + 2 * (lane % 4) + (i & 1); }
// P as the register A operand of the k16 step kk of O += P V: register r (0..3) packs score elements
// (pa_elem(kk, r, 0), pa_elem(kk, r, 1)) of the same thread: (row g, keys 16kk + 2t..), (row g + 8, ..),
// (row g, keys 16kk + 8 + 2t..), (row g + 8, ..) -- the m16n8k16 A fragment wgmma's register form reads.
MX_MLA_HD int pa_elem(int kk, int r, int half) { return 8 * kk + 2 * r + half; }

// Token slots per CTA: dense rows pack up to 64 / n_heads consecutive tokens (MTP / tree rows of one sequence
// share every latent tile; tokens of different sequences are served one run after the other); sparse (top-k)
// rows keep one token per CTA (each has its own key list).
MX_MLA_HD int tokens_per_cta(int n_heads, bool sparse) { return sparse || n_heads >= kM ? 1 : kM / n_heads; }
// wgmma row m holds head m % n_heads of token slot m / n_heads (slots >= the CTA's tokens: padding rows).
MX_MLA_HD int row_slot(int m, int n_heads) { return m / n_heads; }
MX_MLA_HD int row_head(int m, int n_heads) { return m % n_heads; }

struct SplitPlan {
  int n_splits = 1;
  int64_t keys_per_split = 0;  // a multiple of kKeys
};
// KV splits for `ctas` token CTAs over at most max_items keys (or top-k entries): enough splits to cover the SMs
// once, at least kMinKeysPerSplit keys each; `forced` > 0 overrides the count (tests, benchmarks, a tuned table).
// Split s walks items [s kps, (s + 1) kps) of its run; the last split also takes any tail.
inline SplitPlan split_plan(int64_t ctas, int64_t max_items, int n_sm, int forced) {
  SplitPlan plan;
  const int64_t items = std::max<int64_t>(max_items, 1);
  int64_t splits = 1;
  if (forced > 0) {
    splits = std::min<int64_t>(forced, kMaxSplits);
  } else if (ctas < n_sm) {
    const int64_t by_keys = (items + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
    splits = std::clamp<int64_t>(std::min<int64_t>(n_sm / std::max<int64_t>(ctas, 1), by_keys), 1, kMaxSplits);
  }
  const int64_t per = (items + splits - 1) / splits;
  plan.keys_per_split = (per + kKeys - 1) / kKeys * kKeys;
  // Rounding up per split may leave trailing splits empty: drop them (a forced count is kept as asked).
  if (forced <= 0) splits = (items + plan.keys_per_split - 1) / plan.keys_per_split;
  plan.n_splits = static_cast<int>(splits);
  return plan;
}
// Items [begin, end) split s of n walks in a run of n_items items.
MX_MLA_HD void split_range(int s, int n_splits, int64_t keys_per_split, int64_t n_items, int64_t* begin,
                           int64_t* end) {
  *begin = static_cast<int64_t>(s) * keys_per_split;
  *end = s == n_splits - 1 || n_items < *begin + keys_per_split ? n_items : *begin + keys_per_split;
  if (*end < *begin) *end = *begin;
}

// The run of token slots starting at r: consecutive slots of one sequence (dense), a single slot (sparse). Its end
// (one past) in *rb, its item count in *n_items (dense: the run's largest context; sparse: the top-k width) and
// its smallest context in *min_ctx.
template <bool kSparse>
MX_MLA_HD void run_at(const int* slot_seq, const int* slot_ctx, int n_slots, int r, int64_t topk_width, int* rb,
                      int64_t* n_items, int64_t* min_ctx) {
  int b = r + 1;
  int64_t hi = slot_ctx[r], lo = slot_ctx[r];
  if (!kSparse) {
    for (; b < n_slots && slot_seq[b] == slot_seq[r]; ++b) {
      hi = slot_ctx[b] > hi ? slot_ctx[b] : hi;
      lo = slot_ctx[b] < lo ? slot_ctx[b] : lo;
    }
  }
  *rb = b;
  *n_items = kSparse ? topk_width : hi;
  *min_ctx = lo;
}

// Whether tile [k0, k0 + 64) of a run needs the per-(row, key) mask: always for sparse rows (top-k entries may be
// -1 or invisible) and whenever some row of the CTA is outside the run, a tree mask exists, or the tile reaches
// past the run's smallest context or the split's end. Without it every key of the tile is visible to every row.
MX_MLA_HD bool tile_needs_mask(bool sparse, bool single_full_run, bool tree, int64_t k0, int64_t run_min_ctx,
                               int64_t end) {
  return sparse || !single_full_run || tree || k0 + kKeys > run_min_ctx || k0 + kKeys > end;
}

}  // namespace mxserve::kernels::cuda::mla_wgmma
