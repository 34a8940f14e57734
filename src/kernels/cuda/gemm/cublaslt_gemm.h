// Dense bf16 GEMMs through cuBLASLt: out[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]), bf16 inputs, fp32
// accumulation, bf16 or f32 output. Owns the cuBLASLt handle, its workspace and one cached plan
// (descriptors + heuristic algorithm) per shape/dtype/alignment. Not thread-safe: one per stream.
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
};

}  // namespace mxserve::kernels::cuda
