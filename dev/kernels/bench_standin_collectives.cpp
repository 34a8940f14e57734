// The collectives of one tp decode step on the ONE-GPU STAND-IN (--communicator shared-device: N rank threads,
// each its own CUDA backend and stream on device 0), per call, to split a tp-N decode step into "one rank's
// compute + its collectives" (issue 32, docs/perf/parallel.md). Each rank's thread calls, like the forward:
//   fused    the event-ordered all-reduce + add + RMSNorm (FusedReduceAddNorm; the default at tp > 1)
//   unfused  the shared-device all_reduce, then the backend's add and RMSNorm (--disable-custom-all-reduce)
//   embed    one all_reduce of [rows, H] (the embedding's, once per step)
//   logits   one all_gather_columns of f32 [rows, V / N] (the vocabulary-parallel head, once per step)
// Prints microseconds per call (every rank's stream drained, host rendezvous included) per world and rows.
// A step of L layers has 1 embed + 2 L fused (or unfused) + 1 logits collectives.
//   usage: bench_standin_collectives [hidden (4096)] [vocab (151552)] [iterations (200)]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda_backend.h"
#include "parallel/device_group_communicator.h"
#include "parallel/shared_device_communicator.h"

using namespace mxserve;

namespace {

void fail(const Status& s) {
  std::printf("FAIL: %s\n", s.to_string().c_str());
  std::exit(1);
}

// fn(rank) on every rank's thread, `iters` times; microseconds per iteration, every rank's stream drained.
double time_ranks(std::vector<std::unique_ptr<backend::Backend>>& be, int iters, const std::function<void(int)>& fn) {
  const int n = static_cast<int>(be.size());
  auto run = [&](int k) {
    std::vector<std::thread> t;
    for (int r = 0; r < n; ++r)
      t.emplace_back([&, r] {
        cudaSetDevice(0);
        for (int i = 0; i < k; ++i) fn(r);
        be[r]->synchronize();
      });
    for (auto& x : t) x.join();
  };
  run(5);
  const auto t0 = std::chrono::steady_clock::now();
  run(iters);
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t H = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int64_t V = argc > 2 ? std::atoll(argv[2]) : 151552;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 200;
  if (!backend::make_backend("cuda").is_ok()) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  std::printf("bench_standin_collectives: ONE-GPU STAND-IN (all ranks on device 0, collectives through local HBM, "
              "not NVLink); hidden %lld, vocab %lld, %d iterations\n", static_cast<long long>(H),
              static_cast<long long>(V), iters);
  for (int n : {2, 4}) {
    std::vector<std::unique_ptr<backend::Backend>> be;
    std::vector<backend::Backend*> raw;
    std::vector<parallel::RankLayout> layouts;
    for (int r = 0; r < n; ++r) {
      auto made = backend::make_backend("cuda");
      if (!made.is_ok()) fail(made.status());
      be.push_back(std::move(made).value());
      raw.push_back(be.back().get());
      layouts.push_back(parallel::RankLayout{.tp = n, .rank = r});
    }
    auto comms = parallel::make_shared_device_communicators(layouts, raw);
    if (!comms.is_ok()) fail(comms.status());
    for (int64_t R : {1, 8, 32}) {
      std::vector<Tensor> x(n), res(n), w(n), out(n), logits(n);
      for (int r = 0; r < n; ++r) {
        x[r] = be[r]->alloc(DType::kBF16, {R, H});
        res[r] = be[r]->alloc(DType::kBF16, {R, H});
        out[r] = be[r]->alloc(DType::kBF16, {R, H});
        w[r] = be[r]->alloc(DType::kBF16, {H});
        logits[r] = be[r]->alloc(DType::kF32, {R, V / n});
        for (Tensor* t : {&x[r], &res[r], &out[r], &w[r], &logits[r]})
          cudaMemsetAsync(t->raw(), 0, t->nbytes(), backend::cuda_backend_stream(*be[r]));
        be[r]->synchronize();
      }
      auto check = [](const Status& s) {
        if (!s.is_ok()) fail(s);
      };
      const double fused = time_ranks(be, iters, [&](int r) {
        auto* f = dynamic_cast<parallel::FusedReduceAddNorm*>((*comms)[r].get());
        check(f->all_reduce_add_rmsnorm(x[r], res[r], w[r], 1e-5f, out[r]));
      });
      const double unfused = time_ranks(be, iters, [&](int r) {
        check((*comms)[r]->all_reduce(x[r], parallel::ReduceOp::kSum));
        be[r]->add(res[r], x[r]);
        be[r]->rmsnorm(res[r], w[r], 1e-5f, out[r]);
      });
      const double embed = time_ranks(be, iters, [&](int r) { check((*comms)[r]->all_reduce(x[r], parallel::ReduceOp::kSum)); });
      const double gather = time_ranks(be, iters, [&](int r) { check((*comms)[r]->all_gather_columns(logits[r]).status()); });
      std::printf("tp %d rows %3lld: fused %8.1f us  unfused %8.1f us  embed all-reduce %8.1f us  logits gather %8.1f us "
                  "(one-GPU stand-in)\n", n, static_cast<long long>(R), fused, unfused, embed, gather);
    }
  }
  std::printf("PASS: bench_standin_collectives finished\n");
  return 0;
}
