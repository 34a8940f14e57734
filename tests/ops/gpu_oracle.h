// The ONE GPU-oracle harness of the CUDA op tests (issue 31; every tests/ops/test_cuda_*.cpp uses it): a CUDA
// kernel's output checked against an oracle (the CPU reference backend, a host reference, or an older kernel),
// in the style of llama.cpp's test-backend-ops. Owns:
//   - the error measure: rel_l2 = ||got - ref||_2 / ||ref||_2 and max |got - ref| (Err, compare, rel_l2);
//     a NaN / Inf in `got` (an unwritten poisoned element, an overflow) or a NaN in `ref` is an infinite error;
//   - the tolerance report: one "[ err ]" line per check with rel_l2, max_abs and the tolerance (docs/cuda.md's
//     op table comes from these lines), and the EXPECT (expect_within, EXPECT_WITHIN);
//   - the device checks (have_cuda_device, have_sm90, MXSERVE_SKIP_WITHOUT_CUDA) and the fixtures: CudaTest (the
//     CUDA backend, skipped with a clear message without a CUDA device) and CudaVsCpuTest (plus the CPU
//     reference backend; bf16-representable random inputs, uploads, NaN-poisoned outputs so an unwritten
//     element fails);
//   - the paged batch builder shared by the attention tests (spans over shuffled cache blocks) and their
//     attention geometry (attention_shape; the MLA one is kernels/mla_geometry.h, shared with the benches).
// Invariant: a helper here never changes what a test computes (same RNG draws, same arithmetic as the per-file
// copies it replaced); tolerances stay declared in each test file, next to the reason for them.
#pragma once

#include <gtest/gtest.h>
#if __has_include(<cuda_runtime_api.h>)  // the device checks below need the CUDA runtime's include path
#include <cuda_runtime_api.h>
#define MXSERVE_GPU_ORACLE_CUDA_RUNTIME 1
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/numeric.h"
#include "core/tensor.h"
#include "kernels/mla_geometry.h"
#include "model/forward_batch.h"

namespace mxserve::gpu_oracle {

// ---- the error measure ----------------------------------------------------------------------------
struct Err {
  double rel_l2 = 0, max_abs = 0;
};

// Element-wise over n values (got, ref: anything indexable as double). zero_ref_fails: an all-zero reference is
// an infinite error (the reference path itself did nothing); otherwise rel_l2 divides by max(||ref||, 1e-30).
template <typename A, typename B>
Err compare_n(const A& got, const B& ref, int64_t n, bool zero_ref_fails = false) {
  double num = 0, den = 0, mx = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = got[i], b = ref[i];
    if (!std::isfinite(a) || std::isnan(b)) return {INFINITY, INFINITY};
    num += (a - b) * (a - b);
    den += b * b;
    mx = std::max(mx, std::fabs(a - b));
  }
  if (zero_ref_fails && den == 0) return {INFINITY, mx};
  return {std::sqrt(num) / std::max(std::sqrt(den), 1e-30), mx};
}

// Host f32 tensors of equal size.
inline Err compare(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.numel(), ref.numel());
  if (got.numel() != ref.numel()) return {INFINITY, INFINITY};
  return compare_n(got.data<float>(), ref.data<float>(), ref.numel());
}
// Equal-size vectors; an empty reference is an infinite error.
inline Err compare(const std::vector<double>& got, const std::vector<double>& ref, bool zero_ref_fails = false) {
  if (got.size() != ref.size() || ref.empty()) return {INFINITY, INFINITY};
  return compare_n(got, ref, static_cast<int64_t>(ref.size()), zero_ref_fails);
}

template <typename T>
double rel_l2(const T& got, const T& ref, double* max_abs = nullptr) {
  const Err e = compare(got, ref);
  if (max_abs != nullptr) *max_abs = e.max_abs;
  return e.rel_l2;
}

// ---- the tolerance report --------------------------------------------------------------------------
// Prints "[ err      ] <what> rel_l2 .. max_abs .. (tol ..)" and returns whether rel_l2 <= tol.
inline bool report(const std::string& what, const Err& e, double tol) {
  std::printf("[ err      ] %-28s rel_l2 %.3e  max_abs %.3e  (tol %.0e)\n", what.c_str(), e.rel_l2, e.max_abs, tol);
  return e.rel_l2 <= tol;
}
// The EXPECT of one oracle check: reports the error and fails the test past tol.
inline void expect_within(const Err& e, double tol, const std::string& what) {
  report(what, e, tol);
  EXPECT_LE(e.rel_l2, tol) << what << ": rel_l2 " << e.rel_l2 << " max_abs " << e.max_abs;
}
inline std::string current_test_name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }
// got, ref: host f32 tensors; the line names the running test.
#define EXPECT_WITHIN(got, ref, tol)                                           \
  ::mxserve::gpu_oracle::expect_within(::mxserve::gpu_oracle::compare(got, ref), tol, \
                                       ::mxserve::gpu_oracle::current_test_name())

inline void expect_bytes_equal(const Tensor& got, const Tensor& ref, const char* what) {
  ASSERT_EQ(got.nbytes(), ref.nbytes()) << what;
  const auto* a = static_cast<const uint8_t*>(got.raw());
  const auto* b = static_cast<const uint8_t*>(ref.raw());
  int64_t diff = 0, first = -1;
  for (uint64_t i = 0; i < ref.nbytes(); ++i)
    if (a[i] != b[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++diff;
    }
  EXPECT_EQ(diff, 0) << what << ": " << diff << " bytes differ, first at byte " << first;
}

// ---- devices ---------------------------------------------------------------------------------------
// For tests that call the CUDA runtime themselves (their target has its include path: they link
// mxserve_kernels_cuda or CUDA::cudart); the backend-level tests skip through the fixtures below.
#ifdef MXSERVE_GPU_ORACLE_CUDA_RUNTIME
inline bool have_cuda_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
// The current device is sm_90 (Hopper: the wgmma kernels run there).
inline bool have_sm90() {
  int dev = 0, major = 0, minor = 0;
  return have_cuda_device() && cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
         minor == 0;
}
#define MXSERVE_SKIP_WITHOUT_CUDA()                                                    \
  do {                                                                                 \
    if (!::mxserve::gpu_oracle::have_cuda_device())                                    \
      GTEST_SKIP() << "no CUDA device: run on the GPU machine";                        \
  } while (0)
#endif  // MXSERVE_GPU_ORACLE_CUDA_RUNTIME

// ---- the fixtures ----------------------------------------------------------------------------------
// The CUDA backend, or a skip with a clear message without a CUDA device. Members are public: a test's free
// helper functions take the fixture.
class CudaTest : public ::testing::Test {
 public:
  void SetUp() override {
    auto r = backend::make_backend("cuda");
    if (!r.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << r.status().to_string() << ")";
    gpu_ = std::move(*r);
  }
  std::unique_ptr<backend::Backend> gpu_;
};

// The CUDA backend and the CPU reference backend, with the input / output helpers every op test uses. rng_ is
// seeded by the test (the constructor argument), so each file keeps its own data.
class CudaVsCpuTest : public CudaTest {
 public:
  explicit CudaVsCpuTest(uint32_t seed = 20261129) : rng_(seed) {}
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    cpu_ = backend::make_cpu_backend();
  }

  // Host f32 tensor of bf16-representable values uniform in [-scale, scale).
  Tensor rand(Shape s, float scale = 1.f) {
    std::uniform_real_distribution<float> u(-scale, scale);
    Tensor t = Tensor::empty(DType::kF32, std::move(s));
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = bf16_to_f32(f32_to_bf16(u(rng_)));
    return t;
  }
  Tensor ints(Shape s, int lo, int hi) {
    std::uniform_int_distribution<int> u(lo, hi);
    Tensor t = Tensor::empty(DType::kI32, std::move(s));
    for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = u(rng_);
    return t;
  }
  // Host f32 [rows, n_heads * head_dim] of bf16-representable values; each (row, head) gets its own magnitude
  // 2^e, e uniform in [lo_exp, hi_exp] (K magnitudes vary by head and token in real models).
  Tensor rand_heads(int64_t rows, int64_t n_heads, int64_t head_dim, int lo_exp, int hi_exp) {
    std::normal_distribution<float> n01(0.f, 1.f);
    std::uniform_int_distribution<int> ex(lo_exp, hi_exp);
    Tensor t = Tensor::empty(DType::kF32, {rows, n_heads * head_dim});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < n_heads; ++h) {
        const float mag = std::ldexp(1.f, ex(rng_));
        for (int64_t d = 0; d < head_dim; ++d)
          t.data<float>()[(r * n_heads + h) * head_dim + d] = bf16_to_f32(f32_to_bf16(mag * n01(rng_)));
      }
    return t;
  }
  Tensor cpu(const Tensor& host) { return cpu_->upload(host); }
  // A host f32 tensor as a bf16 device tensor (exact for bf16-representable values).
  Tensor gpu_bf16(const Tensor& host_f32) {
    Tensor d = gpu_->alloc(DType::kBF16, host_f32.shape());
    gpu_->copy_weight(host_f32, d);
    return d;
  }
  Tensor gpu_exact(const Tensor& host) { return gpu_->upload(host); }
  // A bf16 (or f32) device tensor full of NaN: every element the op should write is checked.
  Tensor poison(DType dt, Shape s) {
    Tensor h = Tensor::empty(dt, s);
    if (dt == DType::kBF16)
      for (int64_t i = 0; i < h.numel(); ++i) h.data<uint16_t>()[i] = 0x7fc0;
    else
      for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = NAN;
    return gpu_->upload(h);
  }
  Tensor poison_bf16(Shape s) { return poison(DType::kBF16, std::move(s)); }
  Tensor host(const Tensor& t) { return gpu_->to_host(t); }

  std::unique_ptr<backend::Backend> cpu_;
  std::mt19937 rng_;
};

// ---- paged batches ---------------------------------------------------------------------------------
// One sequence of a paged batch: `rows` new tokens at the end of a context of kv_len keys.
struct PagedSpan {
  int32_t rows, kv_len;
};
// The forward batch of `spans` (in order) with cache blocks of bs tokens, shuffled (one std::shuffle of rng)
// over a cache of the needed blocks plus `spare_blocks`; *n_blocks: the cache's block count.
inline model::ForwardBatch paged_batch(const std::vector<PagedSpan>& spans, int64_t bs, int64_t spare_blocks,
                                       std::mt19937& rng, int64_t* n_blocks) {
  model::ForwardBatch batch;
  int64_t need = 0;
  for (const PagedSpan& s : spans) need += (s.kv_len + bs - 1) / bs;
  *n_blocks = need + spare_blocks;
  std::vector<int32_t> perm(*n_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t next = 0;
  for (const PagedSpan& s : spans) {
    model::SequenceSpan span;
    span.token_begin = batch.n_tokens();
    span.n_tokens = s.rows;
    span.kv_len = s.kv_len;
    for (int64_t b = 0; b < (span.kv_len + bs - 1) / bs; ++b) span.block_table.push_back(perm[next++]);
    for (int32_t i = 0; i < s.rows; ++i) {
      batch.token_ids.push_back(0);
      batch.positions.push_back(s.kv_len - s.rows + i);
    }
    batch.seqs.push_back(span);
  }
  return batch;
}

// Attention geometry (scale 1 / sqrt(head_dim)).
inline kernels::AttentionParams attention_shape(int n_heads, int n_kv_heads, int head_dim) {
  kernels::AttentionParams shape;
  shape.n_heads = n_heads;
  shape.n_kv_heads = n_kv_heads;
  shape.head_dim = head_dim;
  shape.scale = 1.f / std::sqrt(static_cast<float>(head_dim));
  return shape;
}

}  // namespace mxserve::gpu_oracle
