// bench_mla_fp8: the FP8 latent cache of glm_moe_dsa (--kv-cache-dtype fp8_e4m3, kernels/mla_fp8.h: 656-byte
// rows) against the bf16 cache (1152 bytes) in the absorbed MLA decode attend step at the GLM-5.2 latent shape
// (qk_nope 192, rope 64, v 256, kv_lora_rank 512), dense at 20k / 64k context and sparse (top-2048) at 20k,
// batch 1 / 16 / 64, paged cache of 64-token blocks in shuffled order. Both caches are written from the same
// bf16 rows by the product's write kernels; per case: the attend step alone (tensor-core kernel + combine) on
// each cache in us (median of 10 regions), the FP8 speedup (issue 36 target >= 1.7 at 20k), GB/s on the FP8
// bytes and its fraction of the device-to-device copy bandwidth measured in the same run, and the whole op's
// rel L2 between the caches (check: <= 2^-4, the format's per-element relative bound). Oracle: the GPU test
// test_cuda_mla_fp8. (A separate program from bench_mla_decode so the two evolve without merge conflicts.)
// Second table (sm_90): the Hopper wgmma attend (mla_decode_wgmma.cu, the kAuto kernel there) on FP8 rows against
// the same kernel on bf16 rows, both variants (kWgmma, kWgmmaSplitS), batch 16 / 64 x 20k dense and 20k top-2048:
// attend alone (+ combine) in us, the speedup (target >= 1.7), GB/s and fraction of copy bandwidth on the FP8
// bytes, the whole op's rel L2 FP8 wgmma vs FP8 mma.sync (check <= 1.5e-2, test_cuda_mla_dsa's wgmma-vs-mma
// bound) and FP8 vs bf16 (check <= 2^-4).
//   usage: bench_mla_fp8 [--heads N] [--quick] [--wgmma-only]
//   --heads: query heads per GPU (64: GLM-5.2 unsplit; 16: TP4; 8: TP8).   --quick: batch 16 only.
//   --wgmma-only: the second table only.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/ceilings.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "bench_mla.h"


namespace {

constexpr int kFp8Row = 656;  // kernels/mla_fp8.h: 512 e4m3 codes + 4 f32 scales + 64 bf16 rope

// One decode case on the device: the batch's index arrays and top-k lists (topk > 0; the two RNG draws in this
// order), the bf16 and FP8 latent caches written from the same bf16 rows by the product's write kernels, q, and
// the attention geometry. release() frees its buffers.
struct DecodeCase {
  int32_t *seq = nullptr, *kv = nullptr, *tables = nullptr, *topk = nullptr, *slots = nullptr;
  uint16_t *lat = nullptr, *rope = nullptr, *cache = nullptr, *q = nullptr;
  uint8_t* cache8 = nullptr;
  mxserve::kernels::AttentionParams ap;
  void release() const {
    for (void* ptr : {static_cast<void*>(seq), static_cast<void*>(kv), static_cast<void*>(tables),
                      static_cast<void*>(topk), static_cast<void*>(slots), static_cast<void*>(lat),
                      static_cast<void*>(rope), static_cast<void*>(cache), static_cast<void*>(q),
                      static_cast<void*>(cache8)})
      if (ptr != nullptr) MX_CUDA_CHECK(cudaFree(ptr));
  }
};

DecodeCase decode_case(int B, int64_t ctx, int topk, int heads, std::mt19937& rng, cudaStream_t stream) {
  DecodeCase d;
  const bench::PagedDecodeBatch pb = bench::paged_decode_batch(B, ctx, kBlock, rng);
  const std::vector<int32_t> lists = topk > 0 ? bench::random_topk_rows(B, ctx, topk, rng) : std::vector<int32_t>{};
  const int64_t slots = pb.n_blocks * kBlock;
  std::vector<int32_t> all_slots(slots);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  d.slots = dev_upload(all_slots);
  d.lat = dev_alloc<uint16_t>(static_cast<size_t>(slots) * kLora);
  d.rope = dev_alloc<uint16_t>(static_cast<size_t>(slots) * kRope);
  kc::fill_random_bf16(d.lat, slots * kLora, 31 + ctx, 1.f, stream);
  kc::fill_random_bf16(d.rope, slots * kRope, 37 + ctx, 1.f, stream);
  d.cache = dev_alloc<uint16_t>(static_cast<size_t>(slots) * kRow);
  d.cache8 = dev_alloc<uint8_t>(static_cast<size_t>(slots) * kFp8Row);
  kc::cache_write_columns_bf16(d.lat, d.slots, d.cache, slots, kLora, kRow, 0, stream);
  kc::cache_write_columns_bf16(d.rope, d.slots, d.cache, slots, kRope, kRow, kLora, stream);
  kc::cache_write_fp8_packed_bf16(d.lat, d.slots, d.cache8, slots, kLora, kFp8Row, 0, stream);
  kc::cache_write_fp8_packed_bf16(d.rope, d.slots, d.cache8, slots, kRope, kFp8Row, kLora, stream);
  const int64_t q_elems = static_cast<int64_t>(B) * heads * (kNope + kRope);
  d.q = dev_alloc<uint16_t>(q_elems);
  kc::fill_random_bf16(d.q, q_elems, 41, 1.f, stream);
  d.seq = dev_upload(pb.token_seq);
  d.kv = dev_upload(pb.kv_index);
  d.tables = dev_upload(pb.block_tables);
  d.topk = topk > 0 ? dev_upload(lists) : nullptr;
  d.ap = bench::decode_attention_params(pb, B, heads, kRow, kBlock, ctx);
  return d;
}

// FP8 latent cache (--kv-cache-dtype fp8_e4m3, kernels/mla_fp8.h: 656-byte rows) against the bf16 cache
// (1152 bytes) on the same values: both caches are written from the same bf16 latent / rope rows by the
// product's write kernels, then the attend step alone (tensor-core kernel + combine) is timed on each.
// Prints per case both times, the FP8 speedup (issue 36 target >= 1.7 at 20k), GB/s on the FP8 bytes and
// its fraction of copy bandwidth, and the whole op's rel L2 between the two caches (check: <= 2^-4, the
// format's per-element relative bound). Returns the failing cases.
int bench_fp8_attend(const std::vector<int>& batches, const mxserve::kernels::MlaParams& p_bf16, const uint16_t* kv_b,
                     const kc::Ceilings& ceilings, cudaStream_t stream, std::mt19937& rng) {
  const int heads = p_bf16.n_heads;
  mxserve::kernels::MlaParams p8 = p_bf16;
  p8.fp8_cache = true;
  std::printf("\nFP8 latent cache (656 B/token) vs bf16 (1152 B/token), attend step, %d heads\n", heads);
  std::printf("%-24s %10s %10s %8s %9s %7s %9s  %s\n", "case", "bf16_us", "fp8_us", "speedup", "fp8 GB/s", "frac",
              "rel_l2", "check");
  int failures = 0;
  struct Shape {
    int64_t ctx;
    int topk;
  };
  for (const int B : batches) {
    for (const Shape s : {Shape{20480, 0}, Shape{65536, 0}, Shape{20480, 2048}}) {
      const DecodeCase dc = decode_case(B, s.ctx, s.topk, heads, rng, stream);
      const int64_t out_elems = static_cast<int64_t>(B) * heads * kV;
      uint16_t* out_bf16 = dev_alloc<uint16_t>(out_elems);
      uint16_t* out_fp8 = dev_alloc<uint16_t>(out_elems);
      const size_t ws_bytes = kc::mla_attention_workspace_bytes(B, p8);
      void* ws = dev_alloc<uint8_t>(ws_bytes);
      kc::mla_attention_bf16(dc.q, dc.cache, kv_b, dc.topk, s.topk, dc.seq, dc.kv, dc.tables, out_bf16, p_bf16, dc.ap,
                             ws, ws_bytes, stream, kc::MlaAttendKernel::kMma);
      kc::mla_attention_bf16(dc.q, dc.cache8, kv_b, dc.topk, s.topk, dc.seq, dc.kv, dc.tables, out_fp8, p8, dc.ap, ws,
                             ws_bytes, stream, kc::MlaAttendKernel::kMma);
      MX_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<uint16_t> h_bf16(out_elems), h_fp8(out_elems);
      MX_CUDA_CHECK(cudaMemcpy(h_bf16.data(), out_bf16, out_elems * 2, cudaMemcpyDeviceToHost));
      MX_CUDA_CHECK(cudaMemcpy(h_fp8.data(), out_fp8, out_elems * 2, cudaMemcpyDeviceToHost));
      const double err = rel_l2_bf16(h_fp8.data(), h_bf16.data(), out_elems);
      const int64_t lat_elems = static_cast<int64_t>(B) * heads * kLora;
      float* q_abs = dev_alloc<float>(lat_elems);
      float* o_lat = dev_alloc<float>(lat_elems);
      MX_CUDA_CHECK(cudaMemsetAsync(q_abs, 0, lat_elems * sizeof(float), stream));
      const size_t part_bytes = kc::mla_attend_mma_workspace_bytes(B, p8);
      void* parts = dev_alloc<uint8_t>(part_bytes);
      const int64_t max_items = s.topk > 0 ? s.topk : s.ctx;
      auto attend = [&](const void* c, const mxserve::kernels::MlaParams& pp) {
        return kc::time_on_stream(
            stream,
            [&](int) {
              kc::mla_attend_mma(dc.q, q_abs, c, dc.topk, s.topk, dc.seq, dc.kv, dc.tables, o_lat, 0, B, max_items, pp,
                                 dc.ap, parts, part_bytes, stream);
            },
            10);
      };
      const double bf16_ms = attend(dc.cache, p_bf16), fp8_ms = attend(dc.cache8, p8);
      const int64_t items = s.topk > 0 ? std::min<int64_t>(s.topk, s.ctx) : s.ctx;
      const double fp8_gbs = static_cast<double>(B) * items * kFp8Row / (fp8_ms * 1e-3) / 1e9;
      const bool pass = err <= 0.0625;
      failures += pass ? 0 : 1;
      char what[64];
      std::snprintf(what, sizeof what, "fp8 B%d ctx%lld %s", B, static_cast<long long>(s.ctx),
                    s.topk > 0 ? "top2048" : "dense");
      std::printf("%-24s %10.1f %10.1f %8.2f %9.0f %7.3f %9.2e  %s%s\n", what, bf16_ms * 1e3, fp8_ms * 1e3,
                  bf16_ms / fp8_ms, fp8_gbs, fp8_gbs / ceilings.copy_gbs, err, pass ? "PASS" : "FAIL",
                  s.ctx == 20480 && s.topk == 0 ? (bf16_ms / fp8_ms >= 1.7 ? " (target >= 1.7: MET)"
                                                                          : " (target >= 1.7: MISSED)")
                                                : "");
      dc.release();
      for (void* ptr : {static_cast<void*>(out_bf16), static_cast<void*>(out_fp8), ws, static_cast<void*>(q_abs),
                        static_cast<void*>(o_lat), parts})
        MX_CUDA_CHECK(cudaFree(ptr));
    }
  }
  return failures;
}

// The wgmma attend on FP8 rows vs bf16 rows (see the file comment). Returns the failing cases.
int bench_fp8_wgmma(const std::vector<int>& batches, const mxserve::kernels::MlaParams& p_bf16, const uint16_t* kv_b,
                    const kc::Ceilings& ceilings, cudaStream_t stream, std::mt19937& rng) {
  const int heads = p_bf16.n_heads;
  mxserve::kernels::MlaParams p8 = p_bf16;
  p8.fp8_cache = true;
  const char* why = nullptr;
  if (!kc::mla_attend_wgmma_supported(p8, &why)) {
    std::printf("\nwgmma FP8 table: SKIP (%s)\n", why);
    return 0;
  }
  std::printf("\nFP8 latent cache vs bf16 in the Hopper wgmma attend (attend + combine), %d heads\n", heads);
  std::printf("%-34s %6s %9s %9s %8s %9s %7s %9s %9s  %s\n", "case", "splits", "bf16_us", "fp8_us", "speedup",
              "fp8 GB/s", "frac", "vs_mma", "vs_bf16", "check");
  int failures = 0;
  struct Shape {
    int64_t ctx;
    int topk;
  };
  for (const int B : batches) {
    for (const Shape s : {Shape{20480, 0}, Shape{20480, 2048}}) {
      const DecodeCase dc = decode_case(B, s.ctx, s.topk, heads, rng, stream);
      const int64_t out_elems = static_cast<int64_t>(B) * heads * kV;
      // The whole op: FP8 wgmma (each variant) vs FP8 mma.sync (same bytes) and vs bf16 wgmma (same variant).
      const size_t ws_bytes = kc::mla_attention_workspace_bytes(B, p8);
      void* ws = dev_alloc<uint8_t>(ws_bytes);
      uint16_t* out = dev_alloc<uint16_t>(out_elems);
      auto op = [&](const void* c, const mxserve::kernels::MlaParams& pp, kc::MlaAttendKernel k) {
        kc::mla_attention_bf16(dc.q, c, kv_b, dc.topk, s.topk, dc.seq, dc.kv, dc.tables, out, pp, dc.ap, ws, ws_bytes,
                               stream, k);
        std::vector<uint16_t> h(out_elems);
        MX_CUDA_CHECK(cudaStreamSynchronize(stream));
        MX_CUDA_CHECK(cudaMemcpy(h.data(), out, out_elems * 2, cudaMemcpyDeviceToHost));
        return h;
      };
      const std::vector<uint16_t> mma8 = op(dc.cache8, p8, kc::MlaAttendKernel::kMma);
      // The attend alone: bf16 q_abs / o_lat, the kernel's own split plan.
      const int64_t lat_elems = static_cast<int64_t>(B) * heads * kLora;
      uint16_t* q_abs = dev_alloc<uint16_t>(lat_elems);
      uint16_t* o_lat = dev_alloc<uint16_t>(lat_elems);
      kc::fill_random_bf16(q_abs, lat_elems, 43, 0.05f, stream);
      const size_t part_bytes = kc::mla_attend_wgmma_workspace_bytes(B, p8);
      void* parts = dev_alloc<uint8_t>(part_bytes);
      const int64_t max_items = s.topk > 0 ? s.topk : s.ctx;
      const int splits = kc::mla_attend_wgmma_split_plan(B, max_items, p8, s.topk > 0).n_splits;
      for (const auto variant : {kc::MlaAttendKernel::kWgmma, kc::MlaAttendKernel::kWgmmaSplitS}) {
        const bool split_s = variant == kc::MlaAttendKernel::kWgmmaSplitS;
        const std::vector<uint16_t> w8 = op(dc.cache8, p8, variant), w16 = op(dc.cache, p_bf16, variant);
        const double vs_mma = rel_l2_bf16(w8.data(), mma8.data(), out_elems);
        const double vs_bf16 = rel_l2_bf16(w8.data(), w16.data(), out_elems);
        auto attend = [&](const void* c, const mxserve::kernels::MlaParams& pp) {
          return kc::time_on_stream(
              stream,
              [&](int) {
                kc::mla_attend_wgmma(dc.q, q_abs, c, dc.topk, s.topk, dc.seq, dc.kv, dc.tables, o_lat, 0, B, max_items,
                                     pp, dc.ap, parts, part_bytes, stream, 0, nullptr, split_s);
              },
              10);
        };
        const double bf16_ms = attend(dc.cache, p_bf16), fp8_ms = attend(dc.cache8, p8);
        const int64_t items = s.topk > 0 ? std::min<int64_t>(s.topk, s.ctx) : s.ctx;
        const double fp8_gbs = static_cast<double>(B) * items * kFp8Row / (fp8_ms * 1e-3) / 1e9;
        const bool pass = vs_mma <= 1.5e-2 && vs_bf16 <= 0.0625;
        failures += pass ? 0 : 1;
        char what[96];
        std::snprintf(what, sizeof what, "fp8 %s B%d ctx%lld %s", split_s ? "wgmma-splitS" : "wgmma", B,
                      static_cast<long long>(s.ctx), s.topk > 0 ? "top2048" : "dense");
        const bool target_row = s.topk == 0;
        std::printf("%-34s %6d %9.1f %9.1f %8.2f %9.0f %7.3f %9.2e %9.2e  %s%s\n", what, splits, bf16_ms * 1e3,
                    fp8_ms * 1e3, bf16_ms / fp8_ms, fp8_gbs, fp8_gbs / ceilings.copy_gbs, vs_mma, vs_bf16,
                    pass ? "PASS" : "FAIL",
                    target_row ? (bf16_ms / fp8_ms >= 1.7 ? " (target >= 1.7: MET)" : " (target >= 1.7: MISSED)") : "");
      }
      dc.release();
      for (void* ptr : {static_cast<void*>(out), ws, static_cast<void*>(q_abs), static_cast<void*>(o_lat), parts})
        MX_CUDA_CHECK(cudaFree(ptr));
    }
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  int heads = 64;
  bool quick = false, wgmma_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--heads") && i + 1 < argc) heads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--wgmma-only")) wgmma_only = true;
    else {
      std::fprintf(stderr, "usage: bench_mla_fp8 [--heads N] [--quick] [--wgmma-only]\n");
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
  const int64_t kvb_elems = static_cast<int64_t>(heads) * (kNope + kV) * kLora;
  uint16_t* kv_b = dev_alloc<uint16_t>(kvb_elems);
  kc::fill_random_bf16(kv_b, kvb_elems, 7, 0.05f, stream);
  const std::vector<int> batches = quick ? std::vector<int>{16} : std::vector<int>{1, 16, 64};
  std::mt19937 rng(20261206);
  int failures = wgmma_only ? 0 : bench_fp8_attend(batches, p, kv_b, ceilings, stream, rng);
  const std::vector<int> wgmma_batches = quick ? std::vector<int>{16} : std::vector<int>{16, 64};
  failures += bench_fp8_wgmma(wgmma_batches, p, kv_b, ceilings, stream, rng);
  MX_CUDA_CHECK(cudaFree(kv_b));
  std::printf("%s: %d failing case(s)\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
