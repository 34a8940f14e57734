// Microbenchmark of Backend::sample_rows on CUDA: time per call (one decode step's sampling, upload and
// download included) at batch 1 / 16 / 64 x V = 151,552 for the common parameter sets, next to the host
// path it replaces (copy the f32 logits to the host). Usage: bench_cuda_sampling [iterations]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "backend/backend.h"

using namespace mxserve;

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 50;
  auto r = backend::make_backend("cuda");
  if (!r.is_ok()) {
    std::fprintf(stderr, "bench_cuda_sampling: no CUDA device (%s)\n", r.status().to_string().c_str());
    return 1;
  }
  auto& gpu = **r;
  constexpr int64_t V = 151552;
  struct Set {
    const char* name;
    float temperature, top_p;
    int32_t top_k;
    float min_p, rep;
    int32_t n_top;
  };
  const Set sets[] = {{"greedy+logprobs", 0.f, 1.f, 0, 0.f, 1.f, 0},   {"t1.0 full vocab", 1.f, 1.f, 0, 0.f, 1.f, -1},
                      {"t0.7 top_p0.95", 0.7f, 0.95f, 0, 0.f, 1.f, -1}, {"top_k50", 1.f, 1.f, 50, 0.f, 1.f, -1},
                      {"k50 p0.9 min_p", 0.8f, 0.9f, 50, 0.05f, 1.f, -1}, {"rep1.1 logprobs5", 1.f, 1.f, 0, 0.f, 1.1f, 5}};
  std::printf("%-18s %6s %12s %14s\n", "params", "batch", "us/step", "host-copy us");
  for (int64_t batch : {1, 16, 64}) {
    std::vector<float> host(batch * V);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 2.f);
    for (float& x : host) x = nd(rng);
    Tensor logits = gpu.upload(Tensor::view_of(host.data(), DType::kF32, {batch, V}));
    auto time_us = [&](auto&& fn) {
      fn();
      gpu.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) fn();
      gpu.synchronize();
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    };
    const double copy_us = time_us([&] { gpu.to_host(logits); });
    for (const Set& s : sets) {
      kernels::SampleRowsInput in;
      for (int64_t b = 0; b < batch; ++b) {
        kernels::SampleRowParams p;
        p.logit_row = static_cast<int32_t>(b);
        p.temperature = s.temperature;
        p.top_p = s.top_p;
        p.top_k = s.top_k;
        p.min_p = s.min_p;
        p.repetition_penalty = s.rep;
        p.n_top = s.n_top;
        p.seed = 42 + b;
        if (s.rep != 1.f) {  // a 2k-token context's distinct tokens
          p.penalty_begin = static_cast<int32_t>(in.penalties.size());
          for (int32_t t = 0; t < 2000; ++t) in.penalties.push_back({(t * 7919) % static_cast<int32_t>(V), t % 2, 1});
          p.penalty_count = 2000;
        }
        in.rows.push_back(p);
      }
      int step = 0;
      const double us = time_us([&] {
        for (auto& p : in.rows) p.step = step;
        ++step;
        gpu.sample_rows(logits, in);
      });
      std::printf("%-18s %6lld %12.1f %14.1f\n", s.name, static_cast<long long>(batch), us, copy_us);
    }
  }
  return 0;
}
