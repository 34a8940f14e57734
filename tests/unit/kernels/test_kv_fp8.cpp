// FP8 E4M3 KV cache on the CPU reference (kernels/kv_fp8.h, kernels/cpu/attention.cpp): the encoder against
// the OCP e4m3fn definition (every code round-trips, ties go to even, saturation, subnormals), the per-element
// error of kv_write_fp8 within the format's worst case under per-(slot, head) amax/448 scaling, attention over
// the FP8 cache equal bit for bit to attention over the same values dequantized into an f32 cache, slot
// copies that move scales with codes, and padding rows (slot < 0) written nowhere by either cache layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/numeric.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kv_fp8.h"

namespace mxserve::kernels {
namespace {

TEST(KvFp8, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    const float v = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(f32_to_fp8_e4m3(v), c) << "code " << c << " value " << v;
  }
  EXPECT_EQ(f32_to_fp8_e4m3(NAN), 0x7f);
}

TEST(KvFp8, MidpointsRoundToEvenAndNeighboursToNearest) {
  for (int c = 0; c < 0x7e; ++c) {  // positive codes and their upper neighbour
    const float lo = fp8_e4m3_to_f32(static_cast<uint8_t>(c)), hi = fp8_e4m3_to_f32(static_cast<uint8_t>(c + 1));
    const float mid = 0.5f * (lo + hi);  // exact in f32
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(f32_to_fp8_e4m3(mid), even) << "between codes " << c << " and " << c + 1;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, 0.f)), c);
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, 1e9f)), c + 1);
    EXPECT_EQ(f32_to_fp8_e4m3(-mid), 0x80 | even);
  }
}

TEST(KvFp8, SaturatesAtPlusMinus448) {
  for (float v : {448.f, 449.f, 463.99f, 464.f, 1e6f, INFINITY}) {
    EXPECT_EQ(f32_to_fp8_e4m3(v), 0x7e) << v;
    EXPECT_EQ(f32_to_fp8_e4m3(-v), 0xfe) << v;
  }
  EXPECT_EQ(f32_to_fp8_e4m3(1e-30f), 0x00);  // far below the smallest subnormal (2^-9)
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.f, -10)), 0x00);  // half of 2^-9: tie to even (0)
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(3.f, -10)), 0x02);  // 1.5 * 2^-9: tie to even (2 * 2^-9)
}

// Worst case of one element under the scheme: |y| = |x| / s in the normal range loses at most half a unit of
// the 3-bit mantissa (2^-4 relative), in the subnormal range (|y| < 2^-6) at most 2^-10 absolute, both times
// s; plus 2^-20 |x| for the f32 division and product.
float worst_case_error(float x, float s) { return std::ldexp(std::fabs(x), -4) + std::ldexp(s, -10) + std::ldexp(std::fabs(x), -20); }

TEST(KvFp8, WriteErrorWithinTheFormatsWorstCase) {
  const int64_t kvh = 3, hd = 32, width = kvh * hd, n_slots = 40, T = 11;
  std::mt19937 rng(7);
  std::normal_distribution<float> n01(0.f, 1.f);
  std::vector<float> k(T * width), v(T * width);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < kvh; ++h) {
      const float mag = std::ldexp(1.f, static_cast<int>(t * 3 + h) - 16);  // 2^-16 .. 2^16 across heads
      for (int64_t d = 0; d < hd; ++d) {
        k[t * width + h * hd + d] = mag * n01(rng);
        v[t * width + h * hd + d] = (t == 4 && h == 1) ? 0.f : mag * n01(rng) * 0.3f;  // one all-zero head
      }
    }
  std::vector<int32_t> slots = {3, 39, 0, 17, 16, 15, 31, 32, 8, 9, 22};
  std::vector<uint8_t> kc(n_slots * width, 0xaa), vc(n_slots * width, 0xaa);
  std::vector<float> ks(n_slots * kvh, NAN), vs(n_slots * kvh, NAN);
  cpu::kv_write_fp8(k.data(), v.data(), slots.data(), kc.data(), vc.data(), ks.data(), vs.data(), T, kvh, hd);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < kvh; ++h)
      for (int which = 0; which < 2; ++which) {
        const float* x = (which ? v : k).data() + t * width + h * hd;
        const uint8_t* codes = (which ? vc : kc).data() + slots[t] * width + h * hd;
        const float s = (which ? vs : ks)[slots[t] * kvh + h];
        float amax = 0.f;
        for (int64_t d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(x[d]));
        ASSERT_EQ(s, amax / 448.f) << "scale of token " << t << " head " << h;
        bool hit_max = amax == 0.f;
        for (int64_t d = 0; d < hd; ++d) {
          const float deq = fp8_e4m3_to_f32(codes[d]) * s;
          ASSERT_LE(std::fabs(deq - x[d]), worst_case_error(x[d], s))
              << "token " << t << " head " << h << " dim " << d << ": " << x[d] << " -> " << deq;
          hit_max |= (codes[d] & 0x7f) == 0x7e;
        }
        EXPECT_TRUE(hit_max) << "the head's amax element must map to +-448";
      }
}

TEST(KvFp8, AttentionEqualsAttentionOnTheDequantizedCache) {
  AttentionParams p;
  p.n_heads = 4;
  p.n_kv_heads = 2;
  p.head_dim = 16;
  p.block_size = 4;
  p.max_blocks_per_seq = 5;
  p.scale = 0.25f;
  const int64_t width = p.n_kv_heads * p.head_dim, n_slots = 24;
  std::mt19937 rng(3);
  std::normal_distribution<float> n01(0.f, 1.f);
  std::vector<float> k(n_slots * width), v(n_slots * width);
  for (float& x : k) x = 3.f * n01(rng);
  for (float& x : v) x = n01(rng);
  std::vector<int32_t> all(n_slots);
  for (int64_t i = 0; i < n_slots; ++i) all[i] = static_cast<int32_t>(i);
  std::vector<uint8_t> kc(n_slots * width), vc(n_slots * width);
  std::vector<float> ks(n_slots * p.n_kv_heads), vs(n_slots * p.n_kv_heads);
  cpu::kv_write_fp8(k.data(), v.data(), all.data(), kc.data(), vc.data(), ks.data(), vs.data(), n_slots, p.n_kv_heads,
                    p.head_dim);
  std::vector<float> kd(n_slots * width), vd(n_slots * width);  // the same values, dequantized up front
  for (int64_t i = 0; i < n_slots * width; ++i) {
    kd[i] = fp8_e4m3_to_f32(kc[i]) * ks[(i / width) * p.n_kv_heads + (i % width) / p.head_dim];
    vd[i] = fp8_e4m3_to_f32(vc[i]) * vs[(i / width) * p.n_kv_heads + (i % width) / p.head_dim];
  }
  // Two sequences: 3 decode-like rows at KV 12..14 of sequence 0 and one row at KV 6 of sequence 1.
  const int32_t tables[2][5] = {{5, 2, 0, 4, 1}, {3, 1, 0, 0, 0}};
  std::vector<int32_t> token_seq = {0, 0, 0, 1}, kv_index = {12, 13, 14, 6};
  p.n_tokens = 4;
  p.n_seqs = 2;
  std::vector<float> q(p.n_tokens * p.n_heads * p.head_dim);
  for (float& x : q) x = n01(rng);
  std::vector<float> ref(q.size()), got(q.size());
  cpu::paged_attention_f32(q.data(), kd.data(), vd.data(), token_seq.data(), kv_index.data(), &tables[0][0], ref.data(), p);
  AttentionParams pf = p;
  pf.k_scales = ks.data();
  pf.v_scales = vs.data();
  cpu::paged_attention_f32(q.data(), kc.data(), vc.data(), token_seq.data(), kv_index.data(), &tables[0][0], got.data(), pf);
  EXPECT_EQ(std::memcmp(ref.data(), got.data(), sizeof(float) * ref.size()), 0);
  // And it is not the f32 cache's result (the test sees the quantization).
  std::vector<float> exact(q.size());
  cpu::paged_attention_f32(q.data(), k.data(), v.data(), token_seq.data(), kv_index.data(), &tables[0][0], exact.data(), p);
  EXPECT_NE(std::memcmp(exact.data(), got.data(), sizeof(float) * got.size()), 0);
}

TEST(KvFp8, CopyRowsMovesCodesAndScalesInOrder) {
  const int64_t n_slots = 8, width = 6, kvh = 2;
  std::vector<uint8_t> a(n_slots * width), b(n_slots * width);
  std::vector<float> sa(n_slots * kvh), sb(n_slots * kvh);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i), b[i] = static_cast<uint8_t>(200 - i);
  for (size_t i = 0; i < sa.size(); ++i) sa[i] = static_cast<float>(i), sb[i] = -static_cast<float>(i);
  // Pair 1 reads slot 2, which pair 0 wrote.
  std::vector<int32_t> src = {5, 2, 7}, dst = {2, 0, 7};
  std::vector<uint8_t> a0 = a, b0 = b;
  std::vector<float> sa0 = sa;
  cpu::kv_copy_rows(src.data(), dst.data(), 3, a.data(), b.data(), width);
  cpu::kv_copy_rows(src.data(), dst.data(), 3, reinterpret_cast<uint8_t*>(sa.data()),
                    reinterpret_cast<uint8_t*>(sb.data()), kvh * sizeof(float));
  for (int64_t d = 0; d < width; ++d) {
    EXPECT_EQ(a[2 * width + d], a0[5 * width + d]);
    EXPECT_EQ(a[0 * width + d], a0[5 * width + d]);
    EXPECT_EQ(b[0 * width + d], b0[5 * width + d]);
  }
  for (int64_t h = 0; h < kvh; ++h) {
    EXPECT_EQ(sa[0 * kvh + h], sa0[5 * kvh + h]);
    EXPECT_EQ(sb[2 * kvh + h], -static_cast<float>(5 * kvh + h));
  }
}

// A padding row (slot -1, as the MLA writers already skip) writes nothing: the caches sit one guard row past the
// start of their buffers, so a write at slot -1 would land in the guard (it used to, on both backends).
TEST(KvFp8, PaddingRowsWriteNothing) {
  const int64_t kvh = 2, hd = 8, width = kvh * hd, n_slots = 4, T = 3;
  std::vector<float> k(T * width), v(T * width);
  for (int64_t i = 0; i < T * width; ++i) k[i] = 0.25f * static_cast<float>(i % 7) + 0.5f, v[i] = -k[i];
  const std::vector<int32_t> slots = {2, -1, 0};
  // f32 cache
  std::vector<float> kc((n_slots + 1) * width, 9.f), vc((n_slots + 1) * width, 9.f);
  cpu::kv_write_f32(k.data(), v.data(), slots.data(), kc.data() + width, vc.data() + width, T, width);
  for (int64_t d = 0; d < width; ++d) {
    EXPECT_EQ(kc[d], 9.f) << "k guard row, element " << d;
    EXPECT_EQ(vc[d], 9.f) << "v guard row, element " << d;
    EXPECT_EQ(kc[(1 + 2) * width + d], k[0 * width + d]);
    EXPECT_EQ(kc[(1 + 0) * width + d], k[2 * width + d]);
    EXPECT_EQ(kc[(1 + 1) * width + d], 9.f) << "row 1: no token maps to it";
  }
  // FP8 cache and scales
  std::vector<uint8_t> kq((n_slots + 1) * width, 0x55), vq((n_slots + 1) * width, 0x55);
  std::vector<float> ks((n_slots + 1) * kvh, 7.f), vs((n_slots + 1) * kvh, 7.f);
  cpu::kv_write_fp8(k.data(), v.data(), slots.data(), kq.data() + width, vq.data() + width, ks.data() + kvh,
                    vs.data() + kvh, T, kvh, hd);
  for (int64_t d = 0; d < width; ++d) {
    EXPECT_EQ(kq[d], 0x55) << "k code guard row, element " << d;
    EXPECT_EQ(vq[d], 0x55) << "v code guard row, element " << d;
    EXPECT_NE(kq[(1 + 2) * width + d], 0x55);
  }
  for (int64_t h = 0; h < kvh; ++h) {
    EXPECT_EQ(ks[h], 7.f) << "k scale guard, head " << h;
    EXPECT_EQ(vs[h], 7.f) << "v scale guard, head " << h;
    EXPECT_NE(ks[(1 + 0) * kvh + h], 7.f);
  }
}

}  // namespace
}  // namespace mxserve::kernels
