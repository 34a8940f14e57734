// Host emulation of the index math of the Hopper absorbed-MLA decode kernel (kernels/cuda/attention/
// mla_wgmma_layout.h; the kernel, mla_decode_wgmma.cu, cannot run on the CPU CI): the tile copy covers every
// (row, chunk) of a latent tile exactly once with 512 contiguous bytes per warp instruction; the swizzled tile
// layout is a bijection; the wgmma descriptors the kernel builds (K-major Q / K for the scores, MN-major latent for
// P V) read, under the 128B-swizzle rule applied to the address, exactly the bytes the copy wrote for each
// (row, k) / (key, dim); the score accumulator elements packed into P are the m16n8k16 A fragment; the (token
// slot, head) packing of the 64 wgmma rows; the split plan covers every item once.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

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

}  // namespace
}  // namespace mxserve::kernels::cuda::mla_wgmma
