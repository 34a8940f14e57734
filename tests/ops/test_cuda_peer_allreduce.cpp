// The fused peer all-reduce + residual add + RMSNorm (parallel/peer_allreduce.h) on ONE GPU: N = 2, 4, 8
// "ranks" are N CUDA backends on device 0 (each with its own stream, so the ranks' kernels run concurrently
// and really meet at the flag barriers), against a CPU reference of the documented math:
//   residual = bf16(residual + (x_0 + ... + x_{N-1}))  f32 sum in rank order  -> compared bit-exactly
//   out      = bf16(w * (residual / rms(residual)))                            -> within 1 bf16 ulp
// and every rank's out and residual must be bitwise identical. One-shot and two-shot are forced through
// the size thresholds; odd widths take the scalar path; many calls in a row check the epoch counters; the
// NCCL fallback path runs with a one-rank NCCL communicator. Label gpu; skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdlib.h>

#include "backend/backend.h"
#include "gpu_oracle.h"
#include "backend/cuda_backend.h"
#include "core/numeric.h"
#include "parallel/nccl_communicator.h"
#include "parallel/peer_allreduce.h"

namespace mxserve::parallel {
namespace {

// Before any CUDA call: one hardware queue per stream for up to 32 streams, so the N ranks' kernels (N streams
// of one device) never queue behind each other (they wait for each other at the barriers).
const int kConnections = setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);

float bf16r(float v) { return bf16_to_f32(f32_to_bf16(v)); }

Tensor random_host(std::mt19937& rng, Shape shape, float lo, float hi) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = bf16r(d(rng));
  return t;
}

struct Ranks {
  std::vector<std::unique_ptr<backend::Backend>> be;
  std::vector<std::unique_ptr<PeerAllReduce>> ar;
};

class PeerAllReduceTest : public gpu_oracle::CudaTest {  // gpu_: the skip check; the ranks make their own
 protected:
  static Ranks make(int n, const PeerAllReduceOptions& opt) {
    Ranks k;
    for (int r = 0; r < n; ++r) {
      auto be = backend::make_backend("cuda");
      EXPECT_TRUE(be.is_ok()) << be.status().to_string();
      if (!be.is_ok()) return k;
      k.be.push_back(std::move(be).value());
    }
    auto g = make_peer_allreduce_group(std::vector<int>(n, 0), opt);
    EXPECT_TRUE(g.is_ok()) << g.status().to_string();
    if (g.is_ok()) k.ar = std::move(*g);
    return k;
  }
  static Tensor dev(backend::Backend& be, const Tensor& host) {
    Tensor t = be.alloc(DType::kBF16, host.shape());
    be.copy_weight(host, t);
    return t;
  }

  // Runs one call on every rank (rank order, each on its own stream) and checks against the reference.
  // Returns the worst out error in bf16 ulps-ish (|d| / |ref| * 128).
  static void check_case(Ranks& k, int64_t R, int64_t C, uint32_t seed, FusedPath want, Communicator* fallback,
                         int repeat = 1) {
    const int n = static_cast<int>(k.be.size());
    SCOPED_TRACE("world " + std::to_string(n) + " rows " + std::to_string(R) + " cols " + std::to_string(C));
    ASSERT_EQ(k.ar[0]->path_for(static_cast<uint64_t>(R * C * 2)), want);
    std::mt19937 rng(seed);
    std::vector<Tensor> hx, dx, dres, dout;
    Tensor hres, hw = random_host(rng, {C}, 0.5f, 1.5f);
    std::vector<Tensor> dw;
    for (int it = 0; it < repeat; ++it) {
      hx.clear();
      dx.clear();
      dres.clear();
      dout.clear();
      dw.clear();
      hres = random_host(rng, {R, C}, -2.f, 2.f);
      for (int r = 0; r < n; ++r) {
        hx.push_back(random_host(rng, {R, C}, -1.f, 1.f));
        dx.push_back(dev(*k.be[r], hx[r]));
        dres.push_back(dev(*k.be[r], hres));
        dw.push_back(dev(*k.be[r], hw));
        dout.push_back(k.be[r]->alloc(DType::kBF16, {R, C}));
        k.be[r]->synchronize();
      }
      for (int r = 0; r < n; ++r) {
        const Status s = k.ar[r]->allreduce_add_rmsnorm(dx[r], dres[r], dw[r], 1e-5f, dout[r],
                                                        backend::cuda_backend_stream(*k.be[r]), fallback);
        ASSERT_TRUE(s.is_ok()) << s.to_string();
      }
      for (int r = 0; r < n; ++r) {
        const Status s = k.ar[r]->check(backend::cuda_backend_stream(*k.be[r]));
        ASSERT_TRUE(s.is_ok()) << s.to_string();
      }
    }
    // Reference of the last iteration.
    Tensor ref_res = Tensor::empty(DType::kF32, {R, C}), ref_out = Tensor::empty(DType::kF32, {R, C});
    for (int64_t i = 0; i < R; ++i) {
      double ss = 0;
      for (int64_t c = 0; c < C; ++c) {
        float acc = 0.f;
        for (int r = 0; r < n; ++r) acc += hx[r].data<float>()[i * C + c];
        const float v = bf16r(hres.data<float>()[i * C + c] + acc);
        ref_res.data<float>()[i * C + c] = v;
        ss += static_cast<double>(v) * v;
      }
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / C + 1e-5));
      for (int64_t c = 0; c < C; ++c)
        ref_out.data<float>()[i * C + c] = bf16r(hw.data<float>()[c] * (ref_res.data<float>()[i * C + c] * inv));
    }
    Tensor out0 = k.be[0]->to_host(dout[0]), res0 = k.be[0]->to_host(dres[0]);
    int64_t res_mismatch = 0, out_bad = 0;
    double worst = 0;
    for (int64_t e = 0; e < R * C; ++e) {
      res_mismatch += res0.data<float>()[e] != ref_res.data<float>()[e];
      const double ref = ref_out.data<float>()[e], d = std::fabs(out0.data<float>()[e] - ref);
      const double ulps = d / std::max(std::fabs(ref), 1e-6) * 128.0;
      worst = std::max(worst, ulps);
      out_bad += !(d <= std::fabs(ref) / 128.0 + 1e-6);
    }
    EXPECT_EQ(res_mismatch, 0) << "residual elements differing from the reference";
    EXPECT_EQ(out_bad, 0) << "out elements more than 1 bf16 ulp from the reference";
    for (int r = 1; r < n; ++r) {
      Tensor o = k.be[r]->to_host(dout[r]), s = k.be[r]->to_host(dres[r]);
      EXPECT_EQ(std::memcmp(o.raw(), out0.raw(), o.nbytes()), 0) << "rank " << r << "'s out differs from rank 0's";
      EXPECT_EQ(std::memcmp(s.raw(), res0.raw(), s.nbytes()), 0) << "rank " << r << "'s residual differs from rank 0's";
    }
    std::printf("%s world %d rows %lld cols %lld (%s, x%d): residual mismatches %lld, out max err %.2f ulp\n",
                (res_mismatch == 0 && out_bad == 0) ? "PASS" : "FAIL", n, static_cast<long long>(R),
                static_cast<long long>(C), fused_path_name(want), repeat, static_cast<long long>(res_mismatch), worst);
  }
};

const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 7}, {3, 64}, {17, 1003}, {5, 4096}, {64, 5120}, {257, 40}};

TEST_F(PeerAllReduceTest, OneShotMatchesReference) {
  PeerAllReduceOptions opt;
  opt.one_shot_max_bytes = opt.capacity_bytes;
  for (int n : {2, 4, 8}) {
    Ranks k = make(n, opt);
    ASSERT_EQ(static_cast<int>(k.ar.size()), n);
    uint32_t seed = 1;
    for (auto [R, C] : kShapes) check_case(k, R, C, seed++, FusedPath::kOneShot, nullptr);
  }
}

TEST_F(PeerAllReduceTest, TwoShotMatchesReference) {
  PeerAllReduceOptions opt;
  opt.one_shot_max_bytes = 0;
  for (int n : {2, 4, 8}) {
    Ranks k = make(n, opt);
    ASSERT_EQ(static_cast<int>(k.ar.size()), n);
    uint32_t seed = 100;
    for (auto [R, C] : kShapes) check_case(k, R, C, seed++, FusedPath::kTwoShot, nullptr);
  }
}

TEST_F(PeerAllReduceTest, ManyCallsInARowKeepTheEpochsInStep) {
  PeerAllReduceOptions opt;  // default thresholds: small one-shot, larger two-shot
  Ranks k = make(4, opt);
  ASSERT_EQ(k.ar.size(), 4u);
  check_case(k, 8, 4096, 7, FusedPath::kOneShot, nullptr, /*repeat=*/50);
  check_case(k, 512, 4096, 8, FusedPath::kTwoShot, nullptr, /*repeat=*/20);
  check_case(k, 8, 4096, 9, FusedPath::kOneShot, nullptr, /*repeat=*/5);
}

TEST_F(PeerAllReduceTest, OneRankIsTheLocalAddNorm) {
  Ranks k = make(1, PeerAllReduceOptions{});
  ASSERT_EQ(k.ar.size(), 1u);
  for (auto [R, C] : kShapes) check_case(k, R, C, 33, FusedPath::kLocal, nullptr);
}

TEST_F(PeerAllReduceTest, AboveCapacityGoesThroughNccl) {
  PeerAllReduceOptions opt;
  opt.capacity_bytes = 1024;
  Ranks k = make(1, opt);
  ASSERT_EQ(k.ar.size(), 1u);
  RankLayout one;
  auto comms = make_nccl_communicators({one}, {k.be[0].get()}, nullptr);
  ASSERT_TRUE(comms.is_ok()) << comms.status().to_string();
  check_case(k, 64, 5120, 44, FusedPath::kNccl, (*comms)[0].get());
  // Without a communicator the NCCL path is an error naming the sizes, not a crash.
  Tensor x = k.be[0]->alloc(DType::kBF16, {64, 5120}), res = k.be[0]->alloc(DType::kBF16, {64, 5120}),
         out = k.be[0]->alloc(DType::kBF16, {64, 5120}), w = k.be[0]->alloc(DType::kBF16, {5120});
  const Status s = k.ar[0]->allreduce_add_rmsnorm(x, res, w, 1e-5f, out, backend::cuda_backend_stream(*k.be[0]), nullptr);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("no NCCL communicator"), std::string::npos) << s.message();
}

TEST_F(PeerAllReduceTest, BadShapesAreErrors) {
  Ranks k = make(2, PeerAllReduceOptions{});
  ASSERT_EQ(k.ar.size(), 2u);
  auto& be = *k.be[0];
  Tensor x = be.alloc(DType::kBF16, {4, 64}), res = be.alloc(DType::kBF16, {4, 32}), out = be.alloc(DType::kBF16, {4, 64}),
         w = be.alloc(DType::kBF16, {64}), xf = be.alloc(DType::kF32, {4, 64});
  Status s = k.ar[0]->allreduce_add_rmsnorm(x, res, w, 1e-5f, out, backend::cuda_backend_stream(be), nullptr);
  EXPECT_NE(s.message().find("must be the same [R, C]"), std::string::npos) << s.message();
  s = k.ar[0]->allreduce_add_rmsnorm(xf, out, w, 1e-5f, x, backend::cuda_backend_stream(be), nullptr);
  EXPECT_NE(s.message().find("x must be a contiguous bf16 tensor"), std::string::npos) << s.message();
  EXPECT_FALSE(make_peer_allreduce_group(std::vector<int>(9, 0)).is_ok());
}

}  // namespace
}  // namespace mxserve::parallel
