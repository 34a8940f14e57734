// Host emulation of the index math of the Hopper absorbed-MLA decode kernel (kernels/cuda/attention/
// mla_wgmma_layout.h; the kernel, mla_decode_wgmma.cu, cannot run on the CPU CI): the tile copy covers every
// (row, chunk) of a latent tile exactly once with 512 contiguous bytes per warp instruction; the swizzled tile
// layout is a bijection; the wgmma descriptors the kernel builds (K-major Q / K for the scores, MN-major latent for
// P V) read, under the 128B-swizzle rule applied to the address, exactly the bytes the copy wrote for each
// (row, k) / (key, dim); the score accumulator elements packed into P are the m16n8k16 A fragment; the (token
// slot, head) packing of the 64 wgmma rows; the split plan covers every item once; and the kernel's control flow
// (runs, splits, tiles, masks, online softmax, split combine) emulated on the host against a direct softmax; the
// FP8-cache variant's copy (656-byte packed rows -> raw ring + rope block) and dequantization (-> the bf16 latent
// tile) emulated byte for byte, read back through the same descriptors as the bf16 tile; the sparse-prefill
// early-gather copy's split of a tile between the warpgroups.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "kernels/cuda/attention/mla_wgmma_layout.h"

namespace mxserve::kernels::cuda::mla_wgmma {
namespace {

// The byte a wgmma reads for element (mn, k) of a 128B-swizzled operand (bf16), under the PTX matrix-descriptor
// rules: K-major -- rows mn of 128 B, 8-row atoms SBO apart; MN-major -- 64-wide MN column blocks LBO apart,
// rows k of 128 B, 8-row atoms SBO apart. The swizzle XORs address bits 4-6 with bits 7-9 (1024-aligned atoms).
uint32_t swizzle(uint32_t linear) { return linear ^ (((linear >> 7) & 7u) << 4); }
uint32_t kmajor_read(uint32_t start, int mn, int k) {
  return swizzle(start + static_cast<uint32_t>(mn / 8) * 1024u + static_cast<uint32_t>(mn % 8) * 128u +
                 static_cast<uint32_t>(k) * 2u);
}
uint32_t mnmajor_read(uint32_t start, uint32_t lbo, int k, int mn) {
  return swizzle(start + static_cast<uint32_t>(mn / 64) * lbo + static_cast<uint32_t>(k / 8) * 1024u +
                 static_cast<uint32_t>(k % 8) * 128u + static_cast<uint32_t>(mn % 64) * 2u);
}
// Where the copy put element `col` (0..575) of tile row `row`.
uint32_t written(int row, int col) { return tile_offset(row, col / 8) + static_cast<uint32_t>(col % 8) * 2u; }

// The sparse-prefill early-gather copy (eg_row / eg_chunk): the two warpgroups together cover every (row, chunk) of a
// tile once; warpgroup cw writes only bytes that its own P V reads (latent column blocks [4 cw, +4), the same ones
// the kernel's V descriptor starts at) or that only the scores read (the rope block), never the other warpgroup's
// V blocks; each lane's chunks of a row are contiguous across the warp; every row's slot is looked up once a warp.
TEST(MlaWgmmaLayout, EarlyGatherHalvesCoverTheTileAndOwnTheirVBlocks) {
  std::vector<int> hits(kKeys * kChunks, 0);
  for (int cw = 0; cw < 2; ++cw)
    for (int warp = 0; warp < 4; ++warp) {
      std::set<int> rows;
      for (int i = 0; i < kEgRowsPerWarp; ++i) {
        const int row = eg_row(warp, i);
        ASSERT_GE(row, 0);
        ASSERT_LT(row, kKeys);
        rows.insert(row);
        for (int c = 0; c < 2; ++c) {
          int last = -1;
          for (int lane = 0; lane < 32; ++lane) {
            const int chunk = eg_chunk(cw, lane, c);
            if (chunk < 0) continue;
            ASSERT_LT(chunk, kChunks);
            ++hits[row * kChunks + chunk];
            const int block = chunk / 8;
            EXPECT_TRUE(block == 8 || (block >= 4 * cw && block < 4 * cw + 4))
                << "warpgroup " << cw << " writes chunk " << chunk << " (column block " << block << ")";
            EXPECT_TRUE(last < 0 || chunk == last + 1) << "cw " << cw << " step " << c;
            last = chunk;
          }
        }
      }
      EXPECT_EQ(static_cast<int>(rows.size()), kEgRowsPerWarp);  // lane i < 16 holds row eg_row(warp, i)'s slot
    }
  for (int i = 0; i < kKeys * kChunks; ++i) EXPECT_EQ(hits[i], 1) << "row " << i / kChunks << " chunk " << i % kChunks;
}

TEST(MlaWgmmaLayout, TileCopyCoversEveryChunkOnceContiguously) {
  std::vector<int> hits(kKeys * kChunks, 0);
  for (int warp = 0; warp < kLoadWarps; ++warp)
    for (int i = 0; i < kRowsPerLoadWarp; ++i)
      for (int c = 0; c < 3; ++c) {
        int first = -1, last = -1;
        for (int lane = 0; lane < 32; ++lane) {
          const int chunk = load_chunk(lane, c);
          if (chunk >= kChunks) continue;
          const int row = load_row(warp, i);
          ASSERT_LT(row, kKeys);
          ++hits[row * kChunks + chunk];
          if (first < 0) first = chunk;
          EXPECT_TRUE(last < 0 || chunk == last + 1) << "warp " << warp << " row " << i << " step " << c;
          last = chunk;
        }
      }
  for (int i = 0; i < kKeys * kChunks; ++i) EXPECT_EQ(hits[i], 1) << "row " << i / kChunks << " chunk " << i % kChunks;
  // The slot of row i is looked up by a lane of the same warp (broadcast by shuffle from lane i).
  for (int warp = 0; warp < kLoadWarps; ++warp)
    for (int i = 0; i < kRowsPerLoadWarp; ++i) EXPECT_EQ(load_lookup_row(warp, i), load_row(warp, i));
}

TEST(MlaWgmmaLayout, SwizzledTileIsABijectionOf16ByteChunks) {
  std::set<uint32_t> seen;
  for (int row = 0; row < kKeys; ++row)
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      const uint32_t off = tile_offset(row, chunk);
      EXPECT_EQ(off % 16, 0u);
      EXPECT_LT(off, kTileBytes);
      EXPECT_TRUE(seen.insert(off).second) << "row " << row << " chunk " << chunk;
    }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kKeys * kChunks));
  EXPECT_EQ(kTileBytes % 1024, 0u);  // the ring's stages and Q stay 1024-aligned
}

TEST(MlaWgmmaLayout, ScoreDescriptorsReadTheCopiedDims) {
  // issue_qk: k16 step ks starts at (ks / 4) column blocks + (ks % 4) 32 bytes, SBO 1024, for both Q and K.
  for (int ks = 0; ks < kRow / 16; ++ks) {
    const uint32_t start = static_cast<uint32_t>(ks / 4) * kColBlockBytes + static_cast<uint32_t>(ks % 4) * 32u;
    for (int row = 0; row < kM; ++row)
      for (int k = 0; k < 16; ++k)
        ASSERT_EQ(kmajor_read(start, row, k), written(row, 16 * ks + k)) << "ks " << ks << " row " << row << " k " << k;
  }
}

TEST(MlaWgmmaLayout, LatentDescriptorsReadTheCopiedDims) {
  // issue_pv: warpgroup cw, k16 step kk starts at 4 cw column blocks + 16 kk rows, LBO = one column block.
  for (int cw = 0; cw < 2; ++cw)
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t start = 4u * cw * kColBlockBytes + static_cast<uint32_t>(kk) * 16u * 128u;
      for (int k = 0; k < 16; ++k)
        for (int n = 0; n < 256; ++n)
          ASSERT_EQ(mnmajor_read(start, kColBlockBytes, k, n), written(16 * kk + k, 256 * cw + n))
              << "cw " << cw << " kk " << kk << " key " << k << " dim " << n;
    }
}

// The FP8 variant (p.fp8_cache): 64 packed rows (random codes, per-128 scales, bf16 rope) copied as the kernel's
// load_tile does (warp w, row i, lanes over chunks lane + 32 c, c < 2) into the raw stage and the rope block, then
// dequantized as dequant_half<0 / 1> do (thread tid, item tid + 256 k of each half) into the latent tile. Every staging byte is
// written once, the copy's warp instructions are contiguous, the dequantization's warp reads 256 contiguous code
// bytes, and the score / latent descriptors (rope block for k16 steps 32..35) read code x scale rounded to bf16
// (the mma.sync FP8 path's values) and the rope bits.
TEST(MlaWgmmaLayout, Fp8CopyAndDequantizationFillTheBf16Tile) {
  static_assert(kFp8SmemBytes == 223232u && kFp8RawOff % 16 == 0 && kFp8RawStageBytes % 16 == 0);
  static_assert(2 * 4 * 32 * 8 * 4 <= kFp8RawStageBytes, "split-S's P exchange fits the dequantized raw stage");
  uint32_t rng = 12345u;
  auto next = [&]() { return rng = rng * 1664525u + 1013904223u; };
  std::vector<uint8_t> rows(static_cast<size_t>(kKeys) * kFp8Row);
  for (int r = 0; r < kKeys; ++r) {
    uint8_t* row = rows.data() + static_cast<size_t>(r) * kFp8Row;
    for (int c = 0; c < kLat; ++c) {
      uint8_t code = static_cast<uint8_t>(next() >> 24);
      if ((code & 0x7f) == 0x7f) code ^= 1;  // no NaN codes (the writer saturates)
      row[c] = code;
    }
    for (int b = 0; b < kLat / kMlaFp8Block; ++b) {
      const float sc = std::ldexp(1.f + static_cast<float>(next() >> 9) * 0x1p-23f, static_cast<int>(next() % 40) - 30);
      std::memcpy(row + kLat + 4 * b, &sc, 4);
    }
    for (int c = 0; c < kRope; ++c) {
      const uint16_t v = f32_to_bf16(static_cast<float>(static_cast<int>(next() % 2001) - 1000) / 64.f);
      std::memcpy(row + kFp8Quant + 2 * c, &v, 2);
    }
  }
  // load_tile: raw stage and rope block, each byte written once.
  std::vector<uint8_t> raw(kFp8RawStageBytes, 0), rope(kColBlockBytes, 0);
  std::vector<int> raw_hits(kFp8RawStageBytes / 16, 0), rope_hits(kColBlockBytes / 16, 0);
  for (int warp = 0; warp < kLoadWarps; ++warp)
    for (int i = 0; i < kRowsPerLoadWarp; ++i)
      for (int c = 0; c < 2; ++c) {
        int last = -1;
        for (int lane = 0; lane < 32; ++lane) {
          const int ch = load_chunk(lane, c), row = load_row(warp, i);
          if (ch >= kFp8Chunks) continue;
          EXPECT_TRUE(last < 0 || ch == last + 1) << "warp " << warp << " row " << i << " step " << c;
          last = ch;
          const uint8_t* src = rows.data() + static_cast<size_t>(row) * kFp8Row + 16 * ch;
          if (ch < kFp8QuantChunks) {
            const uint32_t off = fp8_raw_offset(row, ch);
            ASSERT_LE(off + 16, kFp8RawStageBytes);
            ++raw_hits[off / 16];
            std::memcpy(raw.data() + off, src, 16);
          } else {
            const uint32_t off = fp8_rope_offset(row, ch);
            ASSERT_LE(off + 16, kColBlockBytes);
            ++rope_hits[off / 16];
            std::memcpy(rope.data() + off, src, 16);
          }
        }
      }
  for (size_t i = 0; i < raw_hits.size(); ++i) ASSERT_EQ(raw_hits[i], 1) << "raw chunk " << i;
  for (size_t i = 0; i < rope_hits.size(); ++i) ASSERT_EQ(rope_hits[i], 1) << "rope chunk " << i;
  // dequant_half<0>, <1>: 256 threads x 8 items each; half h writes column blocks 4h .. 4h + 3 (the first score
  // batch reads blocks 0..3 while half 1 is written), each latent-tile chunk of blocks 0..7 written once.
  constexpr int kThreads = 256;
  static_assert(kFp8DequantHalfItems % kThreads == 0);
  std::vector<uint8_t> lat(8 * kColBlockBytes, 0);
  std::vector<int> lat_hits(lat.size() / 16, 0);
  for (int half = 0; half < 2; ++half)
  for (int k = 0; k < kFp8DequantHalfItems / kThreads; ++k)
    for (int tid = 0; tid < kThreads; ++tid) {
      const int i = tid + kThreads * k, row = fp8_item_row(i), chunk = fp8_item_chunk(half, i);
      ASSERT_LT(row, kKeys);
      ASSERT_EQ(static_cast<int>(tile_offset(row, chunk) / kColBlockBytes) / 4, half) << "item " << i;
      if (tid % 32 > 0) {  // a warp's code reads are contiguous (256 bytes)
        const int ip = i - 1;
        ASSERT_EQ(fp8_codes_offset(row, chunk), fp8_codes_offset(fp8_item_row(ip), fp8_item_chunk(half, ip)) + 8u);
      }
      float scale = 0.f;
      std::memcpy(&scale, raw.data() + fp8_scale_offset(row, chunk), 4);
      const uint32_t dst = tile_offset(row, chunk);
      ASSERT_LT(dst, lat.size());
      ++lat_hits[dst / 16];
      for (int e = 0; e < 8; ++e) {
        const uint16_t b = f32_to_bf16(fp8_e4m3_to_f32(raw[fp8_codes_offset(row, chunk) + e]) * scale);
        std::memcpy(lat.data() + dst + 2 * e, &b, 2);
      }
    }
  for (size_t i = 0; i < lat_hits.size(); ++i) ASSERT_EQ(lat_hits[i], 1) << "latent chunk " << i;
  // The expected bf16 bits of element (row, col): code x its block's scale, or the rope tail.
  auto expect_bits = [&](int row, int col) -> uint16_t {
    const uint8_t* r = rows.data() + static_cast<size_t>(row) * kFp8Row;
    if (col >= kLat) {
      uint16_t v = 0;
      std::memcpy(&v, r + kFp8Quant + 2 * (col - kLat), 2);
      return v;
    }
    float scale = 0.f;
    std::memcpy(&scale, r + kLat + 4 * (col / kMlaFp8Block), 4);
    return f32_to_bf16(fp8_e4m3_to_f32(r[col]) * scale);
  };
  auto bits_at = [](const std::vector<uint8_t>& buf, uint32_t off) {
    uint16_t v = 0;
    std::memcpy(&v, buf.data() + off, 2);
    return v;
  };
  // issue_qk: k16 steps 0..31 from the latent tile (column block ks / 4), 32..35 from the rope block.
  for (int ks = 0; ks < kRow / 16; ++ks)
    for (int row = 0; row < kKeys; ++row)
      for (int k = 0; k < 16; ++k) {
        const bool in_rope = ks / 4 == 8;
        const uint32_t start = (in_rope ? 0u : static_cast<uint32_t>(ks / 4) * kColBlockBytes) + (ks % 4) * 32u;
        const uint32_t off = kmajor_read(start, row, k);
        ASSERT_EQ(bits_at(in_rope ? rope : lat, off), expect_bits(row, 16 * ks + k)) << "ks " << ks << " row " << row;
      }
  // issue_pv: the latent tile read MN-major, as the bf16 tile.
  for (int cw = 0; cw < 2; ++cw)
    for (int kk = 0; kk < kKeys / 16; ++kk)
      for (int k = 0; k < 16; ++k)
        for (int n = 0; n < 256; ++n) {
          const uint32_t start = 4u * cw * kColBlockBytes + static_cast<uint32_t>(kk) * 16u * 128u;
          ASSERT_EQ(bits_at(lat, mnmajor_read(start, kColBlockBytes, k, n)), expect_bits(16 * kk + k, 256 * cw + n));
        }
}

TEST(MlaWgmmaLayout, ScoreFragmentPacksIntoTheAFragment) {
  for (int warp = 0; warp < 4; ++warp)
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int kk = 0; kk < kKeys / 16; ++kk)
        for (int r = 0; r < 4; ++r)
          for (int half = 0; half < 2; ++half) {
            const int e = pa_elem(kk, r, half);
            ASSERT_LT(e, 32);
            // m16n8k16 A fragment register r: row g + 8 (r & 1), column 2 t + 8 (r >> 1) + half of the k16 slice.
            EXPECT_EQ(acc_row(warp, lane, e), 16 * warp + g + 8 * (r & 1));
            EXPECT_EQ(acc_col(lane, e), 16 * kk + 2 * t + 8 * (r >> 1) + half);
          }
    }
}

// kWgmmaSplitS: warpgroup cw scores tile keys [32 cw, +32) (an m64n32 accumulator, the same element layout); the
// k16 step kk of P V takes its A fragment from warpgroup kk / 2's k16 step kk % 2, same warp and lane.
TEST(MlaWgmmaLayout, SplitScoreHalvesAssembleTheAFragment) {
  for (int warp = 0; warp < 4; ++warp)
    for (int lane = 0; lane < 32; ++lane)
      for (int kk = 0; kk < kKeys / 16; ++kk)
        for (int r = 0; r < 4; ++r)
          for (int half = 0; half < 2; ++half) {
            const int src_wg = kk / 2, e = pa_elem(kk % 2, r, half);
            ASSERT_LT(e, 16);  // inside the m64n32 accumulator
            EXPECT_EQ(32 * src_wg + acc_col(lane, e), 16 * kk + 2 * (lane % 4) + 8 * (r >> 1) + half);
            EXPECT_EQ(acc_row(warp, lane, e), 16 * warp + lane / 4 + 8 * (r & 1));
          }
}

TEST(MlaWgmmaLayout, RowsPackTokenSlotsAndHeads) {
  for (const int nh : {1, 8, 16, 20, 32, 48, 64}) {
    for (const bool sparse : {false, true}) {
      const int tpc = tokens_per_cta(nh, sparse);
      EXPECT_GE(tpc, 1);
      EXPECT_LE(tpc * nh, kM) << nh << " heads";
      if (sparse) {
        EXPECT_EQ(tpc, 1);
      }
      std::set<std::pair<int, int>> pairs;
      for (int m = 0; m < tpc * nh; ++m) {
        EXPECT_LT(row_slot(m, nh), tpc);
        EXPECT_TRUE(pairs.insert({row_slot(m, nh), row_head(m, nh)}).second);
      }
      EXPECT_EQ(pairs.size(), static_cast<size_t>(tpc * nh));
    }
  }
  EXPECT_EQ(tokens_per_cta(8, false), 8);  // TP8: 8 MTP / tree rows of one sequence fill the 64 rows
}

TEST(MlaWgmmaLayout, SplitPlanCoversEveryItemOnce) {
  for (const int64_t ctas : {1, 2, 16, 64, 200})
    for (const int64_t items : {1, 63, 64, 65, 2048, 20000, 65536})
      for (const int forced : {0, 1, 3, 7, 300}) {
        const SplitPlan plan = split_plan(ctas, items, 132, forced);
        ASSERT_GE(plan.n_splits, 1);
        ASSERT_LE(plan.n_splits, kMaxSplits);
        ASSERT_EQ(plan.keys_per_split % kKeys, 0);
        if (forced > 0) {
          EXPECT_EQ(plan.n_splits, std::min(forced, kMaxSplits));
        }
        if (forced == 0 && ctas >= 132) {
          EXPECT_EQ(plan.n_splits, 1);
        }
        for (const int64_t run_items : {items, items / 2, int64_t{0}}) {  // a run may have fewer items
          int64_t next = 0;
          for (int s = 0; s < plan.n_splits; ++s) {
            int64_t b = 0, e = 0;
            split_range(s, plan.n_splits, plan.keys_per_split, run_items, &b, &e);
            if (b >= run_items) {
              EXPECT_EQ(e, b);
              continue;
            }
            EXPECT_EQ(b, next);
            next = e;
            if (forced == 0 && run_items == items) {
              EXPECT_LT(b, e) << "empty split " << s;
            }
          }
          EXPECT_EQ(next, run_items) << ctas << " ctas, " << items << " items, forced " << forced;
        }
      }
}

// The kernel's control flow on the host, with the layout header's own functions: CTAs of tokens_per_cta slots,
// runs (run_at), splits (split_range), 64-key tiles, the per-row visibility and tile_needs_mask, the online softmax
// (log2 domain) per wgmma row and the combine of the split partials -- against a direct softmax per (token, head).
// Scores / values are a hash of (token, head, key) / (sequence, key); one value dim stands for the 512.
struct EmuToken {
  int seq, ctx;
  std::vector<int> topk;  // sparse only: entries (-1, past the context, or visible)
};
double hash01(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<double>(x >> 11) / static_cast<double>(1ull << 53);
}
double emu_score(int t, int h, int64_t key) { return 6.0 * hash01((uint64_t(t) << 40) ^ (uint64_t(h) << 32) ^ key) - 3.0; }
double emu_value(int seq, int64_t key) { return hash01((uint64_t(seq) << 36) ^ (key + 77)) - 0.5; }

template <bool kSparse>
void emulate(const std::vector<EmuToken>& toks, int nh, int forced, int topk_width, const char* what) {
  const int T = static_cast<int>(toks.size()), tpc = tokens_per_cta(nh, kSparse);
  const int64_t ctas = (T + tpc - 1) / tpc;
  int64_t max_items = topk_width;
  if (!kSparse)
    for (const EmuToken& e : toks) max_items = std::max<int64_t>(max_items, e.ctx);
  const SplitPlan plan = split_plan(ctas, max_items, 132, forced);
  // partial (m log2, l, o) per (split, token, head)
  std::vector<double> pm(size_t(plan.n_splits) * T * nh), pl(pm.size()), po(pm.size());
  for (int64_t c = 0; c < ctas; ++c) {
    const int tl0 = static_cast<int>(c * tpc), n_slots = std::min(tpc, T - tl0);
    std::vector<int> slot_seq(n_slots), slot_ctx(n_slots);
    for (int i = 0; i < n_slots; ++i) slot_seq[i] = toks[tl0 + i].seq, slot_ctx[i] = toks[tl0 + i].ctx;
    for (int split = 0; split < plan.n_splits; ++split) {
      std::vector<double> m(kM, -INFINITY), l(kM, 0.0), o(kM, 0.0);
      for (int r = 0; r < n_slots;) {
        int rb = 0;
        int64_t n_items = 0, begin = 0, end = 0, min_ctx = 0;
        run_at<kSparse>(slot_seq.data(), slot_ctx.data(), n_slots, r, topk_width, &rb, &n_items, &min_ctx);
        split_range(split, plan.n_splits, plan.keys_per_split, n_items, &begin, &end);
        const bool full = r == 0 && rb == n_slots && n_slots * nh == kM;
        for (int64_t k0 = begin; k0 < end; k0 += kKeys) {
          const bool mask = tile_needs_mask(kSparse, full, false, k0, min_ctx, end);
          for (int row = 0; row < kM; ++row) {
            const int slot = row < tpc * nh ? row_slot(row, nh) : kM;
            const bool valid = slot < n_slots, in_run = valid && slot >= r && slot < rb;
            const int t = tl0 + (valid ? slot : 0), h = row_head(row, nh);
            double s[kKeys], mx = -INFINITY;
            int64_t keys[kKeys];
            for (int col = 0; col < kKeys; ++col) {
              const int64_t item = k0 + col;
              const int tr = tl0 + r;  // the run's (sparse: only) token: its list and block table
              int64_t key = item;
              if (kSparse) key = item < end ? toks[tr].topk[item] : -1;
              keys[col] = key;
              const bool vis = in_run && item < end && key >= 0 && key < toks[kSparse ? tr : t].ctx;
              if (!mask) {
                ASSERT_TRUE(vis) << what << ": unmasked tile with an invisible key";
              }
              s[col] = vis ? emu_score(t, h, key) : -INFINITY;
              mx = std::max(mx, s[col]);
            }
            const double m_new = std::max(m[row], mx);
            const double alpha = m[row] == -INFINITY ? 0.0 : std::exp2(m[row] - m_new);
            const double m_use = m_new == -INFINITY ? 0.0 : m_new;
            l[row] *= alpha;
            o[row] *= alpha;
            for (int col = 0; col < kKeys; ++col) {
              const double e = std::exp2(s[col] - m_use);
              l[row] += e;
              if (e > 0) o[row] += e * emu_value(slot_seq[r], keys[col]);
            }
            m[row] = m_new;
          }
        }
        r = rb;
      }
      for (int row = 0; row < kM; ++row) {
        const int slot = row < tpc * nh ? row_slot(row, nh) : kM;
        if (slot >= n_slots) continue;
        const size_t i = (size_t(split) * T + tl0 + slot) * nh + row_head(row, nh);
        pm[i] = m[row];
        pl[i] = l[row];
        po[i] = l[row] > 0 ? o[row] / l[row] : 0.0;
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < nh; ++h) {
      double M = -INFINITY, den = 0, num = 0;
      for (int s = 0; s < plan.n_splits; ++s) {
        const size_t i = (size_t(s) * T + t) * nh + h;
        if (pl[i] > 0) M = std::max(M, pm[i]);
      }
      for (int s = 0; s < plan.n_splits; ++s) {
        const size_t i = (size_t(s) * T + t) * nh + h;
        const double w = pl[i] > 0 ? pl[i] * std::exp2(pm[i] - M) : 0.0;
        den += w;
        num += w * po[i];
      }
      std::set<int64_t> keys;
      if (kSparse) {
        for (const int k : toks[t].topk)
          if (k >= 0 && k < toks[t].ctx) keys.insert(k);
      } else {
        for (int64_t k = 0; k < toks[t].ctx; ++k) keys.insert(k);
      }
      double rm = -INFINITY, rden = 0, rnum = 0;
      for (const int64_t k : keys) rm = std::max(rm, emu_score(t, h, k));
      for (const int64_t k : keys) {
        const double e = std::exp2(emu_score(t, h, k) - rm);
        rden += e;
        rnum += e * emu_value(toks[t].seq, k);
      }
      ASSERT_GT(den, 0) << what << ": token " << t << " head " << h << " saw no key";
      ASSERT_NEAR(num / den, rnum / rden, 1e-9) << what << ": token " << t << " head " << h << ", " << plan.n_splits
                                                << " splits";
    }
}

// Tokens of `runs` sequences: {tokens, context of the last}; MTP rows end at ctx - tokens + 1 .. ctx.
std::vector<EmuToken> emu_batch(const std::vector<std::pair<int, int>>& runs) {
  std::vector<EmuToken> v;
  for (size_t s = 0; s < runs.size(); ++s)
    for (int i = 0; i < runs[s].first; ++i) v.push_back({static_cast<int>(s), runs[s].second - runs[s].first + 1 + i, {}});
  return v;
}

TEST(MlaWgmmaLayout, HostEmulationMatchesDirectSoftmax) {
  const std::vector<std::vector<std::pair<int, int>>> batches = {
      {{1, 1}},
      {{1, 63}, {1, 64}, {1, 65}, {1, 129}, {1, 1000}},
      {{8, 511}, {1, 65}, {3, 40}, {1, 1}, {2, 700}, {9, 200}},
      {{4, 300}, {1, 77}, {3, 129}},
      {{8, 257}, {8, 130}, {2, 66}},  // MTP contexts straddling a tile end: 250..257, 123..130
  };
  for (const int nh : {8, 16, 20, 32, 64})
    for (const auto& runs : batches)
      for (const int forced : {0, 1, 3, 7}) {
        const std::string what = std::to_string(nh) + " heads, forced " + std::to_string(forced);
        emulate<false>(emu_batch(runs), nh, forced, 0, what.c_str());
        // Sparse: per token a list of width 96 -- visible keys, a -1 tail and one entry past the context.
        std::vector<EmuToken> toks = emu_batch(runs);
        for (EmuToken& e : toks) {
          for (int k = 0; k < std::min(e.ctx, 90); ++k) e.topk.push_back(e.ctx <= 90 ? k : (k * 37 + 11) % e.ctx);
          std::sort(e.topk.begin(), e.topk.end());
          e.topk.erase(std::unique(e.topk.begin(), e.topk.end()), e.topk.end());
          e.topk.push_back(e.ctx + 3);
          e.topk.resize(96, -1);
        }
        emulate<true>(toks, nh, forced, 96, (what + ", top-96").c_str());
      }
}

}  // namespace
}  // namespace mxserve::kernels::cuda::mla_wgmma
