// Dense bf16 GEMMs through cuBLASLt: out[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]), bf16 inputs, fp32
// accumulation, bf16 or f32 output. Owns the cuBLASLt handle, its workspace and one cached plan
// (descriptors + heuristic algorithm) per shape/dtype/alignment. Not thread-safe: one per stream.
// Decode-sized M (<= kSkinnyMaxRows, skinny_gemm.h) with N >= 512 runs the skinny tensor-core GEMM instead (one
// launch, no split-K reduce; bf16 out, or f32 out for N <= 16384 so the lm_head stays on cuBLASLt), unless
// MXSERVE_SKINNY_GEMM=0 or set_skinny_enabled(false); a shape it cannot take says so once and uses cuBLASLt.
// NOTE: cuBLASLt is the vendor seam here; a HIP port maps it to hipBLASLt with the same call shape.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace mxserve::kernels::cuda {

class LtGemm {
 public:
  explicit LtGemm(cudaStream_t stream);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // x bf16 [M, K] row-major, w bf16 [N, K] row-major, bias bf16 [N] or null, out [M, N] (f32 when out_f32).
  void run(const void* x, const void* w, const void* bias, void* out, bool out_f32, int64_t m, int64_t n,
           int64_t k);

  // The skinny path for M <= 8 (default: on unless the environment has MXSERVE_SKINNY_GEMM=0). Off = cuBLASLt
  // for every M (the oracle the op test and the bench compare against).
  void set_skinny_enabled(bool on) { skinny_ = on; }
  bool skinny_enabled() const { return skinny_; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int>;
  Plan& plan(const Key& key);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
  bool skinny_ = true;
};

}  // namespace mxserve::kernels::cuda
