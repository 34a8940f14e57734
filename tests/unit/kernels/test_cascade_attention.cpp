// Cascade (shared-prefix) decode attention on the CPU (kernels/cascade_attention.h, kernels/cpu/cascade_attention.h):
// the group detection finds exactly the constructed groups (whole shared blocks only, a partly filled block and
// the row's own block in the suffix), the encoding's capacities, and the three-pass cascade equal to the
// per-sequence reference (paged_attention_f32) on random shapes: prefixes of any length, groups of 1..64, rows
// in no group, f32 and FP8 caches.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <numeric>
#include <set>
#include <vector>

#include "kernels/cascade_attention.h"
#include "kernels/cpu/cascade_attention.h"
#include "kernels/cpu/cpu_kernels.h"
#include "cascade_case.h"

namespace mxserve::kernels {
namespace {

using cascade_test::Case;
using cascade_test::CaseSpec;

struct Caches {
  std::vector<float> k, v;              // f32 cache, or the K/V rows an FP8 cache was written from
  std::vector<uint8_t> k8, v8;          // FP8 codes
  std::vector<float> ks, vs;            // FP8 scales
};

Caches fill_caches(const Case& c, bool fp8, std::mt19937& rng) {
  const int64_t width = static_cast<int64_t>(c.p.n_kv_heads) * c.p.head_dim;
  std::normal_distribution<float> nd(0.f, 1.f);
  Caches out;
  out.k.resize(c.n_slots * width);
  out.v.resize(c.n_slots * width);
  for (float& x : out.k) x = nd(rng);
  for (float& x : out.v) x = nd(rng);
  if (fp8) {
    out.k8.resize(c.n_slots * width);
    out.v8.resize(c.n_slots * width);
    out.ks.resize(c.n_slots * c.p.n_kv_heads);
    out.vs.resize(c.n_slots * c.p.n_kv_heads);
    std::vector<int32_t> slots(c.n_slots);
    for (int64_t i = 0; i < c.n_slots; ++i) slots[i] = static_cast<int32_t>(i);
    cpu::kv_write_fp8(out.k.data(), out.v.data(), slots.data(), out.k8.data(), out.v8.data(), out.ks.data(),
                      out.vs.data(), c.n_slots, c.p.n_kv_heads, c.p.head_dim);
  }
  return out;
}

// Runs detection (min_members 1: every constructed group, one-row ones too), checks it against the
// construction, encodes, runs the cascade reference and the per-sequence one; returns the max |diff|.
float run_case(const CaseSpec& spec, bool fp8, uint32_t seed) {
  std::mt19937 rng(seed);
  Case c = cascade_test::make_case(spec, rng);
  Caches caches = fill_caches(c, fp8, rng);
  AttentionParams p = c.p;
  if (fp8) {
    p.k_scales = caches.ks.data();
    p.v_scales = caches.vs.data();
  }
  CascadeGroupOptions opt;
  opt.min_members = 1;
  opt.min_shared_blocks = 1;
  const CascadeLayout layout = find_cascade_groups(c.table_ptrs(), c.n_blocks(), c.kv_index, p.block_size, opt);
  // Detection == construction: every row with >= 1 shared block is in exactly its constructed group.
  std::vector<int32_t> found(p.n_tokens, 0);
  for (const CascadeGroup& g : layout.groups) {
    std::set<int32_t> ids;
    for (int32_t i = 0; i < g.n_members; ++i) {
      const int32_t r = layout.members[g.member_begin + i];
      found[r] = g.shared_blocks;
      ids.insert(c.expect_group[r]);
    }
    EXPECT_EQ(ids.size(), 1u) << "a detected group mixes constructed groups";
    EXPECT_TRUE(g.n_members == 1 || *ids.begin() >= 0) << "lone rows grouped together";
  }
  // A row alone on its blocks (lone, or a constructed group of one) is a group of one over all of its whole
  // blocks before its own key (min_members 1).
  std::vector<int32_t> size(spec.group_sizes.size() + 1, 0);
  for (int32_t r = 0; r < p.n_tokens; ++r) ++size[c.expect_group[r] + 1];
  for (int32_t r = 0; r < p.n_tokens; ++r) {
    const bool alone = c.expect_group[r] < 0 || size[c.expect_group[r] + 1] == 1;
    const int32_t want = alone ? c.kv_index[r] / p.block_size : c.expect_shared_blocks[r];
    EXPECT_EQ(found[r], want) << "row " << r << " kv_index " << c.kv_index[r];
  }
  CascadeShape shape;
  shape.cap_rows = p.n_tokens;
  shape.group_size = p.n_heads / p.n_kv_heads;
  shape.cap_work = cascade_work_capacity(p.n_tokens, shape.group_size, 1);
  shape.max_prefix_keys = p.max_kv_len;
  std::vector<int32_t> buf(shape.n_ints());
  EXPECT_TRUE(encode_cascade(layout, p.block_size, shape, buf.data()));
  const int64_t n = static_cast<int64_t>(p.n_tokens) * p.n_heads * p.head_dim;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(n), want(n), got(n, NAN);
  for (float& x : q) x = nd(rng);
  const void* kc = fp8 ? static_cast<const void*>(caches.k8.data()) : caches.k.data();
  const void* vc = fp8 ? static_cast<const void*>(caches.v8.data()) : caches.v.data();
  cpu::paged_attention_f32(q.data(), kc, vc, c.token_seq.data(), c.kv_index.data(), c.tables.data(), want.data(), p);
  cpu::cascade_attention_f32(q.data(), kc, vc, c.token_seq.data(), c.kv_index.data(), c.tables.data(), buf.data(),
                             shape, got.data(), p);
  float worst = 0.f;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  return worst;
}

TEST(CascadeAttention, EqualsPerSequenceOnRandomShapes) {
  struct Geo {
    int32_t kv, g, d, bs;
  };
  const Geo geos[] = {{2, 4, 32, 16}, {1, 12, 16, 16}, {2, 6, 32, 8}, {1, 16, 16, 32}};
  uint32_t seed = 1;
  for (const Geo& geo : geos)
    for (bool fp8 : {false, true}) {
      CaseSpec s;
      s.n_kv_heads = geo.kv;
      s.group = geo.g;
      s.head_dim = geo.d;
      s.block_size = geo.bs;
      s.group_sizes = {1, 2, 4, 3};
      s.n_lone = 3;
      const float err = run_case(s, fp8, seed++);
      EXPECT_LT(err, 2e-5f) << "kv " << geo.kv << " G " << geo.g << " hd " << geo.d << " bs " << geo.bs
                            << (fp8 ? " fp8" : " f32");
    }
}

TEST(CascadeAttention, GroupsOfOneToSixtyFour) {
  uint32_t seed = 100;
  for (int32_t size : {1, 5, 16, 63, 64}) {
    CaseSpec s;
    s.group = 12;
    s.n_kv_heads = 1;
    s.head_dim = 16;
    s.group_sizes = {size};
    s.n_lone = 1;
    s.max_suffix = 20;
    for (bool fp8 : {false, true}) EXPECT_LT(run_case(s, fp8, seed++), 2e-5f) << "group of " << size;
  }
}

TEST(CascadeAttention, OneSequencePerGroupAndPrefixWithinOneBlock) {
  CaseSpec s;
  s.group_sizes = {1, 1, 1, 1};
  s.min_prefix = 17;  // 1 whole block + a partial one of 1..15 tokens
  s.max_prefix = 31;
  s.min_suffix = 1;
  s.max_suffix = 3;
  EXPECT_LT(run_case(s, false, 7), 2e-5f);
  EXPECT_LT(run_case(s, true, 8), 2e-5f);
}

TEST(CascadeAttention, DetectionCapsAtTheRowsOwnBlockAndSplitsLargeGroups) {
  // Two rows whose tables are identical (a hypothetical full share): the block holding each row's own key
  // (kv_index 35 -> block 2) is never shared, so 2 blocks are.
  const std::vector<int32_t> t = {7, 8, 9};
  CascadeGroupOptions opt;
  opt.min_shared_blocks = 1;
  CascadeLayout l = find_cascade_groups({t.data(), t.data()}, {3, 3}, {35, 35}, 16, opt);
  ASSERT_EQ(l.groups.size(), 1u);
  EXPECT_EQ(l.groups[0].shared_blocks, 2);
  // kv_index 32 is the first key of block 2: still 2 whole blocks before it.
  l = find_cascade_groups({t.data(), t.data()}, {3, 3}, {32, 40}, 16, opt);
  ASSERT_EQ(l.groups.size(), 1u);
  EXPECT_EQ(l.groups[0].shared_blocks, 2);
  // Below the minimum: no group. Default minimum is 4 blocks.
  l = find_cascade_groups({t.data(), t.data()}, {3, 3}, {35, 35}, 16);
  EXPECT_TRUE(l.groups.empty());
  // 130 rows on one prefix -> groups of 64, 64, 2.
  std::vector<int32_t> big(8);
  std::iota(big.begin(), big.end(), 100);
  std::vector<const int32_t*> tabs(130, big.data());
  l = find_cascade_groups(tabs, std::vector<int32_t>(130, 8), std::vector<int32_t>(130, 127), 16);
  ASSERT_EQ(l.groups.size(), 3u);
  EXPECT_EQ(l.groups[0].n_members, 64);
  EXPECT_EQ(l.groups[2].n_members, 2);
  EXPECT_EQ(l.groups[0].shared_blocks, 7);
  // Saving: (64-1 + 64-1 + 2-1) x 112 keys x bytes per key.
  EXPECT_EQ(cascade_saved_bytes(l, 16, 4096), int64_t{127} * 112 * 4096);
}

TEST(CascadeAttention, EncodingRefusesWhatDoesNotFit) {
  const std::vector<int32_t> t = {1, 2, 3, 4, 5};
  CascadeGroupOptions opt;
  opt.min_shared_blocks = 1;
  const CascadeLayout l = find_cascade_groups({t.data(), t.data(), t.data()}, {5, 5, 5}, {70, 70, 75}, 16, opt);
  ASSERT_EQ(l.groups.size(), 1u);
  CascadeShape s;
  s.cap_rows = 3;
  s.group_size = 48;  // 144 query rows: 3 work items of 64
  s.cap_work = 2;
  s.max_prefix_keys = 64;
  std::vector<int32_t> buf(s.n_ints() + 16);
  EXPECT_FALSE(encode_cascade(l, 16, s, buf.data()));  // 3 items > 2
  s.cap_work = cascade_work_capacity(3, 48, 2);
  buf.resize(s.n_ints());
  ASSERT_TRUE(encode_cascade(l, 16, s, buf.data()));
  EXPECT_EQ(buf[0], 64);  // prefix keys of row 0
  const int32_t* w = buf.data() + 2 * s.cap_rows;
  EXPECT_EQ(w[2 + 4], 64);  // second item starts at row 64
  EXPECT_EQ(w[1 + 4 * 2], 3);
  s.max_prefix_keys = 32;  // a prefix past the bound the plan was made for
  EXPECT_FALSE(encode_cascade(l, 16, s, buf.data()));
  s.cap_rows = 2;  // more rows than the capacity
  EXPECT_FALSE(encode_cascade(l, 16, s, buf.data()));
}


// Host emulation of the CUDA kernels' index math (kernels/cuda/attention/cascade_attention.cu): the prefix grid
// (work item, kv head, split) with 4 warps x 16 rows straddling members and the device-side equal 64-key splits,
// the suffix grid (row, kv head, split) with equal 16-key splits, the partials in the kernels' workspace layout
// (o unnormalized, m, l; part = head_row * n_splits + split) and the merge kernel's reads: equal to the per-sequence
// reference for several split counts.
TEST(CascadeAttention, HostEmulationOfTheCudaIndexMath) {
  CaseSpec spec;
  spec.n_kv_heads = 2;
  spec.group = 12;
  spec.head_dim = 16;
  spec.group_sizes = {7, 1, 3};  // 84 rows: two work items for the first group
  spec.n_lone = 2;
  std::mt19937 rng(5);
  const Case c = cascade_test::make_case(spec, rng);
  const AttentionParams& p = c.p;
  const int G = p.n_heads / p.n_kv_heads, D = p.head_dim, H = p.n_heads, T = p.n_tokens;
  const int64_t width = static_cast<int64_t>(p.n_kv_heads) * D;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> k(c.n_slots * width), v(c.n_slots * width), q(static_cast<size_t>(T) * H * D);
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  for (float& x : q) x = nd(rng);
  CascadeGroupOptions opt;
  opt.min_members = 1;
  opt.min_shared_blocks = 1;
  const CascadeLayout layout = find_cascade_groups(c.table_ptrs(), c.n_blocks(), c.kv_index, p.block_size, opt);
  CascadeShape shape;
  shape.cap_rows = T + 3;
  shape.group_size = G;
  shape.cap_work = cascade_work_capacity(shape.cap_rows, G, 1);
  shape.max_prefix_keys = p.max_kv_len;
  std::vector<int32_t> buf(shape.n_ints());
  ASSERT_TRUE(encode_cascade(layout, p.block_size, shape, buf.data()));
  std::vector<float> want(static_cast<size_t>(T) * H * D);
  cpu::paged_attention_f32(q.data(), k.data(), v.data(), c.token_seq.data(), c.kv_index.data(), c.tables.data(),
                           want.data(), p);
  struct Part {
    std::vector<float> o;
    float m = -INFINITY, l = 0.f;
  };
  // Unnormalized partial of (t, head) over keys [b, e) of `table` (what one warp's online softmax ends with).
  auto partial = [&](int64_t t, int h, const int32_t* table, int64_t b, int64_t e) {
    Part r;
    r.o.assign(D, 0.f);
    const int kvh = h / G;
    for (int64_t j = b; j < e; ++j) {
      const int64_t slot = static_cast<int64_t>(table[j / p.block_size]) * p.block_size + j % p.block_size;
      float dot = 0.f;
      for (int d = 0; d < D; ++d) dot += q[(t * H + h) * D + d] * k[slot * width + kvh * D + d];
      const float sc = dot * p.scale, m = std::max(r.m, sc);
      const float a = r.m == -INFINITY ? 0.f : std::exp(r.m - m), w = std::exp(sc - m);
      for (int d = 0; d < D; ++d) r.o[d] = r.o[d] * a + w * v[slot * width + kvh * D + d];
      r.l = r.l * a + w;
      r.m = m;
    }
    return r;
  };
  const int32_t* prefix_keys = buf.data();
  const int32_t* members = buf.data() + shape.cap_rows;
  for (int n_ps : {1, 3, 7})
    for (int n_ss : {1, 2, 5}) {
      std::vector<Part> ws_p(static_cast<size_t>(T) * H * n_ps), ws_s(static_cast<size_t>(T) * H * n_ss);
      std::vector<int> written_p(ws_p.size(), 0);
      for (int x = 0; x < shape.cap_work; ++x) {  // prefix grid
        const int32_t* item = buf.data() + 2 * shape.cap_rows + 4 * x;
        if (item[1] == 0) continue;
        const int keys = item[3], rows_total = item[1] * G;
        const int split_len = ((keys + n_ps - 1) / n_ps + 63) / 64 * 64;
        const int32_t* table = c.tables.data() + static_cast<int64_t>(c.token_seq[members[item[0]]]) * p.max_blocks_per_seq;
        for (int kvh = 0; kvh < p.n_kv_heads; ++kvh)
          for (int split = 0; split < n_ps; ++split)
            for (int w = 0; w < 4; ++w)
              for (int lane_row = 0; lane_row < 16; ++lane_row) {
                const int r = item[2] + w * 16 + lane_row;
                if (r >= rows_total) continue;
                const int64_t t = members[item[0] + r / G];
                const int h = kvh * G + r % G;
                const int b = split * split_len, e = std::min(keys, b + split_len);
                ws_p[(t * H + h) * n_ps + split] = partial(t, h, table, b, e);
                ++written_p[(t * H + h) * n_ps + split];
              }
      }
      for (int64_t t = 0; t < T; ++t)  // suffix grid
        for (int h = 0; h < H; ++h)
          for (int split = 0; split < n_ss; ++split) {
            // A grouped row: its suffix in equal 16-key aligned parts; a row in no group: the per-warp decode
            // kernel's fixed split length (the planner's: max context / splits, 64-aligned).
            const int n_ctx = c.kv_index[t] + 1, suffix = std::max(0, n_ctx - prefix_keys[t]);
            const int plain = n_ss == 1 ? (1 << 30) : ((p.max_kv_len + n_ss - 1) / n_ss + 63) / 64 * 64;
            const int split_len = prefix_keys[t] == 0 ? plain : ((suffix + n_ss - 1) / n_ss + 15) / 16 * 16;
            const int b = prefix_keys[t] + split * split_len, e = std::min(n_ctx, b + split_len);
            ws_s[(t * H + h) * n_ss + split] =
                partial(t, h, c.tables.data() + t * p.max_blocks_per_seq, b, e);
          }
      float worst = 0.f;
      for (int64_t t = 0; t < T; ++t)  // merge
        for (int h = 0; h < H; ++h) {
          const int64_t row = t * H + h;
          if (prefix_keys[t] > 0)
            for (int s = 0; s < n_ps; ++s) EXPECT_EQ(written_p[row * n_ps + s], 1) << "row " << row << " split " << s;
          float mx = -INFINITY;
          for (int s = 0; s < n_ss; ++s) mx = std::max(mx, ws_s[row * n_ss + s].m);
          if (prefix_keys[t] > 0)
            for (int s = 0; s < n_ps; ++s) mx = std::max(mx, ws_p[row * n_ps + s].m);
          for (int d = 0; d < D; ++d) {
            float den = 0.f, acc = 0.f;
            auto add = [&](const Part& x) {
              if (x.m == -INFINITY) return;
              const float w = std::exp(x.m - mx);
              den += x.l * w;
              acc += x.o[d] * w;
            };
            for (int s = 0; s < n_ss; ++s) add(ws_s[row * n_ss + s]);
            if (prefix_keys[t] > 0)
              for (int s = 0; s < n_ps; ++s) add(ws_p[row * n_ps + s]);
            worst = std::max(worst, std::fabs(acc / den - want[row * D + d]));
          }
        }
      EXPECT_LT(worst, 2e-5f) << "prefix splits " << n_ps << ", suffix splits " << n_ss;
    }
}

}  // namespace
}  // namespace mxserve::kernels
