// bench_mla_decode: absorbed MLA decode (kernels/cuda/attention/mla_attention.cu + mla_decode_mma.cu) at the
// GLM-5.2 latent shape (64 heads, qk_nope 192, rope 64, v 256, kv_lora_rank 512: 1152 cache bytes per token),
// dense at 2k / 20k / 64k context and sparse (DSA top-2048) at 20k / 64k, batch 1 / 16 / 64, one decode token
// per sequence, paged cache of 64-token blocks in shuffled order. Per case it prints the attend step alone
// (tensor-core kernel + split combine: the issue-16 metric) and the whole op (absorb + attend + unabsorb),
// each in us (median of 5 regions), GB/s on the latent bytes read and that as a fraction of the
// device-to-device copy bandwidth measured in the same run, the tensor-core kernel's
// error against the SIMT oracle (rel L2; PASS <= 1e-2), and per batch the sparse-64k / dense-2k ratio
// (issue 16 target: <= 1.3).
// Then the DSA indexer (GLM-5.2: 32 index heads x 128, top-2048) at 2k / 20k / 64k keys, batch 1 / 16 / 64:
// the whole op (scores + exact radix select) time with the tensor-core and the SIMT score kernels, GB/s on
// the index-key bytes read and its fraction of copy bandwidth (the relevant ceiling at decode: 32 FLOP per
// key byte is below the H200's bf16 tensor-core FLOP/byte balance), TFLOP/s of the scores vs the measured
// cuBLASLt bf16 GEMM rate, and the entries where the two kernels' top-k sets differ (near-ties only).
// On sm_90 each case has two more rows, "<case> wgmma" and "<case> wgmma-S": the Hopper path
// (MlaAttendKernel::kWgmma / kWgmmaSplitS, mla_decode_wgmma.cu + mla_absorb_mma.cu; -S: the warpgroups split each
// tile's keys for the scores) -- attend alone, whole op, splits, its error against the mma.sync op
// (PASS <= 1.5e-2) and op / attend (issue 36 target <= 1.3); at batch 16 / 64, dense 20k, a MET / MISSED line for
// the >= 70% of copy bandwidth target.
//   usage: bench_mla_decode [--heads N] [--quick] [--no-simple] [--wgmma-splits N] [--wgmma-sweep]
//   --heads: query heads per GPU (64: GLM-5.2 unsplit; 16: tensor parallel 4; 8: TP8).
//   --quick: batch 16 only.   --no-simple: skip timing the SIMT oracle (its error check still runs).
//   --wgmma-splits N: force the wgmma path's KV splits (0: its plan).  --wgmma-sweep: time the wgmma attend at
//   1..256 splits per case and print the best (the data of a split table).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/ceilings.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "bench_mla.h"


namespace {

// The DSA indexer rows; returns the number of failing cases (top-k sets differing in > 1% of entries).
int bench_indexer(const std::vector<int>& batches, bool time_simple, const kc::Ceilings& ceilings, cudaStream_t stream,
                  std::mt19937& rng) {
  constexpr int kIdxHeads = 32, kIdxDim = 128, kTopK = 2048;
  mxserve::kernels::IndexerParams p;
  p.n_heads = kIdxHeads;
  p.head_dim = kIdxDim;
  p.top_k = kTopK;
  p.score_scale = 1.f / std::sqrt(static_cast<float>(kIdxDim));
  p.weight_scale = 1.f / std::sqrt(static_cast<float>(kIdxHeads));
  std::printf("\nDSA indexer: %d heads x %d, top-%d (gemm ceiling %.0f TFLOP/s)\n", kIdxHeads, kIdxDim, kTopK,
              ceilings.gemm_tflops);
  std::printf("%-22s %9s %9s %8s %9s %8s %9s %9s %10s  %s\n", "case", "mma_us", "GB/s", "frac", "TFLOP/s", "frac",
              "simt_us", "speedup", "differ", "check");
  int failures = 0;
  for (const int B : batches) {
    for (const int64_t ctx : {int64_t{2048}, int64_t{20480}, int64_t{65536}}) {
      const bench::PagedDecodeBatch pb = bench::paged_decode_batch(B, ctx, kBlock, rng);
      const int64_t n_blocks = pb.n_blocks;
      const int64_t slots = n_blocks * kBlock;
      uint16_t* keys = dev_alloc<uint16_t>(static_cast<size_t>(slots) * kIdxDim);
      kc::fill_random_bf16(keys, slots * kIdxDim, 17 + ctx, 1.f, stream);
      uint16_t* q = dev_alloc<uint16_t>(static_cast<size_t>(B) * kIdxHeads * kIdxDim);
      kc::fill_random_bf16(q, int64_t{B} * kIdxHeads * kIdxDim, 19, 1.f, stream);
      uint16_t* w = dev_alloc<uint16_t>(static_cast<size_t>(B) * kIdxHeads);
      kc::fill_random_bf16(w, int64_t{B} * kIdxHeads, 23, 1.f, stream);
      int32_t* d_seq = dev_upload(pb.token_seq);
      int32_t* d_kv = dev_upload(pb.kv_index);
      int32_t* d_tables = dev_upload(pb.block_tables);
      int32_t* out_mma = dev_alloc<int32_t>(static_cast<size_t>(B) * kTopK);
      int32_t* out_simple = dev_alloc<int32_t>(static_cast<size_t>(B) * kTopK);
      const mxserve::kernels::AttentionParams ap = bench::decode_attention_params(pb, B, 1, kIdxDim, kBlock, ctx);
      const size_t ws_bytes = kc::dsa_indexer_workspace_bytes(B, ctx);
      void* ws = dev_alloc<uint8_t>(ws_bytes);
      auto run = [&](kc::IndexerScoreKernel k, int32_t* out) {
        kc::dsa_indexer_topk(q, w, keys, d_seq, d_kv, d_tables, out, p, ap, ctx, ws, ws_bytes, stream, k);
      };
      run(kc::IndexerScoreKernel::kMma, out_mma);
      run(kc::IndexerScoreKernel::kSimple, out_simple);
      MX_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<int32_t> h_mma(static_cast<size_t>(B) * kTopK), h_simple(h_mma.size());
      MX_CUDA_CHECK(cudaMemcpy(h_mma.data(), out_mma, h_mma.size() * 4, cudaMemcpyDeviceToHost));
      MX_CUDA_CHECK(cudaMemcpy(h_simple.data(), out_simple, h_simple.size() * 4, cudaMemcpyDeviceToHost));
      int64_t differ = 0;
      for (int b = 0; b < B; ++b) {
        std::vector<int32_t> a(h_mma.begin() + b * kTopK, h_mma.begin() + (b + 1) * kTopK);
        std::vector<int32_t> c(h_simple.begin() + b * kTopK, h_simple.begin() + (b + 1) * kTopK), both;
        std::set_intersection(a.begin(), a.end(), c.begin(), c.end(), std::back_inserter(both));
        differ += kTopK - static_cast<int64_t>(both.size());
      }
      const double mma_ms = kc::time_on_stream(stream, [&](int) { run(kc::IndexerScoreKernel::kMma, out_mma); }, 10);
      const bool do_simple = time_simple && int64_t{B} * ctx <= int64_t{16} * 20480;
      const double simple_ms =
          do_simple ? kc::time_on_stream(stream, [&](int) { run(kc::IndexerScoreKernel::kSimple, out_simple); }, 2, 1, 3)
                    : 0;
      const double key_bytes = static_cast<double>(B) * ctx * kIdxDim * 2;
      const double flops = static_cast<double>(B) * ctx * kIdxHeads * kIdxDim * 2;
      const double gbs = key_bytes / (mma_ms * 1e-3) / 1e9, tflops = flops / (mma_ms * 1e-3) / 1e12;
      const bool pass = differ <= int64_t{B} * kTopK / 100;
      failures += pass ? 0 : 1;
      char what[64];
      std::snprintf(what, sizeof what, "idx B%d ctx%lld", B, static_cast<long long>(ctx));
      std::printf("%-22s %9.1f %9.0f %8.3f %9.1f %8.3f %9.1f %9.1f %10lld  %s\n", what, mma_ms * 1e3, gbs,
                  gbs / ceilings.copy_gbs, tflops, tflops / ceilings.gemm_tflops, simple_ms * 1e3,
                  do_simple ? simple_ms / mma_ms : 0.0, static_cast<long long>(differ), pass ? "PASS" : "FAIL");
      for (void* ptr : {static_cast<void*>(keys), static_cast<void*>(q), static_cast<void*>(w),
                        static_cast<void*>(d_seq), static_cast<void*>(d_kv), static_cast<void*>(d_tables),
                        static_cast<void*>(out_mma), static_cast<void*>(out_simple), ws})
        MX_CUDA_CHECK(cudaFree(ptr));
    }
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  int heads = 64, force_splits = 0;
  bool quick = false, time_simple = true, sweep = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--heads") && i + 1 < argc) heads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--no-simple")) time_simple = false;
    else if (!std::strcmp(argv[i], "--wgmma-splits") && i + 1 < argc) force_splits = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--wgmma-sweep")) sweep = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_mla_decode [--heads N] [--quick] [--no-simple] [--wgmma-splits N] [--wgmma-sweep]\n");
      return 2;
    }
  }
  if (!bench::cuda_device_present()) return 0;
  cudaStream_t stream;
  MX_CUDA_CHECK(cudaStreamCreate(&stream));
  const kc::Ceilings ceilings = kc::measure_ceilings(stream, int64_t{1} << 30, 4096);
  std::printf("ceiling: device-to-device copy %.0f GB/s (read + write)\n", ceilings.copy_gbs);

  const mxserve::kernels::MlaParams p = mxserve::kernels::glm_mla_params(heads);
  if (!kc::mla_attend_mma_supported(p)) {
    std::printf("FAIL: %d heads outside the tensor-core kernel\n", heads);
    return 1;
  }
  const char* wgmma_why = nullptr;
  const bool wgmma_ok = kc::mla_attend_wgmma_supported(p, &wgmma_why);
  if (!wgmma_ok) std::printf("wgmma rows skipped: %s\n", wgmma_why);
  const int64_t kvb_elems = static_cast<int64_t>(heads) * (kNope + kV) * kLora;
  uint16_t* kv_b = dev_alloc<uint16_t>(kvb_elems);
  kc::fill_random_bf16(kv_b, kvb_elems, 7, 0.05f, stream);
  const double weight_bytes = 2.0 * kvb_elems;

  const std::vector<int> batches = quick ? std::vector<int>{16} : std::vector<int>{1, 16, 64};
  struct Shape {
    int64_t ctx;
    int topk;  // 0: dense
  };
  const std::vector<Shape> shapes = {{2048, 0}, {20480, 0}, {65536, 0}, {20480, 2048}, {65536, 2048}};
  std::mt19937 rng(20261202);
  int failures = 0;
  std::printf("%-24s %9s %8s %7s %9s %8s %7s %7s %9s %8s %9s  %s\n", "case", "attend_us", "GB/s", "frac", "op_us",
              "GB/s", "frac", "splits", "simt_us", "speedup", "rel_l2", "check");
  for (const int B : batches) {
    double dense2k_us = 0, sparse64k_us = 0;
    for (const Shape& s : shapes) {
      const bench::PagedDecodeBatch pb = bench::paged_decode_batch(B, s.ctx, kBlock, rng);
      const int64_t n_blocks = pb.n_blocks;
      const std::vector<int32_t> topk =
          s.topk > 0 ? bench::random_topk_rows(B, s.ctx, s.topk, rng) : std::vector<int32_t>{};
      const int64_t slots = n_blocks * kBlock;
      uint16_t* cache = dev_alloc<uint16_t>(static_cast<size_t>(slots) * kRow);
      kc::fill_random_bf16(cache, slots * kRow, 11 + s.ctx, 1.f, stream);
      const int64_t q_elems = static_cast<int64_t>(B) * heads * (kNope + kRope);
      uint16_t* q = dev_alloc<uint16_t>(q_elems);
      kc::fill_random_bf16(q, q_elems, 13, 1.f, stream);
      const int64_t out_elems = static_cast<int64_t>(B) * heads * kV;
      uint16_t* out_mma = dev_alloc<uint16_t>(out_elems);
      uint16_t* out_simple = dev_alloc<uint16_t>(out_elems);
      int32_t* d_seq = dev_upload(pb.token_seq);
      int32_t* d_kv = dev_upload(pb.kv_index);
      int32_t* d_tables = dev_upload(pb.block_tables);
      int32_t* d_topk = s.topk > 0 ? dev_upload(topk) : nullptr;
      const mxserve::kernels::AttentionParams ap = bench::decode_attention_params(pb, B, heads, kRow, kBlock, s.ctx);
      const size_t ws_bytes = kc::mla_attention_workspace_bytes(B, p);
      void* ws = dev_alloc<uint8_t>(ws_bytes);
      auto run = [&](kc::MlaAttendKernel k, uint16_t* out) {
        kc::mla_attention_bf16(q, cache, kv_b, d_topk, s.topk, d_seq, d_kv, d_tables, out, p, ap, ws, ws_bytes, stream,
                               k);
      };
      run(kc::MlaAttendKernel::kMma, out_mma);
      run(kc::MlaAttendKernel::kSimple, out_simple);
      MX_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<uint16_t> h_mma(out_elems), h_simple(out_elems);
      MX_CUDA_CHECK(cudaMemcpy(h_mma.data(), out_mma, out_elems * 2, cudaMemcpyDeviceToHost));
      MX_CUDA_CHECK(cudaMemcpy(h_simple.data(), out_simple, out_elems * 2, cudaMemcpyDeviceToHost));
      const double err = rel_l2_bf16(h_mma.data(), h_simple.data(), out_elems);
      const double mma_ms = kc::time_on_stream(stream, [&](int) { run(kc::MlaAttendKernel::kMma, out_mma); }, 10);
      // The attend step alone (zero q_abs: the time does not depend on the values).
      const int64_t lat_elems = static_cast<int64_t>(B) * heads * kLora;
      float* q_abs = dev_alloc<float>(lat_elems);
      float* o_lat = dev_alloc<float>(lat_elems);
      MX_CUDA_CHECK(cudaMemsetAsync(q_abs, 0, lat_elems * sizeof(float), stream));
      const size_t part_bytes = kc::mla_attend_mma_workspace_bytes(B, p);
      void* parts = dev_alloc<uint8_t>(part_bytes);
      const int64_t max_items = s.topk > 0 ? s.topk : s.ctx;
      const double attend_ms = kc::time_on_stream(
          stream,
          [&](int) {
            kc::mla_attend_mma(q, q_abs, cache, d_topk, s.topk, d_seq, d_kv, d_tables, o_lat, 0, B, max_items, p, ap,
                               parts, part_bytes, stream);
          },
          10);
      const bool do_simple = time_simple && static_cast<int64_t>(B) * s.ctx <= int64_t{16} * 20480;
      const double simple_ms =
          do_simple ? kc::time_on_stream(stream, [&](int) { run(kc::MlaAttendKernel::kSimple, out_simple); }, 2, 1, 3)
                    : 0;
      const int64_t items = s.topk > 0 ? std::min<int64_t>(s.topk, s.ctx) : s.ctx;
      const double latent_bytes = static_cast<double>(B) * items * kRow * 2;
      const double gbs = latent_bytes / (mma_ms * 1e-3) / 1e9, attend_gbs = latent_bytes / (attend_ms * 1e-3) / 1e9;
      const kc::MlaSplitPlan plan = kc::mla_attend_split_plan(B, s.topk > 0 ? s.topk : s.ctx);
      const bool pass = err <= 1e-2;
      failures += pass ? 0 : 1;
      char what[64];
      std::snprintf(what, sizeof what, "B%d ctx%lld %s", B, static_cast<long long>(s.ctx),
                    s.topk > 0 ? "top2048" : "dense");
      std::printf("%-24s %9.1f %8.0f %7.3f %9.1f %8.0f %7.3f %7d %9.1f %8.1f %9.2e  %s (op weights %.1f MB%s)\n",
                  what, attend_ms * 1e3, attend_gbs, attend_gbs / ceilings.copy_gbs, mma_ms * 1e3, gbs,
                  gbs / ceilings.copy_gbs, plan.n_splits, simple_ms * 1e3,
                  do_simple ? simple_ms / mma_ms : 0.0, err, pass ? "PASS" : "FAIL", weight_bytes / 1e6,
                  latent_bytes < 50e6 ? "; latent fits in L2" : "");
      if (s.topk == 0 && s.ctx == 2048) dense2k_us = attend_ms * 1e3;
      if (s.topk > 0 && s.ctx == 65536) sparse64k_us = attend_ms * 1e3;
      for (const bool split_s : {false, true}) {
        if (!wgmma_ok) break;
        // The Hopper path (kWgmma): whole op (absorb GEMM + wgmma attend + combine + un-absorb GEMM) checked against
        // the mma.sync op, and the attend alone (bf16 q_abs of zeros), optionally over a sweep of forced splits.
        const size_t wws_bytes = kc::mla_attention_workspace_bytes(B, p, force_splits);
        void* wws = dev_alloc<uint8_t>(wws_bytes);
        uint16_t* out_wg = dev_alloc<uint16_t>(out_elems);
        auto run_wg = [&](int splits) {
          kc::mla_attention_bf16(q, cache, kv_b, d_topk, s.topk, d_seq, d_kv, d_tables, out_wg, p, ap, wws, wws_bytes,
                                 stream, split_s ? kc::MlaAttendKernel::kWgmmaSplitS : kc::MlaAttendKernel::kWgmma,
                                 splits);
        };
        run_wg(force_splits);
        MX_CUDA_CHECK(cudaStreamSynchronize(stream));
        std::vector<uint16_t> h_wg(out_elems);
        MX_CUDA_CHECK(cudaMemcpy(h_wg.data(), out_wg, out_elems * 2, cudaMemcpyDeviceToHost));
        const double werr = rel_l2_bf16(h_wg.data(), h_mma.data(), out_elems);
        const double wop_ms = kc::time_on_stream(stream, [&](int) { run_wg(force_splits); }, 10);
        const int max_sweep = std::min(256, std::max(1, 1024 / B));  // partials: B x splits x heads x 2 KB
        const size_t wparts_bytes =
            kc::mla_attend_wgmma_workspace_bytes(B, p, std::max(force_splits, sweep ? max_sweep : 0));
        void* wparts = dev_alloc<uint8_t>(wparts_bytes);
        MX_CUDA_CHECK(cudaMemsetAsync(q_abs, 0, lat_elems * sizeof(float), stream));  // bf16 zeros too
        auto attend_wg = [&](int splits) {
          kc::mla_attend_wgmma(q, q_abs, cache, d_topk, s.topk, d_seq, d_kv, d_tables, o_lat, 0, B, max_items, p, ap,
                               wparts, wparts_bytes, stream, splits, nullptr, split_s);
        };
        const double wat_ms = kc::time_on_stream(stream, [&](int) { attend_wg(force_splits); }, 10);
        const double wat_gbs = latent_bytes / (wat_ms * 1e-3) / 1e9, wop_gbs = latent_bytes / (wop_ms * 1e-3) / 1e9;
        const kc::MlaSplitPlan wplan = kc::mla_attend_wgmma_split_plan(B, max_items, p, s.topk > 0, force_splits);
        const bool wpass = werr <= 1.5e-2;
        failures += wpass ? 0 : 1;
        std::printf("%-24s %9.1f %8.0f %7.3f %9.1f %8.0f %7.3f %7d %9s %8s %9.2e  %s (wgmma; op / attend %.2f, "
                    "target <= 1.3; rel_l2 vs the mma op)\n",
                    (std::string(what) + (split_s ? " wgmma-S" : " wgmma")).c_str(), wat_ms * 1e3, wat_gbs, wat_gbs / ceilings.copy_gbs,
                    wop_ms * 1e3, wop_gbs, wop_gbs / ceilings.copy_gbs, wplan.n_splits, "-", "-", werr,
                    wpass ? "PASS" : "FAIL", wop_ms / wat_ms);
        if (s.topk == 0 && s.ctx == 20480 && B >= 16)
          std::printf("B%-3d ctx20480 dense %s attend: %.3f of copy bandwidth (target >= 0.70) %s\n", B,
                      split_s ? "wgmma split-S" : "wgmma", wat_gbs / ceilings.copy_gbs,
                      wat_gbs / ceilings.copy_gbs >= 0.70 ? "MET" : "MISSED");
        if (sweep) {
          int best = 0;
          double best_ms = 1e30;
          for (const int sp : {1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 132, 192, 256}) {
            if (sp > max_sweep) break;
            const double ms = kc::time_on_stream(stream, [&](int) { attend_wg(sp); }, 5);
            std::printf("    sweep %-22s%s splits %4d  %9.1f us  %.3f of copy\n", what, split_s ? " -S" : "", sp, ms * 1e3,
                        latent_bytes / (ms * 1e-3) / 1e9 / ceilings.copy_gbs);
            if (ms < best_ms) best_ms = ms, best = sp;
          }
          std::printf("    sweep %-22s%s best splits %d (%.1f us; plan chose %d)\n", what, split_s ? " -S" : "", best,
                      best_ms * 1e3,
                      kc::mla_attend_wgmma_split_plan(B, max_items, p, s.topk > 0, 0).n_splits);
        }
        for (void* ptr : {wws, static_cast<void*>(out_wg), wparts}) MX_CUDA_CHECK(cudaFree(ptr));
      }
      for (void* ptr : {static_cast<void*>(cache), static_cast<void*>(q), static_cast<void*>(out_mma),
                        static_cast<void*>(out_simple), static_cast<void*>(d_seq), static_cast<void*>(d_kv),
                        static_cast<void*>(d_tables), static_cast<void*>(d_topk), ws, static_cast<void*>(q_abs),
                        static_cast<void*>(o_lat), parts})
        if (ptr != nullptr) MX_CUDA_CHECK(cudaFree(ptr));
    }
    const double ratio = sparse64k_us / dense2k_us;
    std::printf("B%-3d attend: sparse top-2048 @64k / dense @2k = %.2f (target <= 1.3) %s\n", B, ratio,
                ratio <= 1.3 ? "MET" : "MISSED");
  }
  failures += bench_indexer(batches, time_simple, ceilings, stream, rng);
  std::printf("%s: %d failing case(s)\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
