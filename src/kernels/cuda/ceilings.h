// Hardware ceilings measured on the running GPU, for benchmarks that report a fraction of them:
// device-to-device copy bandwidth (bytes read + written) and the cuBLASLt dense bf16 GEMM rate.
// Owns nothing past the call (buffers are allocated and freed inside). Used by dev/kernels/bench_cuda_kernels
// and `mxserve bench-model`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

namespace mxserve::kernels::cuda {

// Median of `regions` timed regions of `reps` calls of fn(i) (i counts calls), after `warmup` calls,
// with CUDA events on `stream`; ms per call.
double time_on_stream(cudaStream_t stream, const std::function<void(int)>& fn, int reps, int warmup = 2,
                      int regions = 5);

struct Ceilings {
  double copy_gbs = 0;        // device-to-device copy, (read + write bytes) / s / 1e9
  double copy_ms = 0;         // one copy of copy_bytes each way
  int64_t copy_bytes = 0;     // per direction
  double gemm_tflops = 0;     // cuBLASLt bf16 GEMM, fp32 accumulation, bf16 out
  double gemm_ms = 0;
  int64_t gemm_n = 0;         // M = N = K
};

// copy_bytes per direction (2 GiB by default: far beyond L2); an n^3 GEMM on random bf16 data.
Ceilings measure_ceilings(cudaStream_t stream, int64_t copy_bytes = 1ll << 31, int64_t gemm_n = 8192);

}  // namespace mxserve::kernels::cuda
