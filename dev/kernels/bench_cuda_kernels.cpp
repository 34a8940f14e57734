// bench_cuda_kernels: one GLM-4.5-Air layer's ops on the CUDA backend, timed with CUDA events, each
// figure printed with the bytes / FLOPs counted and its fraction of the ceilings measured in the same
// run (device-to-device copy bandwidth; cuBLASLt bf16 GEMM rate at 8192^3).
//   usage: bench_cuda_kernels [--quick] [--mixed-only] [--md FILE]   (writes a markdown table to FILE when given)
//   --mixed-only: the ceilings and the mixed-step attention rows only (decode rows + a prefill chunk).
// Shapes (../shared/models/GLM-4.5-Air/config.json): d_model 4096, 96 q heads / 8 kv heads of 128,
// 128 routed experts, top 8, moe_intermediate 1408. Weights are random bf16 generated on the device.
// Each timed region runs `reps` launches between two events on the backend's stream; the median of 5
// such regions is reported. Inputs larger than L2 (60 MB) or rotated over buffers that together are.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <stdlib.h>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_backend.h"
#include "core/check.h"
#include "kernels/cuda/ceilings.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "model/forward_batch.h"

namespace mx = mxserve;
using mx::DType;
using mx::Tensor;

namespace {

constexpr int64_t kH = 4096, kHeads = 96, kKvHeads = 8, kHd = 128, kE = 128, kTopK = 8, kI = 1408;
constexpr int64_t kBlock = 16;

struct Row {
  std::string what;
  double ms = 0, bytes = 0, flops = 0;
};

class Bench {
 public:
  explicit Bench(mx::backend::Backend& be) : be_(be), stream_(mx::backend::cuda_backend_stream(be)) {
  }

  // Median over 5 regions of `reps` calls; ms per call.
  double time(const std::function<void(int)>& fn, int reps) {
    return mx::kernels::cuda::time_on_stream(stream_, fn, reps);
  }

  Tensor random(mx::Shape s, float scale) {
    Tensor t = be_.alloc(DType::kBF16, std::move(s));
    mx::kernels::cuda::fill_random_bf16(t.raw(), t.numel(), seed_++, scale, stream_);
    return t;
  }

  cudaStream_t stream() const { return stream_; }

 private:
  mx::backend::Backend& be_;
  cudaStream_t stream_;
  uint64_t seed_ = 1;
};

mx::backend::AttentionMeta decode_meta(mx::backend::Backend& be, int64_t batch, int64_t ctx, int64_t n_tokens_each,
                                       int64_t block_base) {
  mx::model::ForwardBatch fb;
  int32_t next = static_cast<int32_t>(block_base);
  for (int64_t s = 0; s < batch; ++s) {
    mx::model::SequenceSpan span;
    span.token_begin = fb.n_tokens();
    span.n_tokens = static_cast<int32_t>(n_tokens_each);
    span.kv_len = static_cast<int32_t>(ctx);
    for (int64_t b = 0; b < (ctx + kBlock - 1) / kBlock; ++b) span.block_table.push_back(next++);
    for (int64_t i = 0; i < n_tokens_each; ++i) {
      fb.token_ids.push_back(0);
      fb.positions.push_back(static_cast<int32_t>(ctx - n_tokens_each + i));
    }
    fb.seqs.push_back(span);
  }
  mx::kernels::AttentionParams shape;
  shape.n_heads = kHeads;
  shape.n_kv_heads = kKvHeads;
  shape.head_dim = kHd;
  shape.scale = 1.f / std::sqrt(static_cast<float>(kHd));
  return mx::model::build_attention_meta(fb, be, kBlock, shape).value();
}

// The seed workload's mixed step: n_dec decode rows at ctx keys each, then one prefill chunk of `chunk`
// rows ending at ctx keys (decode rows first, as the scheduler orders them).
mx::backend::AttentionMeta mixed_meta(mx::backend::Backend& be, int64_t n_dec, int64_t ctx, int64_t chunk) {
  mx::model::ForwardBatch fb;
  int32_t next = 0;
  for (int64_t s = 0; s <= n_dec; ++s) {
    mx::model::SequenceSpan span;
    span.token_begin = fb.n_tokens();
    span.n_tokens = static_cast<int32_t>(s < n_dec ? 1 : chunk);
    span.kv_len = static_cast<int32_t>(ctx);
    for (int64_t b = 0; b < (ctx + kBlock - 1) / kBlock; ++b) span.block_table.push_back(next++);
    for (int32_t i = 0; i < span.n_tokens; ++i) {
      fb.token_ids.push_back(0);
      fb.positions.push_back(static_cast<int32_t>(ctx - span.n_tokens + i));
    }
    fb.seqs.push_back(span);
  }
  mx::kernels::AttentionParams shape;
  shape.n_heads = kHeads;
  shape.n_kv_heads = kKvHeads;
  shape.head_dim = kHd;
  shape.scale = 1.f / std::sqrt(static_cast<float>(kHd));
  return mx::model::build_attention_meta(fb, be, kBlock, shape).value();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, mixed_only = false;
  std::string md_path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--mixed-only") == 0) mixed_only = true;
    else if (std::strcmp(argv[i], "--md") == 0 && i + 1 < argc) md_path = argv[++i];
  }
  auto made = mx::backend::make_backend("cuda");
  if (!made.is_ok()) {
    std::fprintf(stderr, "error: %s\n", made.status().to_string().c_str());
    return 2;
  }
  mx::backend::Backend& be = **made;
  Bench bench(be);
  cudaDeviceProp prop{};
  MX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::vector<Row> rows;

  // ---- ceilings (kernels/cuda/ceilings.h, shared with `mxserve bench-model`) ----
  const mx::kernels::cuda::Ceilings ceil = mx::kernels::cuda::measure_ceilings(bench.stream());
  const double copy_gbs = ceil.copy_gbs, gemm_tflops = ceil.gemm_tflops;
  rows.push_back({"ceiling: device copy 2 GiB (read+write)", ceil.copy_ms, 2.0 * ceil.copy_bytes, 0});
  rows.push_back({"ceiling: cuBLASLt bf16 GEMM 8192^3", ceil.gemm_ms, 0,
                  2.0 * ceil.gemm_n * ceil.gemm_n * ceil.gemm_n});

  // ---- attention, the seed workload's mixed step: 30 decode rows at 20k + a 2048- (or 256-) token chunk at 20k ----
  // [split]: the leading decode rows in the per-warp kernel with split-KV, the chunk in the shared kernel
  // (kernels::cuda::plan_paged_attention_batch); [shared]: the whole batch in the shared kernel (the path
  // before the split, reached by forcing the kernel). Bytes: the decode rows' K+V; FLOPs: the chunk's.
  // The decode rows alone and the chunk alone bound what the mixed step can reach (their sum). With a 256-token
  // chunk the whole batch is decode-like (256 + 30 < 8 * 31 rows): [shared] there is the forced shared kernel,
  // the old path is the per-warp kernel for every row ([warp]).
  for (const int64_t chunk : {int64_t{2048}, int64_t{256}}) {
    const int64_t n_dec = 30, ctx = 20000;
    const std::string mixed = "attention mixed 30 dec + " + std::to_string(chunk) + " chunk @20k [";
    const int64_t n_slots = (n_dec + 1) * ((ctx + kBlock - 1) / kBlock) * kBlock;
    const double dec_bytes = 2.0 * n_dec * ctx * kKvHeads * kHd * 2;
    const double chunk_flops = 4.0 * kHeads * kHd * chunk * (ctx - chunk / 2.0);
    const auto meta = mixed_meta(be, n_dec, ctx, chunk);
    const auto decode_alone = decode_meta(be, n_dec, ctx, 1, 0);
    const auto chunk_alone = decode_meta(be, 1, ctx, chunk, 0);
    const int64_t T = n_dec + chunk;
    Tensor q = bench.random({T, kHeads * kHd}, 1.f), o = be.alloc(DType::kBF16, {T, kHeads * kHd});
    for (const char* cache : {"bf16", "fp8"}) {
      const bool fp8 = std::strcmp(cache, "fp8") == 0;
      Tensor kc, vc, ks, vs;
      auto m = meta, d = decode_alone, c = chunk_alone;
      if (fp8) {  // e4m3 code 0x38 = 1.0 everywhere, scales 1 (timing only)
        kc = be.alloc(DType::kFP8E4M3, {n_slots, kKvHeads * kHd});
        vc = be.alloc(DType::kFP8E4M3, {n_slots, kKvHeads * kHd});
        MX_CUDA_CHECK(cudaMemsetAsync(kc.raw(), 0x38, kc.nbytes(), bench.stream()));
        MX_CUDA_CHECK(cudaMemsetAsync(vc.raw(), 0x38, vc.nbytes(), bench.stream()));
        Tensor ones = Tensor::empty(DType::kF32, {n_slots, kKvHeads});
        std::fill(ones.data<float>(), ones.data<float>() + ones.numel(), 1.f);
        ks = be.upload(ones);
        vs = be.upload(ones);
        for (auto* x : {&m, &d, &c}) {
          x->params.k_scales = ks.data<float>();
          x->params.v_scales = vs.data<float>();
        }
      } else {
        kc = bench.random({n_slots, kKvHeads * kHd}, 1.f);
        vc = bench.random({n_slots, kKvHeads * kHd}, 1.f);
      }
      const std::string tag = std::string(" (") + cache + " cache)";
      for (const char* kernel : {"", "shared", "warp"}) {
        MX_CHECK(be.set_kernel_options({.attention_kernel = kernel}).is_ok());
        const double ms = bench.time([&](int) { be.attention(q, kc, vc, m, o); }, 3);
        rows.push_back({mixed + (kernel[0] ? kernel : "split") + "]" + tag, ms, dec_bytes, chunk_flops});
      }
      MX_CHECK(be.set_kernel_options({}).is_ok());
      Tensor qd = q.slice_rows(0, n_dec), od = o.slice_rows(0, n_dec);
      Tensor qc = q.slice_rows(n_dec, T), oc = o.slice_rows(n_dec, T);
      rows.push_back({"attention decode batch 30 ctx 20000 alone" + tag,
                      bench.time([&](int) { be.attention(qd, kc, vc, d, od); }, 10), dec_bytes, 0});
      rows.push_back({"attention chunk " + std::to_string(chunk) + " @20k alone" + tag,
                      bench.time([&](int) { be.attention(qc, kc, vc, c, oc); }, 3), 0, chunk_flops});
    }
  }

  // ---- dense projection (q_proj) at decode ----
  if (!mixed_only) {
    Tensor w = bench.random({kHeads * kHd, kH}, 0.02f);
    for (int64_t m : {1, 8, 64}) {
      Tensor x = bench.random({m, kH}, 1.f);
      Tensor y = be.alloc(DType::kBF16, {m, kHeads * kHd});
      const double ms = bench.time([&](int) { be.linear(x, w, nullptr, y); }, 20);
      rows.push_back({"linear q_proj 4096->12288, M=" + std::to_string(m), ms,
                      2.0 * (kHeads * kHd * kH + m * kH + m * kHeads * kHd), 2.0 * m * kH * kHeads * kHd});
    }
  }

  // ---- attention decode: K+V bytes of every context read once ----
  // KV inputs smaller than 256 MB are rotated over several buffers so the 60 MB L2 cannot serve them.
  auto decode_row = [&](int64_t b, int64_t ctx, const std::string& label) {
    const double kv_bytes = 2.0 * b * ctx * kKvHeads * kHd * 2;
    const int n_rot = static_cast<int>(std::max(1.0, std::ceil(256e6 / kv_bytes)));
    const int64_t blocks_per_call = b * ((ctx + kBlock - 1) / kBlock);
    Tensor kc = bench.random({n_rot * blocks_per_call * kBlock, kKvHeads * kHd}, 1.f);
    Tensor vc = bench.random({n_rot * blocks_per_call * kBlock, kKvHeads * kHd}, 1.f);
    std::vector<mx::backend::AttentionMeta> metas;
    for (int r = 0; r < n_rot; ++r) metas.push_back(decode_meta(be, b, ctx, 1, r * blocks_per_call));
    Tensor q = bench.random({b, kHeads * kHd}, 1.f);
    Tensor o = be.alloc(DType::kBF16, {b, kHeads * kHd});
    const double ms = bench.time([&](int i) { be.attention(q, kc, vc, metas[i % n_rot], o); }, 20);
    rows.push_back({label, ms, kv_bytes + 4.0 * b * kHeads * kHd, 4.0 * b * kHeads * kHd * ctx});
  };
  const std::vector<int64_t> batches = quick ? std::vector<int64_t>{1, 8} : std::vector<int64_t>{1, 8, 32, 64};
  if (!mixed_only)
    for (int64_t ctx : {2048, 8192})
      for (int64_t b : batches)
      decode_row(b, ctx, "attention decode batch " + std::to_string(b) + " ctx " + std::to_string(ctx));

  // ---- attention decode, split heuristic sweep: warps per SM the split count aims for ----
  if (!quick && !mixed_only) {
    for (const char* target : {"4", "16", "32"}) {
      MX_CHECK(be.set_kernel_options({.attention_split_target = std::atoll(target)}).is_ok());
      for (int64_t b : {1, 8, 32, 64})
        decode_row(b, 8192, "attention decode batch " + std::to_string(b) + " ctx 8192 [split target " + target + "/SM]");
    }
    MX_CHECK(be.set_kernel_options({}).is_ok());
  }

  // ---- attention prefill: one sequence, causal chunk from position 0 ----
  // The CUDA-core kernel (design 1) is timed again on a few shapes for comparison (KernelOptions::attention_kernel).
  // Designs: shared (8 tokens per block share K/V tiles; the default for prefill), warp (one warp per token,
  // the decode kernel), simt (CUDA cores).
  for (const char* kernel : {"shared", "warp", "simt"}) {
    if (mixed_only) break;
    const bool simt = std::strcmp(kernel, "simt") == 0;
    MX_CHECK(be.set_kernel_options({.attention_kernel = kernel}).is_ok());
    std::vector<int64_t> chunks = {1024};
    if (!quick && std::strcmp(kernel, "shared") == 0) chunks = {1024, 8192, 20480};
    if (!quick && std::strcmp(kernel, "warp") == 0) chunks = {1024, 8192};
    for (int64_t c : chunks) {
      Tensor kc = bench.random({c, kKvHeads * kHd}, 1.f), vc = bench.random({c, kKvHeads * kHd}, 1.f);
      auto meta = decode_meta(be, 1, c, c, 0);
      Tensor q = bench.random({c, kHeads * kHd}, 1.f);
      Tensor o = be.alloc(DType::kBF16, {c, kHeads * kHd});
      const double ms = bench.time([&](int) { be.attention(q, kc, vc, meta, o); }, c > 4096 ? 1 : 3);
      const double flops = 4.0 * kHeads * kHd * (static_cast<double>(c) * (c + 1) / 2);
      rows.push_back({std::string("attention prefill chunk ") + std::to_string(c) + " [" + kernel + "]", ms, 0, flops});
    }
    if (simt) {
      for (int64_t b : {8, 64}) {
        const int64_t ctx = 8192;
        const double kv_bytes = 2.0 * b * ctx * kKvHeads * kHd * 2;
        Tensor kc = bench.random({b * ctx, kKvHeads * kHd}, 1.f), vc = bench.random({b * ctx, kKvHeads * kHd}, 1.f);
        auto meta = decode_meta(be, b, ctx, 1, 0);
        Tensor q = bench.random({b, kHeads * kHd}, 1.f);
        Tensor o = be.alloc(DType::kBF16, {b, kHeads * kHd});
        const double ms = bench.time([&](int) { be.attention(q, kc, vc, meta, o); }, 10);
        rows.push_back({"attention decode batch " + std::to_string(b) + " ctx 8192 [simt]", ms,
                        kv_bytes + 4.0 * b * kHeads * kHd, 4.0 * b * kHeads * kHd * ctx});
      }
    }
    MX_CHECK(be.set_kernel_options({}).is_ok());
  }

  // ---- MoE routed experts: decode (bytes of the experts hit) and prefill (FLOPs) ----
  if (!mixed_only) {
    Tensor gate_up = bench.random({kE, 2 * kI, kH}, 0.02f), down = bench.random({kE, kH, kI}, 0.02f);
    mx::backend::ExpertWeights ex{gate_up, down};
    std::mt19937 rng(7);
    // Decode sizes run twice: the default (GEMV path for T <= 4) and the grouped GEMM (design 1).
    const std::vector<int64_t> moe_tokens =
        quick ? std::vector<int64_t>{1, 8, 1024} : std::vector<int64_t>{1, 4, 8, 32, 64, 1024, 8192, 20480, -1, -4};
    for (int64_t signed_t : moe_tokens) {
      const bool grouped = signed_t < 0;
      const int64_t t = grouped ? -signed_t : signed_t;
      mx::backend::KernelOptions moe_opts;
      if (grouped) moe_opts.moe_kernel = "grouped";
      MX_CHECK(be.set_kernel_options(moe_opts).is_ok());
      Tensor ids_h = Tensor::empty(DType::kI32, {t, kTopK});
      Tensor w_h = Tensor::empty(DType::kF32, {t, kTopK});
      std::vector<int32_t> e(kE);
      std::vector<char> hit(kE, 0);
      for (int64_t i = 0; i < t; ++i) {
        std::iota(e.begin(), e.end(), 0);
        std::shuffle(e.begin(), e.end(), rng);
        for (int64_t k = 0; k < kTopK; ++k) {
          ids_h.data<int32_t>()[i * kTopK + k] = e[k];
          w_h.data<float>()[i * kTopK + k] = 0.125f;
          hit[e[k]] = 1;
        }
      }
      const double n_hit = std::accumulate(hit.begin(), hit.end(), 0.0);
      Tensor ids = be.upload(ids_h), wts = be.upload(w_h);
      Tensor x = bench.random({t, kH}, 1.f);
      Tensor out = bench.random({t, kH}, 1.f);
      const double ms = bench.time([&](int) { be.moe_experts(x, ids, wts, ex, out); }, t >= 1024 ? 3 : 20);
      const double bytes = n_hit * 3.0 * kH * kI * 2 + 2.0 * t * kH * 2;
      const double flops = 2.0 * 3.0 * kH * kI * t * kTopK;
      rows.push_back({"moe experts T=" + std::to_string(t) + " (" + std::to_string(static_cast<int>(n_hit)) +
                          " experts hit)" + (grouped ? " [grouped]" : ""),
                      ms, bytes, flops});
      MX_CHECK(be.set_kernel_options({}).is_ok());
    }
  }

  // ---- report ----
  std::printf("\nGPU: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  std::printf("ceilings measured in this run: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n\n", copy_gbs, gemm_tflops);
  std::string md = "| op | time (us) | bytes (MB) | GB/s | % copy BW | TFLOP/s | % GEMM rate |\n"
                   "|---|---:|---:|---:|---:|---:|---:|\n";
  std::printf("%-48s %10s %10s %8s %6s %8s %6s\n", "op", "us", "MB", "GB/s", "%BW", "TFLOP/s", "%MMA");
  for (const Row& r : rows) {
    const double s = r.ms * 1e-3;
    const double gbs = r.bytes > 0 ? r.bytes / s / 1e9 : 0, tf = r.flops > 0 ? r.flops / s / 1e12 : 0;
    char line[512];
    std::snprintf(line, sizeof(line), "%-48s %10.1f %10.1f %8.0f %5.1f%% %8.1f %5.1f%%", r.what.c_str(), r.ms * 1e3,
                  r.bytes / 1e6, gbs, 100 * gbs / copy_gbs, tf, 100 * tf / gemm_tflops);
    std::printf("%s\n", line);
    std::snprintf(line, sizeof(line), "| %s | %.1f | %.1f | %.0f | %.1f%% | %.1f | %.1f%% |\n", r.what.c_str(),
                  r.ms * 1e3, r.bytes / 1e6, gbs, 100 * gbs / copy_gbs, tf, 100 * tf / gemm_tflops);
    md += line;
  }
  if (!md_path.empty()) {
    FILE* f = std::fopen(md_path.c_str(), "w");
    if (f) {
      std::fprintf(f, "GPU: %s, %d SMs; ceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n\n%s", prop.name,
                   prop.multiProcessorCount, copy_gbs, gemm_tflops, md.c_str());
      std::fclose(f);
    }
  }
  return 0;
}
