// Backend::rope_kv_write's default (backend/rope_kv_write.cpp) on the CPU reference backend against the ops GQA
// attention ran before it existed -- q, k, v as separate contiguous tensors, rope(q), rope(k), kv_write -- BIT FOR
// BIT: q, the cache rows (f32 and FP8 E4M3 codes) and the FP8 scales; odd row counts, T == 1 (the view path),
// partial rotary (GLM-4.5: rotary_dim = head_dim / 2) and full rotary, GLM-4.5-Air's 96 / 8 x 128 heads. And the
// other half of "one QKV GEMM at every row count": on the CPU (f32 weights fuse only under MXSERVE_FUSED_PROJ=force)
// the fused GEMM's columns equal the three separate GEMMs within f32 summation order -- not always bit for bit, see
// FusedGemmColumnsMatchSeparateGemms; the verify_fixture_cpu_fusedproj_* tests run the whole model that way.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace mxserve {
namespace {

struct Shape4 {
  int hq, hkv, hd, rd;
};

class RopeKvWriteCpu : public ::testing::Test {
 protected:
  std::unique_ptr<backend::Backend> be_ = backend::make_cpu_backend();
  std::mt19937 rng_{20261206};

  Tensor rand(Shape s, float scale) {
    std::normal_distribution<float> n(0.f, scale);
    Tensor t = Tensor::empty(DType::kF32, std::move(s));
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng_);
    return t;
  }
  Tensor clone(const Tensor& t) {
    Tensor c = Tensor::empty(t.dtype(), t.shape());
    std::memcpy(c.raw(), t.raw(), t.nbytes());
    return c;
  }
  // Columns [b, e) of host y [T, N] as a new contiguous host tensor.
  static Tensor columns(const Tensor& y, int64_t b, int64_t e) {
    const int64_t T = y.dim(0), N = y.dim(1);
    Tensor c = Tensor::empty(DType::kF32, {T, e - b});
    for (int64_t t = 0; t < T; ++t) std::memcpy(c.data<float>() + t * (e - b), y.data<float>() + t * N + b, 4 * (e - b));
    return c;
  }
  static void expect_bits(const Tensor& got, const Tensor& ref, const std::string& what) {
    ASSERT_EQ(got.nbytes(), ref.nbytes()) << what;
    int64_t diff = 0, first = -1;
    const auto* a = static_cast<const uint8_t*>(got.raw());
    const auto* b = static_cast<const uint8_t*>(ref.raw());
    for (size_t i = 0; i < ref.nbytes(); ++i)
      if (a[i] != b[i] && diff++ == 0) first = static_cast<int64_t>(i);
    EXPECT_EQ(diff, 0) << what << ": " << diff << " bytes differ, first at byte " << first;
  }

  void run_case(const Shape4& s, int64_t T, bool fp8) {
    SCOPED_TRACE("hq " + std::to_string(s.hq) + " hkv " + std::to_string(s.hkv) + " hd " + std::to_string(s.hd) +
                 " rd " + std::to_string(s.rd) + " T " + std::to_string(T) + (fp8 ? " fp8" : " f32"));
    const int64_t nq = int64_t{s.hq} * s.hd, nkv = int64_t{s.hkv} * s.hd, n_slots = 2 * T + 5;
    const Tensor y = rand({T, nq + 2 * nkv}, 1.f);
    Tensor pos = Tensor::empty(DType::kI32, {T});
    std::vector<int32_t> slots(n_slots);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng_);
    Tensor slot_map = Tensor::empty(DType::kI32, {T});
    for (int64_t t = 0; t < T; ++t) {
      pos.data<int32_t>()[t] = static_cast<int32_t>(1000 * t + 7 * t * t + 3);  // large angles too
      slot_map.data<int32_t>()[t] = slots[t];
    }
    kernels::RopeParams rp;
    rp.n_heads = s.hq;
    rp.head_dim = s.hd;
    rp.rotary_dim = s.rd;
    rp.theta = 1e6f;
    const DType cdt = fp8 ? DType::kFP8E4M3 : DType::kF32;
    // Both paths start from the same cache contents (random bytes), so an unwritten row shows as equal
    // garbage on both sides only where neither wrote; the checks below also require the written rows to move.
    Tensor kc0 = Tensor::empty(cdt, {n_slots, nkv}), vc0 = Tensor::empty(cdt, {n_slots, nkv});
    Tensor ks0 = Tensor::empty(DType::kF32, {n_slots, s.hkv}), vs0 = Tensor::empty(DType::kF32, {n_slots, s.hkv});
    for (Tensor* t : {&kc0, &vc0, &ks0, &vs0}) {
      auto* b = static_cast<uint8_t*>(t->raw());
      for (size_t i = 0; i < t->nbytes(); ++i) b[i] = static_cast<uint8_t>(t->dtype() == DType::kF32 ? 0 : rng_() % 0x7e);
    }
    struct Out {
      Tensor q, kc, vc, ks, vs;
    };
    auto meta_for = [&](Out& o) {
      backend::AttentionMeta m;
      m.slot_mapping = slot_map;
      m.params.n_heads = s.hq;
      m.params.n_kv_heads = s.hkv;
      m.params.head_dim = s.hd;
      if (fp8) {
        m.params.k_scales = o.ks.data<float>();
        m.params.v_scales = o.vs.data<float>();
      }
      return m;
    };
    Out a{Tensor(), clone(kc0), clone(vc0), clone(ks0), clone(vs0)};
    Out b{Tensor(), clone(kc0), clone(vc0), clone(ks0), clone(vs0)};
    {  // the op
      Tensor yy = clone(y);
      const backend::AttentionMeta m = meta_for(a);
      const Tensor q = be_->rope_kv_write(yy, pos, rp, m, a.kc, a.vc);
      ASSERT_EQ(q.numel(), T * nq);
      a.q = clone(q.reshape({T, nq}));
    }
    {  // the ops GQA attention ran before
      Tensor q = columns(y, 0, nq), k = columns(y, nq, nq + nkv), v = columns(y, nq + nkv, nq + 2 * nkv);
      const backend::AttentionMeta m = meta_for(b);
      be_->rope(q, pos, rp);
      kernels::RopeParams pk = rp;
      pk.n_heads = s.hkv;
      be_->rope(k, pos, pk);
      be_->kv_write(k, v, m, b.kc, b.vc);
      b.q = q;
    }
    expect_bits(a.q, b.q, "q");
    expect_bits(a.kc, b.kc, "k_cache");
    expect_bits(a.vc, b.vc, "v_cache");
    if (fp8) {
      expect_bits(a.ks, b.ks, "k_scales");
      expect_bits(a.vs, b.vs, "v_scales");
    }
    // The op did the work: q was rotated (differs from y's q columns where rd > 0, token positions != 0) and
    // every written row changed from its initial bytes.
    const Tensor q_in = columns(y, 0, nq);
    EXPECT_NE(std::memcmp(a.q.raw(), q_in.raw(), q_in.nbytes()), 0) << "q was not roped";
    const size_t row_bytes = a.kc.nbytes() / n_slots;
    for (int64_t t = 0; t < T; ++t) {
      const size_t at = static_cast<size_t>(slots[t]) * row_bytes;
      EXPECT_NE(std::memcmp(static_cast<uint8_t*>(a.kc.raw()) + at, static_cast<uint8_t*>(kc0.raw()) + at, row_bytes), 0)
          << "k row of token " << t << " unwritten";
    }
  }
};

TEST_F(RopeKvWriteCpu, DefaultEqualsTheSeparateOpsBitForBit) {
  const Shape4 shapes[] = {{4, 2, 16, 8}, {6, 2, 32, 32}, {2, 1, 24, 16}};
  for (const Shape4& s : shapes)
    for (int64_t T : {1, 3, 17})
      for (bool fp8 : {false, true}) run_case(s, T, fp8);
}

TEST_F(RopeKvWriteCpu, GlmAirAttentionShape) {  // 96 q / 8 kv heads x 128, rotary_dim 64 (partial_rotary 0.5)
  for (int64_t T : {1, 5})
    for (bool fp8 : {false, true}) run_case({96, 8, 128, 64}, T, fp8);
}

TEST_F(RopeKvWriteCpu, FusedGemmColumnsMatchSeparateGemms) {
  struct G {
    int64_t K, nq, nkv;
  };
  for (const G g : {G{64, 128, 32}, G{512, 768, 128}})
    for (int64_t T : {1, 3, 16, 130}) {
      SCOPED_TRACE("K " + std::to_string(g.K) + " nq " + std::to_string(g.nq) + " T " + std::to_string(T));
      const Tensor x = rand({T, g.K}, 1.f);
      const Tensor wq = rand({g.nq, g.K}, 0.05f), wk = rand({g.nkv, g.K}, 0.05f), wv = rand({g.nkv, g.K}, 0.05f);
      const Tensor bq = rand({g.nq}, 0.1f), bk = rand({g.nkv}, 0.1f), bv = rand({g.nkv}, 0.1f);
      Tensor w = Tensor::empty(DType::kF32, {g.nq + 2 * g.nkv, g.K}), bias = Tensor::empty(DType::kF32, {g.nq + 2 * g.nkv});
      std::memcpy(w.data<float>(), wq.raw(), wq.nbytes());
      std::memcpy(w.data<float>() + g.nq * g.K, wk.raw(), wk.nbytes());
      std::memcpy(w.data<float>() + (g.nq + g.nkv) * g.K, wv.raw(), wv.nbytes());
      std::memcpy(bias.data<float>(), bq.raw(), bq.nbytes());
      std::memcpy(bias.data<float>() + g.nq, bk.raw(), bk.nbytes());
      std::memcpy(bias.data<float>() + g.nq + g.nkv, bv.raw(), bv.nbytes());
      for (bool with_bias : {false, true}) {
        Tensor y = Tensor::empty(DType::kF32, {T, g.nq + 2 * g.nkv});
        Tensor q = Tensor::empty(DType::kF32, {T, g.nq}), k = Tensor::empty(DType::kF32, {T, g.nkv}),
               v = Tensor::empty(DType::kF32, {T, g.nkv});
        be_->linear(x, w, with_bias ? &bias : nullptr, y);
        be_->linear(x, wq, with_bias ? &bq : nullptr, q);
        be_->linear(x, wk, with_bias ? &bk : nullptr, k);
        be_->linear(x, wv, with_bias ? &bv : nullptr, v);
        // Not bit for bit on every shape: OpenBLAS picks its sgemm kernel per call shape, so a narrow k / v GEMM
        // and the wide fused one may sum a dot product in different orders (0.3.21 here: the Haswell, SkylakeX
        // and Cooperlake kernels differ in the last bits at T 16 / K 64 and T 3 / K 512; the Sandybridge ones do
        // not). Checked against the f32 summation bound of any order: |a - b| <= 2 K 2^-24 (sum |x w| + |bias|).
        auto expect_close = [&](const Tensor& fused, const Tensor& sep, const Tensor& wp, const Tensor& bp,
                                const char* what) {
          const int64_t n = sep.dim(1);
          int64_t bad = 0;
          for (int64_t t = 0; t < T; ++t)
            for (int64_t c = 0; c < n; ++c) {
              double mag = with_bias ? std::fabs(bp.data<float>()[c]) : 0.0;
              for (int64_t kk = 0; kk < g.K; ++kk)
                mag += std::fabs(double{x.data<float>()[t * g.K + kk]} * wp.data<float>()[c * g.K + kk]);
              const double bound = 2.0 * static_cast<double>(g.K + 1) * std::ldexp(1.0, -24) * mag;
              if (std::fabs(double{fused.data<float>()[t * n + c]} - sep.data<float>()[t * n + c]) > bound) ++bad;
            }
          EXPECT_EQ(bad, 0) << what << (with_bias ? " (bias)" : "") << ": elements past the f32 summation bound";
        };
        expect_close(columns(y, 0, g.nq), q, wq, bq, "q");
        expect_close(columns(y, g.nq, g.nq + g.nkv), k, wk, bk, "k");
        expect_close(columns(y, g.nq + g.nkv, g.nq + 2 * g.nkv), v, wv, bv, "v");
      }
    }
}

}  // namespace
}  // namespace mxserve
