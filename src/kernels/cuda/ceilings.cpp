#include "kernels/cuda/ceilings.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm/cublaslt_gemm.h"

namespace mxserve::kernels::cuda {

double time_on_stream(cudaStream_t stream, const std::function<void(int)>& fn, int reps, int warmup, int regions) {
  cudaEvent_t e0, e1;
  MX_CUDA_CHECK(cudaEventCreate(&e0));
  MX_CUDA_CHECK(cudaEventCreate(&e1));
  int call = 0;
  for (int i = 0; i < warmup; ++i) fn(call++);
  std::vector<double> v;
  for (int r = 0; r < regions; ++r) {
    MX_CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int i = 0; i < reps; ++i) fn(call++);
    MX_CUDA_CHECK(cudaEventRecord(e1, stream));
    MX_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    MX_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    v.push_back(ms / reps);
  }
  MX_CUDA_CHECK(cudaEventDestroy(e0));
  MX_CUDA_CHECK(cudaEventDestroy(e1));
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Ceilings measure_ceilings(cudaStream_t stream, int64_t copy_bytes, int64_t gemm_n) {
  Ceilings c;
  c.copy_bytes = copy_bytes;
  c.gemm_n = gemm_n;
  {
    void *a = nullptr, *b = nullptr;
    MX_CUDA_CHECK(cudaMalloc(&a, copy_bytes));
    MX_CUDA_CHECK(cudaMalloc(&b, copy_bytes));
    MX_CUDA_CHECK(cudaMemsetAsync(a, 1, copy_bytes, stream));
    c.copy_ms = time_on_stream(
        stream, [&](int) { MX_CUDA_CHECK(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice, stream)); }, 5);
    c.copy_gbs = 2.0 * copy_bytes / (c.copy_ms * 1e-3) / 1e9;
    MX_CUDA_CHECK(cudaFree(a));
    MX_CUDA_CHECK(cudaFree(b));
  }
  {
    const int64_t n = gemm_n;
    void *x = nullptr, *w = nullptr, *y = nullptr;
    MX_CUDA_CHECK(cudaMalloc(&x, 2 * n * n));
    MX_CUDA_CHECK(cudaMalloc(&w, 2 * n * n));
    MX_CUDA_CHECK(cudaMalloc(&y, 2 * n * n));
    fill_random_bf16(x, n * n, 1, 1.f, stream);
    fill_random_bf16(w, n * n, 2, 1.f, stream);
    {
      LtGemm gemm(stream);
      c.gemm_ms = time_on_stream(stream, [&](int) { gemm.run(x, w, nullptr, y, false, n, n, n); }, 5);
    }
    c.gemm_tflops = 2.0 * n * n * n / (c.gemm_ms * 1e-3) / 1e12;
    MX_CUDA_CHECK(cudaStreamSynchronize(stream));
    MX_CUDA_CHECK(cudaFree(x));
    MX_CUDA_CHECK(cudaFree(w));
    MX_CUDA_CHECK(cudaFree(y));
  }
  return c;
}

}  // namespace mxserve::kernels::cuda
