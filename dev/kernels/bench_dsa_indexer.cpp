// bench_dsa_indexer: the DSA indexer (kernels/cuda/attention/dsa_indexer.cu + dsa_indexer_fused.cu +
// dsa_select_split.cu) at the GLM-5.2 index shape (32 index heads x 128, top-2048), one decode token per
// sequence, paged keys in shuffled 64-token blocks, batch 1 / 16 / 64 x 2k / 20k / 64k keys, bf16 keys and packed
// FP8 keys (kernels/mla_fp8.h: 132 bytes a key, written by the device cache writer from the same bf16 keys).
// Per case and key format, one row per path: kFused (score + histogram over the SMs, one select block a token),
// kFusedSplit (the same scores, the select of a token over a 1..8-CTA cluster), split-ring3 / split-ring4
// (kFusedSplit with the score kernel's ring of key loads forced to 3 / 4 stages, 1 block an SM: more keys in
// flight for large batches; kFusedDeepStages picks it by default once measured), kMma (scores to a workspace,
// one radix-select block a token): eager and CUDA-graph us (median of 5 regions), GB/s on the key bytes
// (B x ctx x bytes a key) at the faster of the two and that as a fraction of the device-to-device copy
// bandwidth measured in the same run
// (the metric of issue 36), and the rows whose top-k differs from kMma's on the same key bytes (0 expected:
// the same score arithmetic and tie rule; PASS only at 0).
// At 2k keys (<= top_k) the fused paths skip the scores by design (every key selected).
// Issue 36 targets: top-2048 over 20k keys <= 20 us at batch 1; >= 0.5 of copy bandwidth at batch 64.
//   usage: bench_dsa_indexer [--quick]     --quick: 20k keys only
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

#include "kernels/cuda/attention/dsa_indexer_fused.h"
#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/ceilings.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/mla_fp8.h"
#include "bench_device.h"

namespace kc = mxserve::kernels::cuda;
using bench::dev_alloc;
using bench::dev_upload;

namespace {

constexpr int kHeads = 32, kDim = 128, kTopK = 2048, kBlock = 64;

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else {
      std::fprintf(stderr, "usage: bench_dsa_indexer [--quick]\n");
      return 2;
    }
  }
  if (!bench::cuda_device_present()) return 0;
  cudaStream_t stream;
  MX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const kc::Ceilings ceilings = kc::measure_ceilings(stream, int64_t{1} << 30, 4096);
  std::printf("ceiling: device-to-device copy %.0f GB/s (read + write)\n", ceilings.copy_gbs);
  mxserve::kernels::IndexerParams p;
  p.n_heads = kHeads;
  p.head_dim = kDim;
  p.top_k = kTopK;
  p.score_scale = 1.f / std::sqrt(static_cast<float>(kDim));
  p.weight_scale = 1.f / std::sqrt(static_cast<float>(kHeads));
  const int64_t fp8_row = mxserve::kernels::mla_fp8_row_bytes(kDim, 0);
  std::printf("\nDSA indexer: %d heads x %d, top-%d, bf16 keys (%d bytes) / FP8 keys (%lld bytes); kAuto: kFused%s up "
              "to %lld rows (FP8 keys to the fused path: %s), else kMma\n",
              kHeads, kDim, kTopK, 2 * kDim, static_cast<long long>(fp8_row),
              kc::kIndexerAutoSplitSelect ? "Split" : "", static_cast<long long>(kc::kIndexerFusedMaxRows),
              kc::kIndexerAutoFusedFp8 ? "yes" : "no");
  std::printf("%-16s %-15s %9s %9s %9s %7s %8s  %s\n", "case", "path", "eager_us", "graph_us", "GB/s", "frac",
              "differ", "check");
  std::mt19937 rng(20261206);
  int failures = 0;
  double b1_20k_best_us = 1e30, b64_20k_best_frac = 0;
  std::string b1_best, b64_best;
  const std::vector<int64_t> contexts =
      quick ? std::vector<int64_t>{20480} : std::vector<int64_t>{2048, 20480, 65536};
  struct Path {
    kc::IndexerScoreKernel kernel;
    const char* name;
    int stages;  // the fused score kernel's ring of key loads (0: its rule, kFusedDeepStages)
  };
  const Path paths[] = {{kc::IndexerScoreKernel::kFused, "fused", 0},
                        {kc::IndexerScoreKernel::kFusedSplit, "fused-split", 0},
                        {kc::IndexerScoreKernel::kFusedSplit, "split-ring3", 3},
                        {kc::IndexerScoreKernel::kFusedSplit, "split-ring4", 4},
                        {kc::IndexerScoreKernel::kMma, "mma", 0}};
  for (const int B : {1, 16, 64}) {
    for (const int64_t ctx : contexts) {
      const bench::PagedDecodeBatch pb = bench::paged_decode_batch(B, ctx, kBlock, rng);
      const int64_t n_blocks = pb.n_blocks;
      const int64_t slots = n_blocks * kBlock;
      uint16_t* keys = dev_alloc<uint16_t>(static_cast<size_t>(slots) * kDim);
      kc::fill_random_bf16(keys, slots * kDim, 17 + ctx, 1.f, stream);
      // The same keys as packed FP8 rows (the device cache writer: codes + one f32 scale per row).
      uint8_t* keys8 = dev_alloc<uint8_t>(static_cast<size_t>(slots) * fp8_row);
      std::vector<int32_t> all_slots(static_cast<size_t>(slots));
      std::iota(all_slots.begin(), all_slots.end(), 0);
      int32_t* d_slots = dev_upload(all_slots);
      kc::cache_write_fp8_packed_bf16(keys, d_slots, keys8, slots, kDim, fp8_row, 0, stream);
      uint16_t* q = dev_alloc<uint16_t>(static_cast<size_t>(B) * kHeads * kDim);
      kc::fill_random_bf16(q, int64_t{B} * kHeads * kDim, 19, 1.f, stream);
      uint16_t* w = dev_alloc<uint16_t>(static_cast<size_t>(B) * kHeads);
      kc::fill_random_bf16(w, int64_t{B} * kHeads, 23, 1.f, stream);
      int32_t* d_seq = dev_upload(pb.token_seq);
      int32_t* d_kv = dev_upload(pb.kv_index);
      int32_t* d_tables = dev_upload(pb.block_tables);
      int32_t* out = dev_alloc<int32_t>(static_cast<size_t>(B) * kTopK);
      const mxserve::kernels::AttentionParams ap = bench::decode_attention_params(pb, B, 1, kDim, kBlock, ctx);
      const size_t ws_bytes = kc::dsa_indexer_workspace_bytes(B, ctx);
      void* ws = dev_alloc<uint8_t>(ws_bytes);
      for (const bool fp8 : {false, true}) {
        mxserve::kernels::IndexerParams pk = p;
        pk.fp8_keys = fp8;
        const void* kptr = fp8 ? static_cast<const void*>(keys8) : static_cast<const void*>(keys);
        auto run = [&](kc::IndexerScoreKernel k) {
          kc::dsa_indexer_topk(q, w, kptr, d_seq, d_kv, d_tables, out, pk, ap, ctx, ws, ws_bytes, stream, k);
        };
        auto result = [&] {
          MX_CUDA_CHECK(cudaStreamSynchronize(stream));
          std::vector<int32_t> h(static_cast<size_t>(B) * kTopK);
          MX_CUDA_CHECK(cudaMemcpy(h.data(), out, h.size() * 4, cudaMemcpyDeviceToHost));
          return h;
        };
        run(kc::IndexerScoreKernel::kMma);
        const std::vector<int32_t> ref = result();
        const double key_bytes = static_cast<double>(B) * ctx * (fp8 ? static_cast<double>(fp8_row) : 2.0 * kDim);
        for (const Path& path : paths) {
          kc::dsa_indexer_fused_force_stages(path.stages);
          run(path.kernel);  // first use outside the capture (one-time kernel attributes)
          const std::vector<int32_t> got = result();
          int64_t differ = 0;
          for (int b = 0; b < B; ++b)
            differ += std::memcmp(got.data() + b * kTopK, ref.data() + b * kTopK, 4 * kTopK) != 0 ? 1 : 0;
          const double eager_ms = kc::time_on_stream(stream, [&](int) { run(path.kernel); }, 20);
          cudaGraph_t graph = nullptr;
          cudaGraphExec_t exec = nullptr;
          MX_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
          run(path.kernel);
          MX_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
          MX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
          const double graph_ms =
              kc::time_on_stream(stream, [&](int) { MX_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, 20);
          MX_CUDA_CHECK(cudaGraphExecDestroy(exec));
          MX_CUDA_CHECK(cudaGraphDestroy(graph));
          kc::dsa_indexer_fused_force_stages(0);
          const double best_ms = std::min(eager_ms, graph_ms);
          const double gbs = key_bytes / (best_ms * 1e-3) / 1e9, frac = gbs / ceilings.copy_gbs;
          const bool pass = differ == 0;
          failures += pass ? 0 : 1;
          char what[64], name[32];
          std::snprintf(what, sizeof what, "B%d ctx%lld%s", B, static_cast<long long>(ctx),
                        ctx <= kTopK ? " skip" : "");
          std::snprintf(name, sizeof name, "%s%s", path.name, fp8 ? " fp8" : "");
          std::printf("%-16s %-15s %9.1f %9.1f %9.0f %7.3f %8lld  %s\n", what, name, eager_ms * 1e3, graph_ms * 1e3,
                      gbs, frac, static_cast<long long>(differ), pass ? "PASS" : "FAIL");
          if (B == 1 && ctx == 20480 && graph_ms * 1e3 < b1_20k_best_us) {
            b1_20k_best_us = graph_ms * 1e3;
            b1_best = name;
          }
          if (B == 64 && ctx == 20480 && frac > b64_20k_best_frac) {
            b64_20k_best_frac = frac;
            b64_best = name;
          }
        }
      }
      for (void* ptr : {static_cast<void*>(keys), static_cast<void*>(keys8), static_cast<void*>(d_slots),
                        static_cast<void*>(q), static_cast<void*>(w), static_cast<void*>(d_seq),
                        static_cast<void*>(d_kv), static_cast<void*>(d_tables), static_cast<void*>(out), ws})
        MX_CUDA_CHECK(cudaFree(ptr));
    }
  }
  std::printf("target: B1 top-2048 over 20k keys <= 20 us: %.1f us (graph, %s) %s\n", b1_20k_best_us, b1_best.c_str(),
              b1_20k_best_us <= 20.0 ? "MET" : "MISSED");
  std::printf("target: B64 20k keys >= 0.5 of copy bandwidth: %.3f (%s, on its key bytes) %s\n", b64_20k_best_frac,
              b64_best.c_str(), b64_20k_best_frac >= 0.5 ? "MET" : "MISSED");
  std::printf("%s: %d failing row(s)\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
