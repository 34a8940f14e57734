// bench_prefill_attention: prefill / extend attention at GLM-4.5-Air shapes (96 q heads / 8 kv heads of 128,
// paged bf16 cache of 16-token blocks), the mma.sync block-shared kernel ("shared", the old path) against the
// Hopper warp-specialized wgmma kernel ("wgmma_ws", forced), what the planner picks by itself ("auto"), and
// wgmma_ws without its ping-pong schedule (launched directly). Each wgmma_ws row also prints its speed ratio to
// the shared row. (Issue 31 retired the first wgmma kernel, "wgmma": wgmma_ws ran 1.35-1.59x faster.)
//   usage: bench_prefill_attention [--quick] [--fp8]
// --fp8: each shape also over an FP8 E4M3 cache of the same K / V (written by the CUDA kv_write): "shared fp8"
// (mma.sync, dequantizing in its cp.async tile loader), "wgmma_ws fp8" (the context dequantized once into a
// bf16 scratch, then the bf16 kernel) and "wgmma_ws fp8 fused" (dequantizing in its producer
// warpgroup), timed in the same run as the bf16 rows (their peer: the FP8 cache halves the bytes but adds the
// dequantization; prefill attention is compute-bound).
// Shapes: one 8192-token chunk from position 0; one 8192-token chunk over a 12288-token cached prefix (20k
// context); one 20480-token chunk from 0; 4 x 2048-token chunks from 0; 4 x 2048-token chunks over 12288-token
// prefixes. --quick: the first three.
// FLOPs are causal-aware and exact: 4 * head_dim * n_heads * sum over query rows of the keys that row sees
// (kv_index + 1: the prefix plus the chunk up to itself), i.e. 2 FLOPs per multiply-add of Q K^T and of P V.
// The fraction is of the cuBLASLt bf16 GEMM rate measured in the same run (kernels/cuda/ceilings.h; 798
// TFLOP/s on the H200 at the time of issue 18). Each row also prints the rel-L2 distance of the kernel's
// output from the shared kernel's (a sanity check; the oracle is tests/ops/test_cuda_attention_wgmma).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_backend.h"
#include "core/check.h"
#include "kernels/cuda/attention/paged_attention_wgmma.h"
#include "kernels/cuda/ceilings.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "model/forward_batch.h"

namespace mx = mxserve;
using mx::DType;
using mx::Tensor;

namespace {

constexpr int64_t kHeads = 96, kKvHeads = 8, kHd = 128, kBlock = 16;

struct Shape {
  int n_seqs;
  int64_t chunk, prefix;
  const char* what;
};

// n_seqs sequences of `chunk` new rows over `prefix` cached keys each, consecutive blocks per sequence.
mx::backend::AttentionMeta meta_of(mx::backend::Backend& be, const Shape& s, double* flops, int64_t* n_slots) {
  mx::model::ForwardBatch fb;
  int32_t next = 0;
  double visible = 0;
  for (int i = 0; i < s.n_seqs; ++i) {
    mx::model::SequenceSpan span;
    span.token_begin = fb.n_tokens();
    span.n_tokens = static_cast<int32_t>(s.chunk);
    span.kv_len = static_cast<int32_t>(s.prefix + s.chunk);
    for (int64_t b = 0; b < (span.kv_len + kBlock - 1) / kBlock; ++b) span.block_table.push_back(next++);
    for (int64_t r = 0; r < s.chunk; ++r) {
      fb.token_ids.push_back(0);
      fb.positions.push_back(static_cast<int32_t>(s.prefix + r));
      visible += static_cast<double>(s.prefix + r + 1);
    }
    fb.seqs.push_back(span);
  }
  *flops = 4.0 * kHd * kHeads * visible;
  *n_slots = static_cast<int64_t>(next) * kBlock;
  mx::kernels::AttentionParams shape;
  shape.n_heads = kHeads;
  shape.n_kv_heads = kKvHeads;
  shape.head_dim = kHd;
  shape.scale = 1.f / std::sqrt(static_cast<float>(kHd));
  return mx::model::build_attention_meta(fb, be, kBlock, shape).value();
}

double rel_l2(const Tensor& got, const Tensor& ref) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double a = got.data<float>()[i], b = ref.data<float>()[i];
    if (std::isnan(a)) return INFINITY;
    num += (a - b) * (a - b);
    den += b * b;
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, fp8 = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--fp8") == 0) fp8 = true;
    else {
      std::fprintf(stderr, "error: unknown argument '%s' (usage: bench_prefill_attention [--quick] [--fp8])\n", argv[i]);
      return 2;
    }
  }
  auto made = mx::backend::make_backend("cuda");
  if (!made.is_ok()) {
    std::fprintf(stderr, "error: %s\n", made.status().to_string().c_str());
    return 2;
  }
  mx::backend::Backend& be = **made;
  const cudaStream_t stream = mx::backend::cuda_backend_stream(be);
  cudaDeviceProp prop{};
  MX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const mx::kernels::cuda::Ceilings ceil = mx::kernels::cuda::measure_ceilings(stream);
  std::printf("GPU: %s (sm_%d%d), %d SMs; bf16 GEMM ceiling measured %.0f TFLOP/s\n", prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, ceil.gemm_tflops);

  std::vector<Shape> shapes = {{1, 8192, 0, "chunk 8192 @0"},
                               {1, 8192, 12288, "chunk 8192 over 12288 prefix (20k)"},
                               {1, 20480, 0, "chunk 20480 @0"},
                               {4, 2048, 0, "4 x chunk 2048 @0"},
                               {4, 2048, 12288, "4 x chunk 2048 over 12288 prefix"}};
  if (quick) shapes.resize(3);
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    double flops = 0;
    int64_t n_slots = 0;
    auto meta = meta_of(be, s, &flops, &n_slots);
    const int64_t T = static_cast<int64_t>(s.n_seqs) * s.chunk;
    Tensor kc = be.alloc(DType::kBF16, {n_slots, kKvHeads * kHd}), vc = be.alloc(DType::kBF16, {n_slots, kKvHeads * kHd});
    Tensor q = be.alloc(DType::kBF16, {T, kHeads * kHd});
    mx::kernels::cuda::fill_random_bf16(kc.raw(), kc.numel(), seed++, 1.f, stream);
    mx::kernels::cuda::fill_random_bf16(vc.raw(), vc.numel(), seed++, 1.f, stream);
    mx::kernels::cuda::fill_random_bf16(q.raw(), q.numel(), seed++, 1.f, stream);
    const auto auto_plan = mx::kernels::cuda::plan_paged_attention_batch(meta.params, prop.multiProcessorCount);
    Tensor ref;
    bool have_ref = false;
    double shared_ms = 0;
    for (const char* kernel : {"shared", "wgmma_ws", ""}) {
      mx::backend::KernelOptions opts;
      opts.attention_kernel = kernel;
      MX_CHECK(be.set_kernel_options(opts).is_ok());
      mx::kernels::cuda::AttentionPlanOptions forced;
      if (std::strcmp(kernel, "shared") == 0) forced.force = mx::kernels::cuda::AttentionPlanOptions::Force::kShared;
      if (std::strcmp(kernel, "wgmma_ws") == 0)
        forced.force = mx::kernels::cuda::AttentionPlanOptions::Force::kWgmmaWs;
      const auto plan = mx::kernels::cuda::plan_paged_attention_batch(meta.params, prop.multiProcessorCount, forced);
      Tensor o = be.alloc(DType::kBF16, {T, kHeads * kHd});
      const double ms = mx::kernels::cuda::time_on_stream(stream, [&](int) { be.attention(q, kc, vc, meta, o); }, 1);
      Tensor host = be.to_host(o);
      double err = 0;
      if (!have_ref) {
        ref = host;
        have_ref = true;
      } else {
        err = rel_l2(host, ref);
      }
      const double tf = flops / (ms * 1e-3) / 1e12;
      std::string label = kernel[0] ? kernel : "auto";
      label += std::string(" (ran ") + mx::kernels::cuda::attention_kernel_name(plan.parts[plan.n_parts - 1].launch.kernel) + ")";
      if (std::strcmp(kernel, "shared") == 0) shared_ms = ms;
      std::string ratio;
      if (std::strcmp(kernel, "wgmma_ws") == 0 && shared_ms > 0) {
        char buf[48];
        std::snprintf(buf, sizeof buf, "  %.2fx shared", shared_ms / ms);
        ratio = buf;
      }
      std::printf("[ BENCH ] %-38s %-24s %10.1f us %7.1f TFLOP/s %5.1f%% of GEMM  rel_l2 vs shared %.2e%s\n", s.what,
                  label.c_str(), ms * 1e3, tf, 100 * tf / ceil.gemm_tflops, err, ratio.c_str());
    }
    MX_CHECK(be.set_kernel_options({}).is_ok());
    {
      // The warp-specialized kernel without the consumers' ping-pong turns (its launcher's other schedule; the
      // planner never runs it): what the turn taking is worth.
      Tensor o = be.alloc(DType::kBF16, {T, kHeads * kHd});
      const double ms = mx::kernels::cuda::time_on_stream(
          stream,
          [&](int) {
            mx::kernels::cuda::paged_attention_wgmma_ws(
                q.raw(), kc.raw(), vc.raw(), meta.token_seq.data<int32_t>(), meta.kv_index.data<int32_t>(),
                meta.block_tables.data<int32_t>(), o.raw(), meta.params, stream, /*ping_pong=*/false);
          },
          1);
      const double tf = flops / (ms * 1e-3) / 1e12;
      std::printf("[ BENCH ] %-38s %-24s %10.1f us %7.1f TFLOP/s %5.1f%% of GEMM  rel_l2 vs shared %.2e  %.2fx "
                  "shared\n",
                  s.what, "wgmma_ws no ping-pong", ms * 1e3, tf, 100 * tf / ceil.gemm_tflops,
                  rel_l2(be.to_host(o), ref), shared_ms / ms);
    }
    if (fp8) {
      // The same K / V as an FP8 cache (codes + per slot and kv head scales), every slot written.
      Tensor k8 = be.alloc(DType::kFP8E4M3, {n_slots, kKvHeads * kHd}), v8 = be.alloc(DType::kFP8E4M3, {n_slots, kKvHeads * kHd});
      Tensor ks = be.alloc(DType::kF32, {n_slots, kKvHeads}), vs = be.alloc(DType::kF32, {n_slots, kKvHeads});
      std::vector<int32_t> all(n_slots);
      for (int64_t i = 0; i < n_slots; ++i) all[i] = static_cast<int32_t>(i);
      mx::backend::AttentionMeta wm;
      wm.slot_mapping = be.upload(Tensor::view_of(all.data(), DType::kI32, {n_slots}));
      wm.params = meta.params;
      wm.params.k_scales = ks.data<float>();
      wm.params.v_scales = vs.data<float>();
      be.kv_write(kc, vc, wm, k8, v8);
      auto meta8 = meta;
      meta8.params.k_scales = ks.data<float>();
      meta8.params.v_scales = vs.data<float>();
      double shared8_ms = 0;
      // wgmma_ws fp8: the context dequantized once into a bf16 scratch, then the bf16 kernel (the planner's
      // choice where the scratch holds the step); "wgmma_ws fp8 fused": the producer dequantizes each tile per
      // q-head block (what ran before; kv_fp8_dequant_once.cu).
      for (const char* kernel : {"shared", "wgmma_ws", "wgmma_ws fused"}) {
        mx::backend::KernelOptions opts;
        const bool fused = std::strcmp(kernel, "wgmma_ws fused") == 0;
        opts.attention_kernel = fused ? "wgmma_ws" : kernel;
        if (fused) opts.attention_fp8_prefill = "fused";
        MX_CHECK(be.set_kernel_options(opts).is_ok());
        Tensor o = be.alloc(DType::kBF16, {T, kHeads * kHd});
        const double ms = mx::kernels::cuda::time_on_stream(stream, [&](int) { be.attention(q, k8, v8, meta8, o); }, 1);
        const double tf = flops / (ms * 1e-3) / 1e12;
        if (std::strcmp(kernel, "shared") == 0) shared8_ms = ms;
        char ratio[64] = "";
        if (std::strncmp(kernel, "wgmma_ws", 8) == 0)
          std::snprintf(ratio, sizeof ratio, "  %.2fx shared fp8", shared8_ms / ms);
        const std::string label = fused ? "wgmma_ws fp8 fused" : std::string(kernel) + " fp8";
        std::printf("[ BENCH ] %-38s %-24s %10.1f us %7.1f TFLOP/s %5.1f%% of GEMM  rel_l2 vs shared (bf16) %.2e%s\n",
                    s.what, label.c_str(), ms * 1e3, tf, 100 * tf / ceil.gemm_tflops,
                    rel_l2(be.to_host(o), ref), ratio);
      }
      MX_CHECK(be.set_kernel_options({}).is_ok());
    }
    std::printf("[ PLAN  ] %-38s auto picks %s (%d part%s)\n", s.what,
                mx::kernels::cuda::attention_kernel_name(auto_plan.parts[auto_plan.n_parts - 1].launch.kernel),
                auto_plan.n_parts, auto_plan.n_parts > 1 ? "s" : "");
  }
  return 0;
}
