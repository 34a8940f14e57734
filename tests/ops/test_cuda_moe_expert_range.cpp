// Expert parallelism on CUDA (issue 32 item 2): Backend::moe_experts with a rank's expert range. For ep = 2
// and 4 the layer's E experts are split into contiguous ranges (ExpertWeights::first_expert, global_experts);
// each "rank" runs moe_experts on the router's GLOBAL ids with only its experts, and the sum of the ranks'
// partial outputs must equal the one-rank output (bf16: within a few bf16 ulps, rel L2 <= 5e-3). Covers bf16
// (GEMV and grouped GEMM paths) and MXFP4 experts, one token (the MXFP4 one-token direct mode must not run
// with foreign ids), a rank whose experts no token picked (its partial sum is exactly zero, no trap), and
// foreign ids never touching the output (out keeps its prior value: the kernels accumulate). Label gpu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/numeric.h"

namespace mxserve {
namespace {

struct Problem {
  int64_t T, H, I;
  int E, K;
  bool mxfp4;
  int pool;  // ids drawn from [0, pool) (pool < E: the last ranks hold no picked expert)
};

class CudaMoeExpertRange : public ::testing::Test {
 protected:
  void SetUp() override {
    auto be = backend::make_backend("cuda");
    if (!be.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << be.status().to_string() << ")";
    be_ = std::move(*be);
  }

  Tensor bf16_host(Shape s, float scale) {
    std::uniform_real_distribution<float> u(-scale, scale);
    Tensor t = Tensor::empty(DType::kBF16, std::move(s));
    for (int64_t i = 0; i < t.numel(); ++i) t.data<uint16_t>()[i] = f32_to_bf16(u(rng_));
    return t;
  }
  Tensor u8_host(Shape s, int lo, int hi) {
    std::uniform_int_distribution<int> u(lo, hi);
    Tensor t = Tensor::empty(DType::kU8, std::move(s));
    for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(u(rng_));
    return t;
  }

  // The host weights of all E experts.
  struct HostExperts {
    Tensor gate_up, down, gate_up_s, down_s;
  };
  HostExperts make_experts(const Problem& p) {
    HostExperts h;
    if (p.mxfp4) {
      // E8M0 scales around 1 / (3 sqrt(k)): codes up to 6, so |w| stays ~1/sqrt(k).
      const int su = 127 - static_cast<int>(std::lround(std::log2(3.0 * std::sqrt(double(p.H)))));
      const int sd = 127 - static_cast<int>(std::lround(std::log2(3.0 * std::sqrt(double(p.I)))));
      h.gate_up = u8_host({p.E, 2 * p.I, p.H / 2}, 0, 255);
      h.gate_up_s = u8_host({p.E, 2 * p.I, p.H / 32}, su - 1, su + 1);
      h.down = u8_host({p.E, p.H, p.I / 2}, 0, 255);
      h.down_s = u8_host({p.E, p.H, p.I / 32}, sd - 1, sd + 1);
    } else {
      h.gate_up = bf16_host({p.E, 2 * p.I, p.H}, 1.f / std::sqrt(float(p.H)));
      h.down = bf16_host({p.E, p.H, p.I}, 1.f / std::sqrt(float(p.I)));
    }
    return h;
  }
  static Tensor copy_of(const Tensor& view) {  // a fresh host tensor with the view's rows
    Tensor t = Tensor::empty(view.dtype(), view.shape());
    std::memcpy(t.raw(), view.raw(), t.nbytes());
    return t;
  }
  // Experts [first, first + n) on the device (n == E, first == 0: the unpartitioned layer).
  backend::ExpertWeights upload(const Problem& p, const HostExperts& h, int64_t first, int64_t n) {
    backend::ExpertWeights ex;
    ex.format = p.mxfp4 ? backend::ExpertFormat::kMxfp4 : backend::ExpertFormat::kFloat;
    ex.gate_up = be_->upload(copy_of(h.gate_up.slice_rows(first, first + n)));
    ex.down = be_->upload(copy_of(h.down.slice_rows(first, first + n)));
    if (p.mxfp4) {
      ex.gate_up_scales = be_->upload(copy_of(h.gate_up_s.slice_rows(first, first + n)));
      ex.down_scales = be_->upload(copy_of(h.down_s.slice_rows(first, first + n)));
    }
    ex.first_expert = first;
    ex.global_experts = n == p.E ? 0 : p.E;
    be_->prepare_moe(ex, p.K);
    return ex;
  }

  // out (host f32 [T, H]) = prior + moe_experts(x) with the given experts.
  std::vector<float> run(const Problem& p, const backend::ExpertWeights& ex, const Tensor& x, const Tensor& ids,
                         const Tensor& w, const Tensor& prior) {
    Tensor dx = be_->upload(x), di = be_->upload(ids), dw = be_->upload(w), out = be_->upload(prior);
    be_->moe_experts(dx, di, dw, ex, out);
    be_->synchronize();
    Tensor h = be_->to_host(out);
    return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
  }

  void check(const Problem& p) {
    SCOPED_TRACE(std::string(p.mxfp4 ? "mxfp4" : "bf16") + " T=" + std::to_string(p.T) + " E=" +
                 std::to_string(p.E) + " K=" + std::to_string(p.K) + " pool=" + std::to_string(p.pool));
    const HostExperts h = make_experts(p);
    const Tensor x = bf16_host({p.T, p.H}, 1.f);
    Tensor ids = Tensor::empty(DType::kI32, {p.T, p.K});
    Tensor w = Tensor::empty(DType::kF32, {p.T, p.K});
    std::vector<int> perm(p.pool);
    for (int64_t t = 0; t < p.T; ++t) {  // K distinct experts per token, from the pool
      for (int e = 0; e < p.pool; ++e) perm[e] = e;
      std::shuffle(perm.begin(), perm.end(), rng_);
      for (int k = 0; k < p.K; ++k) {
        ids.data<int32_t>()[t * p.K + k] = perm[k];
        w.data<float>()[t * p.K + k] = std::uniform_real_distribution<float>(0.1f, 1.f)(rng_);
      }
    }
    Tensor zero = Tensor::empty(DType::kBF16, {p.T, p.H});
    std::memset(zero.raw(), 0, zero.nbytes());
    const std::vector<float> ref = run(p, upload(p, h, 0, p.E), x, ids, w, zero);
    double ref2 = 0;
    for (float v : ref) ref2 += double(v) * v;
    ASSERT_GT(ref2, 0.0);
    for (int ep : {2, 4}) {
      const int64_t n = p.E / ep;
      std::vector<double> sum(ref.size(), 0.0);
      for (int r = 0; r < ep; ++r) {
        const std::vector<float> part = run(p, upload(p, h, r * n, n), x, ids, w, zero);
        bool picked = false;
        for (int64_t i = 0; i < ids.numel(); ++i) picked |= ids.data<int32_t>()[i] / n == r;
        if (!picked)  // no token picked this rank's experts: nothing was added
          for (size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], 0.f) << "ep " << ep << " rank " << r;
        for (size_t i = 0; i < part.size(); ++i) sum[i] += part[i];
      }
      double d2 = 0;
      for (size_t i = 0; i < ref.size(); ++i) d2 += (sum[i] - ref[i]) * (sum[i] - ref[i]);
      EXPECT_LE(std::sqrt(d2 / ref2), 5e-3) << "ep " << ep << ": sum of partial outputs vs one rank";
    }
    // Foreign ids only (rank 1 of ep 2 when every id is on rank 0): out keeps its prior contents exactly.
    if (p.pool <= p.E / 2) {
      const Tensor prior = bf16_host({p.T, p.H}, 1.f);
      const std::vector<float> kept = run(p, upload(p, h, p.E / 2, p.E / 2), x, ids, w, prior);
      for (int64_t i = 0; i < prior.numel(); ++i)
        ASSERT_EQ(kept[i], bf16_to_f32(prior.data<uint16_t>()[i])) << "element " << i;
    }
  }

  std::unique_ptr<backend::Backend> be_;
  std::mt19937 rng_{1234};
};

TEST_F(CudaMoeExpertRange, Bf16) {
  for (int64_t T : {1, 3, 40, 300}) check({T, 128, 64, 8, 2, false, 8});
  check({16, 256, 96, 16, 4, false, 16});
}

TEST_F(CudaMoeExpertRange, Bf16GroupedKernel) {
  backend::KernelOptions o;
  o.moe_kernel = "grouped";
  ASSERT_TRUE(be_->set_kernel_options(o).is_ok());
  for (int64_t T : {1, 40}) check({T, 128, 64, 8, 2, false, 8});
}

TEST_F(CudaMoeExpertRange, Mxfp4) {
  for (int64_t T : {1, 2, 37, 256}) check({T, 256, 128, 8, 2, true, 8});
  check({1, 256, 128, 16, 4, true, 16});
}

TEST_F(CudaMoeExpertRange, RankWithoutPickedExperts) {
  check({9, 128, 64, 8, 2, false, 4});  // ids in [0, 4): ep 2 rank 1 and ep 4 ranks 2, 3 get no pair
  check({1, 256, 128, 8, 2, true, 4});
  check({33, 256, 128, 8, 2, true, 4});
}

}  // namespace
}  // namespace mxserve
