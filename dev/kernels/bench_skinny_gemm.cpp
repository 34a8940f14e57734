// Microbenchmark of the dense decode GEMMs: cuBLASLt (LtGemm, skinny path off) vs the skinny M <= 8 kernel
// (skinny_gemm.h) on GLM-4.5-Air's dense projections at M = 1, 2, 4, 8, 16 (16: cuBLASLt only). Each
// timing rotates over enough weight copies (>= 256 MB) that the weight comes from DRAM, as in a decode step.
// Prints one line per (shape, M, path): us, weight GB/s and the fraction of 4.3 TB/s (H200 copy bandwidth).
// Usage: bench_skinny_gemm [reps]   (needs a CUDA device)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cuda/gemm/cublaslt_gemm.h"
#include "kernels/cuda/gemm/skinny_gemm.h"

namespace {

namespace kc = mxserve::kernels::cuda;

constexpr double kCopyBw = 4.3e12;  // bytes/s, the H200 copy bandwidth the targets are set against

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "FAIL %s: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

struct Shape {
  const char* name;
  int64_t n, k;
  bool bias;
};

}  // namespace

int main(int argc, char** argv) {
  int devs = 0;
  if (cudaGetDeviceCount(&devs) != cudaSuccess || devs == 0) {
    std::printf("SKIP bench_skinny_gemm: no CUDA device\n");
    return 0;
  }
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  const Shape shapes[] = {{"q_proj 4096->12288 +bias", 12288, 4096, true},
                          {"k_proj 4096->1024 +bias", 1024, 4096, true},
                          {"v_proj 4096->1024 +bias", 1024, 4096, true},
                          {"o_proj 12288->4096", 4096, 12288, false},
                          {"shared gate_up 4096->2816", 2816, 4096, false},
                          {"shared down 1408->4096", 4096, 1408, false}};
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  kc::LtGemm lt(stream);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::printf("| shape | M | path | us | GB/s | frac of 4.3 TB/s | speedup |\n|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    const size_t wbytes = static_cast<size_t>(s.n * s.k * 2);
    const int copies = static_cast<int>(std::max<size_t>(2, (256ull << 20) / wbytes + 1));
    void *w = nullptr, *x = nullptr, *b = nullptr, *out = nullptr;
    CK(cudaMalloc(&w, wbytes * copies));
    CK(cudaMemset(w, 0x11, wbytes * copies));
    CK(cudaMalloc(&x, 16 * s.k * 2));
    CK(cudaMemset(x, 0x22, 16 * s.k * 2));
    CK(cudaMalloc(&b, s.n * 2));
    CK(cudaMemset(b, 0, s.n * 2));
    CK(cudaMalloc(&out, 16 * s.n * 4));
    for (int64_t m : {1, 2, 4, 8, 16}) {
      double cublas_us = 0;
      for (bool skinny : {false, true}) {
        if (skinny && m > kc::kSkinnyMaxRows) continue;
        lt.set_skinny_enabled(skinny);
        auto run = [&](int i) {
          lt.run(x, static_cast<char*>(w) + (i % copies) * wbytes, s.bias ? b : nullptr, out, false, m, s.n, s.k);
        };
        for (int i = 0; i < copies; ++i) run(i);  // warm-up: plans, clocks
        CK(cudaEventRecord(e0, stream));
        for (int i = 0; i < reps; ++i) run(i);
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = ms * 1e3 / reps;
        const double gbs = (wbytes + m * s.k * 2.0 + m * s.n * 2.0) / (us * 1e-6) / 1e9;
        if (!skinny) cublas_us = us;
        std::printf("| %s | %lld | %s | %.2f | %.0f | %.2f | %s |\n", s.name, static_cast<long long>(m),
                    skinny ? "skinny" : "cuBLASLt", us, gbs, gbs * 1e9 / kCopyBw,
                    skinny ? (std::to_string(cublas_us / us).substr(0, 4) + "x").c_str() : "");
      }
    }
    CK(cudaFree(w));
    CK(cudaFree(x));
    CK(cudaFree(b));
    CK(cudaFree(out));
  }
  CK(cudaGetLastError());
  return 0;
}
