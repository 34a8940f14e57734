// Microbenchmark of the fused peer all-reduce + add + RMSNorm (parallel/peer_allreduce.h). ONE-GPU STAND-IN:
// the N "ranks" are N CUDA backends on one device, so every peer read hits that device's own HBM, not NVLink;
// the numbers measure the kernels, their flag barriers and launch overhead, not a multi-GPU all-reduce.
// Prints per world size, path and row count: microseconds per call (all ranks' kernels done) and the
// algorithm bandwidth (bytes of one rank's x / time, as nccl-tests' algbw).
//   usage: bench_peer_allreduce [cols (default 4096, GLM-4.5-Air's hidden size)] [iterations (default 200)]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda_backend.h"
#include "parallel/peer_allreduce.h"

using namespace mxserve;

int main(int argc, char** argv) {
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);  // the N ranks' streams on separate hw queues
  const int64_t C = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 200;
  if (!backend::make_backend("cuda").is_ok()) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  std::printf("bench_peer_allreduce: ONE-GPU STAND-IN (all ranks on device 0: peer reads are local HBM, not "
              "NVLink); cols %lld, %d iterations\n", static_cast<long long>(C), iters);
  for (int n : {2, 4, 8}) {
    for (const char* mode : {"one-shot", "two-shot"}) {
      parallel::PeerAllReduceOptions opt;
      opt.capacity_bytes = 64ull << 20;
      opt.one_shot_max_bytes = std::string(mode) == "one-shot" ? opt.capacity_bytes : 0;
      std::vector<std::unique_ptr<backend::Backend>> be;
      for (int r = 0; r < n; ++r) {
        auto made = backend::make_backend("cuda");
        if (!made.is_ok()) {
          std::printf("FAIL: %s\n", made.status().to_string().c_str());
          return 1;
        }
        be.push_back(std::move(made).value());
      }
      auto g = parallel::make_peer_allreduce_group(std::vector<int>(n, 0), opt);
      if (!g.is_ok()) {
        std::printf("FAIL: %s\n", g.status().to_string().c_str());
        return 1;
      }
      for (int64_t R : {1, 8, 32, 128, 512, 2048}) {
        std::vector<Tensor> x, res, w, out;
        for (int r = 0; r < n; ++r) {
          x.push_back(be[r]->alloc(DType::kBF16, {R, C}));
          res.push_back(be[r]->alloc(DType::kBF16, {R, C}));
          out.push_back(be[r]->alloc(DType::kBF16, {R, C}));
          w.push_back(be[r]->alloc(DType::kBF16, {C}));
          cudaMemsetAsync(x[r].raw(), 0, x[r].nbytes(), backend::cuda_backend_stream(*be[r]));
          cudaMemsetAsync(res[r].raw(), 0, res[r].nbytes(), backend::cuda_backend_stream(*be[r]));
          cudaMemsetAsync(w[r].raw(), 0, w[r].nbytes(), backend::cuda_backend_stream(*be[r]));
        }
        auto run = [&](int k) {
          for (int i = 0; i < k; ++i)
            for (int r = 0; r < n; ++r) {
              const Status s = (*g)[r]->allreduce_add_rmsnorm(x[r], res[r], w[r], 1e-5f, out[r],
                                                              backend::cuda_backend_stream(*be[r]), nullptr);
              if (!s.is_ok()) {
                std::printf("FAIL: %s\n", s.to_string().c_str());
                std::exit(1);
              }
            }
          cudaDeviceSynchronize();
        };
        run(10);
        const auto t0 = std::chrono::steady_clock::now();
        run(iters);
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
        for (int r = 0; r < n; ++r) {
          const Status s = (*g)[r]->check(backend::cuda_backend_stream(*be[r]));
          if (!s.is_ok()) {
            std::printf("FAIL: %s\n", s.to_string().c_str());
            return 1;
          }
        }
        const double bytes = static_cast<double>(R * C * 2);
        std::printf("world %d %-8s rows %5lld (%8.1f KiB/rank): %8.2f us/call  algbw %7.2f GB/s (one-GPU stand-in)\n",
                    n, mode, static_cast<long long>(R), bytes / 1024, us, bytes / us / 1e3);
      }
    }
  }
  std::printf("PASS: bench_peer_allreduce finished (no barrier timeouts)\n");
  return 0;
}
