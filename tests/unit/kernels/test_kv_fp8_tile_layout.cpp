// Host emulation of the FP8 KV tile loader's index math (kernels/cuda/attention/kv_fp8_tile_layout.h; the loader,
// kv_fp8_tile.cuh, runs only on a GPU): for every head_dim the tensor-core kernels build and every (keys per tile,
// threads per pipeline) they use, the issue loop's 16-byte copies and 4-byte scale copies cover every byte of a
// stage exactly once at aligned addresses; the dequantization loop writes every element of the bf16 tile's rows
// exactly once (padding untouched) from aligned 8-code reads; a whole tile emulated through both loops (random
// codes and scales, shuffled slots, rows past the end zero-filled) equals a direct dequantization of the cache;
// and the FP8 pipeline's shared memory fits an SM and never exceeds the bf16 pipeline's (same occupancy or better).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "kernels/cuda/attention/kv_fp8_tile_layout.h"

namespace mxserve::kernels::cuda::kv_fp8_tile {
namespace {

// The pipelines of the kernels (paged_attention_mma.cu, cascade_attention.cu): keys per tile, threads that own
// the pipeline, pipelines per block, stages.
struct Pipe {
  const char* what;
  int keys, threads, per_block;
};
constexpr Pipe kPipes[] = {
    {"per-warp decode", 16, 32, 4},
    {"block-shared prefill", 64, 256, 1},
    {"cascade prefix", 64, 128, 1},
    {"cascade suffix", 16, 32, 4},
};
constexpr int kStages = 3;
constexpr int kHeadDims[] = {16, 32, 64, 128};
constexpr size_t kSmemPerSm = 227 * 1024;  // H100 / H200: the most one block may opt in to

TEST(KvFp8TileLayout, IssueCoversEveryStageByteOnceAligned) {
  for (const Pipe& pp : kPipes)
    for (int hd : kHeadDims) {
      SCOPED_TRACE(std::string(pp.what) + " hd " + std::to_string(hd));
      const int n_kv_heads = 3;
      std::vector<int> hits(stage_bytes(hd, pp.keys), 0);
      for (int tid = 0; tid < pp.threads; ++tid) {
        for (int c = tid; c < issue_chunks(hd, pp.keys); c += pp.threads) {
          const Chunk ch = issue_chunk(hd, c);
          ASSERT_GE(ch.row, 0);
          ASSERT_LT(ch.row, pp.keys);
          for (int kvh = 0; kvh < n_kv_heads; ++kvh)  // the global source: 16-byte aligned for any slot / head
            ASSERT_EQ(cache_code_at(7, n_kv_heads, hd, kvh, ch.col) % kIssueBytes, 0);
          for (int at : {k_code_at(hd, ch.row, ch.col), v_code_at(hd, pp.keys, ch.row, ch.col)}) {
            ASSERT_EQ(at % 16, 0);
            for (int b = 0; b < kIssueBytes; ++b) ++hits[at + b];
          }
        }
        for (int j = tid; j < pp.keys; j += pp.threads)
          for (int at : {k_scale_at(hd, pp.keys, j), v_scale_at(hd, pp.keys, j)}) {
            ASSERT_EQ(at % 4, 0);
            for (int b = 0; b < 4; ++b) ++hits[at + b];
          }
      }
      for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "stage byte " << i;
      EXPECT_EQ(stage_bytes(hd, pp.keys) % 16, 0u);
    }
}

TEST(KvFp8TileLayout, DequantWritesEveryTileElementOnceAligned) {
  for (const Pipe& pp : kPipes)
    for (int hd : kHeadDims) {
      SCOPED_TRACE(std::string(pp.what) + " hd " + std::to_string(hd));
      const int r = bf16_row_stride(hd);
      std::vector<int> hits(static_cast<size_t>(pp.keys) * r, 0);
      for (int tid = 0; tid < pp.threads; ++tid)
        for (int c = tid; c < dequant_chunks(hd, pp.keys); c += pp.threads) {
          const Chunk ch = dequant_chunk(hd, c);
          ASSERT_LT(ch.row, pp.keys);
          ASSERT_EQ(k_code_at(hd, ch.row, ch.col) % 8, 0);  // one uint2 read
          ASSERT_EQ(v_code_at(hd, pp.keys, ch.row, ch.col) % 8, 0);
          const int at = ch.row * r + ch.col;
          ASSERT_EQ(at * 2 % 16, 0);  // one 16-byte bf16 store
          for (int e = 0; e < kDequantCodes; ++e) ++hits[at + e];
        }
      for (int j = 0; j < pp.keys; ++j)
        for (int d = 0; d < r; ++d) ASSERT_EQ(hits[j * r + d], d < hd ? 1 : 0) << "row " << j << " col " << d;
    }
}

// A whole tile through both loops, as the kernels run them, vs the cache dequantized directly.
TEST(KvFp8TileLayout, EmulatedTileEqualsDirectDequantization) {
  std::mt19937 rng(33);
  for (const Pipe& pp : kPipes)
    for (int hd : kHeadDims) {
      SCOPED_TRACE(std::string(pp.what) + " hd " + std::to_string(hd));
      const int n_kv_heads = 2, kvh = 1, n_slots = 3 * pp.keys;
      std::vector<uint8_t> kc(static_cast<size_t>(n_slots) * n_kv_heads * hd), vc(kc.size());
      std::vector<float> ks(static_cast<size_t>(n_slots) * n_kv_heads), vs(ks.size());
      for (auto& b : kc) b = static_cast<uint8_t>(rng() & 0xff);
      for (auto& b : vc) b = static_cast<uint8_t>(rng() & 0xff);
      for (auto& b : kc) b = (b & 0x7f) == 0x7f ? 0 : b;  // no NaN codes (the cache never holds one)
      for (auto& b : vc) b = (b & 0x7f) == 0x7f ? 0 : b;
      for (auto& s : ks) s = std::ldexp(1.f + (rng() % 1000) / 1000.f, -static_cast<int>(rng() % 12));
      for (auto& s : vs) s = std::ldexp(1.f + (rng() % 1000) / 1000.f, -static_cast<int>(rng() % 12));
      std::vector<int64_t> slot(pp.keys);  // a shuffled block table; the last rows past the end (< 0)
      for (int j = 0; j < pp.keys; ++j) slot[j] = j < pp.keys - 5 ? static_cast<int64_t>(rng() % n_slots) : -1;

      std::vector<uint8_t> stage(stage_bytes(hd, pp.keys), 0xcd);  // stale bytes: the zero fill must win
      for (int tid = 0; tid < pp.threads; ++tid) {
        for (int c = tid; c < issue_chunks(hd, pp.keys); c += pp.threads) {
          const Chunk ch = issue_chunk(hd, c);
          const bool ok = slot[ch.row] >= 0;
          const int64_t off = ok ? cache_code_at(slot[ch.row], n_kv_heads, hd, kvh, ch.col) : 0;
          for (int b = 0; b < kIssueBytes; ++b) {  // cp.async with src-size 0 zero-fills
            stage[k_code_at(hd, ch.row, ch.col) + b] = ok ? kc[off + b] : 0;
            stage[v_code_at(hd, pp.keys, ch.row, ch.col) + b] = ok ? vc[off + b] : 0;
          }
        }
        for (int j = tid; j < pp.keys; j += pp.threads) {
          const bool ok = slot[j] >= 0;
          const float k = ok ? ks[slot[j] * n_kv_heads + kvh] : 0.f, v = ok ? vs[slot[j] * n_kv_heads + kvh] : 0.f;
          std::memcpy(&stage[k_scale_at(hd, pp.keys, j)], &k, 4);
          std::memcpy(&stage[v_scale_at(hd, pp.keys, j)], &v, 4);
        }
      }
      const int r = bf16_row_stride(hd);
      const uint16_t kPad = 0xbeef;
      std::vector<uint16_t> kt(static_cast<size_t>(pp.keys) * r, kPad), vt(kt.size(), kPad);
      for (int tid = 0; tid < pp.threads; ++tid)
        for (int c = tid; c < dequant_chunks(hd, pp.keys); c += pp.threads) {
          const Chunk ch = dequant_chunk(hd, c);
          float k, v;
          std::memcpy(&k, &stage[k_scale_at(hd, pp.keys, ch.row)], 4);
          std::memcpy(&v, &stage[v_scale_at(hd, pp.keys, ch.row)], 4);
          for (int e = 0; e < kDequantCodes; ++e) {  // the device's arithmetic: exact code value * scale, bf16 RNE
            kt[ch.row * r + ch.col + e] = f32_to_bf16(fp8_e4m3_to_f32(stage[k_code_at(hd, ch.row, ch.col) + e]) * k);
            vt[ch.row * r + ch.col + e] =
                f32_to_bf16(fp8_e4m3_to_f32(stage[v_code_at(hd, pp.keys, ch.row, ch.col) + e]) * v);
          }
        }
      for (int j = 0; j < pp.keys; ++j)
        for (int d = 0; d < r; ++d) {
          uint16_t ek = kPad, ev = kPad;
          if (d < hd && slot[j] < 0) ek = ev = 0;  // +0, as the plain loader's zero fill
          if (d < hd && slot[j] >= 0) {
            const int64_t s = slot[j], at = s * n_kv_heads * hd + kvh * hd + d;
            ek = f32_to_bf16(fp8_e4m3_to_f32(kc[at]) * ks[s * n_kv_heads + kvh]);
            ev = f32_to_bf16(fp8_e4m3_to_f32(vc[at]) * vs[s * n_kv_heads + kvh]);
          }
          ASSERT_EQ(kt[j * r + d], ek) << "K row " << j << " col " << d;
          ASSERT_EQ(vt[j * r + d], ev) << "V row " << j << " col " << d;
        }
    }
}

TEST(KvFp8TileLayout, SharedMemoryFitsAndNeverExceedsTheBf16Pipeline) {
  for (const Pipe& pp : kPipes)
    for (int hd : kHeadDims) {
      SCOPED_TRACE(std::string(pp.what) + " hd " + std::to_string(hd));
      const size_t fp8 = pp.per_block * pipeline_bytes(hd, pp.keys, kStages, true);
      const size_t bf16 = pp.per_block * pipeline_bytes(hd, pp.keys, kStages, false);
      EXPECT_EQ(bf16, static_cast<size_t>(pp.per_block) * kStages * 2 * pp.keys * (hd + 8) * 2);  // the bf16 layout
      EXPECT_LE(fp8, bf16);
      EXPECT_LE(fp8, kSmemPerSm);
      EXPECT_EQ(pipeline_bytes(hd, pp.keys, kStages, true) % 16, 0u);  // the next warp's pipeline stays aligned
    }
}

}  // namespace
}  // namespace mxserve::kernels::cuda::kv_fp8_tile
