// bench_mla_sparse_prefill: sparse (DSA top-k) MLA prefill attention at the GLM-5.2 latent shape (qk_nope 192,
// rope 64, v 256, kv_lora_rank 512: 576 cached bf16 per key), issue 36 item 5. One sequence: a chunk of --tokens
// query rows (default 8192) at the end of a --keys context (default 20480: the chunk sits over a 12288-key prefix),
// each row with its own top-k list (--topk, default 2048) of visible keys, paged cache of 64-token blocks in shuffled
// order. Per head count (--heads, default 64 and 16: TP1 / TP4) it times, each the median of 5 regions:
//   attend rows (the metric; q_abs from the absorb GEMM, o_lat bf16):
//     "attend wgmma-S"   the split-KV decode attend (mla_decode_wgmma.cu, kWgmmaSplitS: today's sm_90 default)
//     "attend prefill"   the sparse-prefill attend (mla_sparse_prefill_wgmma.cu, kWgmmaPrefill), P V waited per tile
//     "attend prefill-ov" the same with P V left in flight under the next tile's scores (overlap_pv; bitwise equal)
//     "attend prefill-eg" the overlap-PV order with each warpgroup gathering its half of the next tile as soon as its
//                        previous P V retires, lookups a tile ahead (early_gather, kWgmmaPrefillEg; bitwise equal)
//   whole-op rows (absorb GEMM + attend + un-absorb GEMM, through mla_attention_bf16):
//     "op mma" (the mma.sync path, the oracle), "op wgmma-S", "op prefill", "op prefill-eg" (kWgmmaPrefillEg).
// TFLOP/s = tokens x heads x visible top-k entries x (576 + 512) x 2 / time (the score and P V FLOPs; the absorb
// GEMMs are not counted in the op rows either), and its fraction of the cuBLASLt bf16 GEMM rate measured in the same
// run. Checks: the prefill attend's o_lat against the wgmma-S attend's and the prefill op's output against the mma
// op's (rel L2, PASS <= 1.5e-2, the bound test_cuda_mla_dsa uses); a MET / MISSED line for >= 450 TFLOP/s at 64 heads.
// Top-k lists: by default every key has one random global importance and a row picks its top_k most important
// visible keys, so neighbouring rows share almost all of their keys (as real DSA rows largely do: L2 reuse);
// --random-topk draws each row's set independently (the worst case for L2).
// --no-mma: skip the (slow) mma op row; the prefill op is then checked against the wgmma-S op. --attend-only: the
// attend rows alone (e.g. under ncu).
//   usage: bench_mla_sparse_prefill [--heads N]... [--tokens T] [--keys K] [--topk K] [--random-topk] [--no-mma]
//          [--attend-only]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/ceilings.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "bench_mla.h"


namespace {

// Top-k lists [T, top_k] (ascending, -1 padded) of rows whose contexts are first_ctx, first_ctx + 1, ...
std::vector<int32_t> make_topk(int64_t T, int64_t first_ctx, int64_t top_k, bool random_sets, std::mt19937& rng) {
  const int64_t n_keys = first_ctx + T - 1;
  std::vector<int32_t> out(static_cast<size_t>(T * top_k), -1);
  if (random_sets) {
    std::vector<int32_t> all(static_cast<size_t>(n_keys));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t ctx = first_ctx + t, k = std::min(ctx, top_k);
      std::iota(all.begin(), all.begin() + ctx, 0);
      for (int64_t i = 0; i < k; ++i) std::swap(all[i], all[i + static_cast<int64_t>(rng() % (ctx - i))]);
      std::sort(all.begin(), all.begin() + k);
      std::copy(all.begin(), all.begin() + k, out.begin() + t * top_k);
    }
    return out;
  }
  std::vector<uint32_t> rank(static_cast<size_t>(n_keys));
  for (auto& r : rank) r = static_cast<uint32_t>(rng());
  std::set<std::pair<uint32_t, int32_t>> best;  // the row's set, by importance (smaller rank = more important)
  for (int64_t j = 0; j < first_ctx; ++j) {
    best.emplace(rank[j], static_cast<int32_t>(j));
    if (static_cast<int64_t>(best.size()) > top_k) best.erase(std::prev(best.end()));
  }
  std::vector<int32_t> row;
  for (int64_t t = 0; t < T; ++t) {
    if (t > 0) {  // the row sees one more key
      const int64_t j = first_ctx + t - 1;
      best.emplace(rank[j], static_cast<int32_t>(j));
      if (static_cast<int64_t>(best.size()) > top_k) best.erase(std::prev(best.end()));
    }
    row.clear();
    for (const auto& e : best) row.push_back(e.second);
    std::sort(row.begin(), row.end());
    std::copy(row.begin(), row.end(), out.begin() + t * top_k);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> heads_list;
  int64_t T = 8192, n_keys = 20480, top_k = 2048;
  bool random_sets = false, run_mma = true, attend_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--heads") && i + 1 < argc) heads_list.push_back(std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) T = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--keys") && i + 1 < argc) n_keys = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--topk") && i + 1 < argc) top_k = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--random-topk")) random_sets = true;
    else if (!std::strcmp(argv[i], "--no-mma")) run_mma = false;
    else if (!std::strcmp(argv[i], "--attend-only")) attend_only = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_mla_sparse_prefill [--heads N]... [--tokens T] [--keys K] [--topk K] [--random-topk] "
                   "[--no-mma] [--attend-only]\n");
      return 2;
    }
  }
  if (heads_list.empty()) heads_list = {64, 16};
  if (T < 1 || top_k < 1 || n_keys < T) {
    std::fprintf(stderr, "bench_mla_sparse_prefill: need --tokens >= 1, --topk >= 1, --keys >= --tokens\n");
    return 2;
  }
  if (!bench::cuda_device_present()) return 0;
  cudaStream_t stream;
  MX_CUDA_CHECK(cudaStreamCreate(&stream));
  const kc::Ceilings ceilings = kc::measure_ceilings(stream, int64_t{1} << 30, 8192);
  std::printf("ceilings: cuBLASLt bf16 GEMM %.0f TFLOP/s, device-to-device copy %.0f GB/s\n", ceilings.gemm_tflops,
              ceilings.copy_gbs);

  // One sequence of n_keys keys; the chunk's rows are its last T positions.
  const int64_t prefix = n_keys - T, blocks = (n_keys + kBlock - 1) / kBlock;
  std::mt19937 rng(20261206);
  std::vector<int32_t> tables(static_cast<size_t>(blocks));
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), rng);
  std::vector<int32_t> token_seq(static_cast<size_t>(T), 0), kv_index(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) kv_index[t] = static_cast<int32_t>(prefix + t);
  const std::vector<int32_t> topk = make_topk(T, prefix + 1, top_k, random_sets, rng);
  double entries = 0;  // visible top-k entries over all rows
  for (const int32_t e : topk) entries += e >= 0 ? 1 : 0;
  int32_t* d_tables = dev_upload(tables);
  int32_t* d_seq = dev_upload(token_seq);
  int32_t* d_kv = dev_upload(kv_index);
  int32_t* d_topk = dev_upload(topk);
  const int64_t slots = blocks * kBlock;
  uint16_t* cache = dev_alloc<uint16_t>(static_cast<size_t>(slots) * kRow);
  kc::fill_random_bf16(cache, slots * kRow, 11, 1.f, stream);
  std::printf("sparse MLA prefill: %lld rows over %lld keys (prefix %lld), top-%lld (%s sets), %.0f entries a row, "
              "latent %.1f MB\n",
              static_cast<long long>(T), static_cast<long long>(n_keys), static_cast<long long>(prefix),
              static_cast<long long>(top_k), random_sets ? "independent" : "overlapping", entries / T,
              slots * kRow * 2 / 1e6);

  int failures = 0;
  for (const int heads : heads_list) {
    const mxserve::kernels::MlaParams p = mxserve::kernels::glm_mla_params(heads);
    const char* why = nullptr;
    if (!kc::mla_attend_wgmma_supported(p, &why)) {
      std::printf("heads %d: SKIP (%s)\n", heads, why);
      continue;
    }
    mxserve::kernels::AttentionParams ap;
    ap.n_tokens = static_cast<int32_t>(T);
    ap.n_seqs = 1;
    ap.n_heads = heads;
    ap.n_kv_heads = 1;
    ap.head_dim = kRow;
    ap.block_size = kBlock;
    ap.max_blocks_per_seq = static_cast<int32_t>(blocks);
    ap.max_kv_len = static_cast<int32_t>(n_keys);
    const int64_t kvb_elems = static_cast<int64_t>(heads) * (kNope + kV) * kLora;
    uint16_t* kv_b = dev_alloc<uint16_t>(kvb_elems);
    kc::fill_random_bf16(kv_b, kvb_elems, 7, 0.05f, stream);
    const int64_t q_elems = T * heads * (kNope + kRope), lat_elems = T * heads * kLora, out_elems = T * heads * kV;
    uint16_t* q = dev_alloc<uint16_t>(q_elems);
    kc::fill_random_bf16(q, q_elems, 13, 1.f, stream);
    uint16_t* q_abs = dev_alloc<uint16_t>(lat_elems);
    uint16_t* o_old = dev_alloc<uint16_t>(lat_elems);
    uint16_t* o_new = dev_alloc<uint16_t>(lat_elems);
    kc::mla_absorb_gemm_bf16(q, kv_b, q_abs, 0, T, p, stream);
    const double flops = entries * heads * (kRow + kLora) * 2;
    const double gemm = ceilings.gemm_tflops;
    std::printf("\n%d heads: %.2f TFLOP a call\n%-20s %11s %9s %8s %10s  %s\n", heads, flops / 1e12, "row", "us",
                "TFLOP/s", "of_gemm", "rel_l2", "check");
    auto row = [&](const char* what, double ms, double err, const char* vs) {
      const double tf = flops / (ms * 1e-3) / 1e12;
      const bool checked = err >= 0;
      const bool pass = !checked || err <= 1.5e-2;
      failures += pass ? 0 : 1;
      std::printf("%-20s %11.1f %9.1f %8.3f %10.2e  %s%s\n", what, ms * 1e3, tf, tf / gemm, checked ? err : 0.0,
                  checked ? (pass ? "PASS" : "FAIL") : "-", vs);
      return tf;
    };

    // The attend steps alone, over the whole chunk in one launch each.
    const size_t parts_bytes = std::max<size_t>(kc::mla_attend_wgmma_workspace_bytes(T, p), 256);
    void* parts = dev_alloc<uint8_t>(parts_bytes);
    auto attend_old = [&]() {
      kc::mla_attend_wgmma(q, q_abs, cache, d_topk, top_k, d_seq, d_kv, d_tables, o_old, 0, T, top_k, p, ap, parts,
                           parts_bytes, stream, 0, nullptr, /*split_s=*/true);
    };
    auto attend_new = [&](bool overlap, uint16_t* dst, bool early = false) {
      kc::mla_sparse_prefill_wgmma(q, q_abs, cache, d_topk, top_k, d_seq, d_kv, d_tables, dst, 0, T, p, ap, stream,
                                   overlap, early);
    };
    attend_old();
    std::vector<uint16_t> h_old(static_cast<size_t>(lat_elems)), h_new(h_old.size()), h_ov(h_old.size());
    std::vector<uint16_t> h_eg(h_old.size());
    attend_new(true, o_new);
    MX_CUDA_CHECK(cudaStreamSynchronize(stream));
    MX_CUDA_CHECK(cudaMemcpy(h_ov.data(), o_new, lat_elems * 2, cudaMemcpyDeviceToHost));
    MX_CUDA_CHECK(cudaMemset(o_new, 0xff, lat_elems * 2));  // NaN poison: an unwritten row fails the comparison
    attend_new(true, o_new, /*early=*/true);
    MX_CUDA_CHECK(cudaStreamSynchronize(stream));
    MX_CUDA_CHECK(cudaMemcpy(h_eg.data(), o_new, lat_elems * 2, cudaMemcpyDeviceToHost));
    attend_new(false, o_new);
    MX_CUDA_CHECK(cudaStreamSynchronize(stream));
    MX_CUDA_CHECK(cudaMemcpy(h_old.data(), o_old, lat_elems * 2, cudaMemcpyDeviceToHost));
    MX_CUDA_CHECK(cudaMemcpy(h_new.data(), o_new, lat_elems * 2, cudaMemcpyDeviceToHost));
    const double attend_err = rel_l2_bf16(h_new.data(), h_old.data(), static_cast<size_t>(lat_elems));
    const bool same = std::memcmp(h_new.data(), h_ov.data(), h_new.size() * 2) == 0;
    const bool same_eg = std::memcmp(h_new.data(), h_eg.data(), h_new.size() * 2) == 0;
    const double old_ms = kc::time_on_stream(stream, [&](int) { attend_old(); }, 3);
    const double new_ms = kc::time_on_stream(stream, [&](int) { attend_new(false, o_new); }, 3);
    const double ov_ms = kc::time_on_stream(stream, [&](int) { attend_new(true, o_new); }, 3);
    const double eg_ms = kc::time_on_stream(stream, [&](int) { attend_new(true, o_new, true); }, 3);
    row("attend wgmma-S", old_ms, -1, "  (old path: split-KV decode attend)");
    const double new_tf = row("attend prefill", new_ms, attend_err, "  (o_lat vs attend wgmma-S)");
    const double ov_tf = row("attend prefill-ov", ov_ms, same ? 0.0 : INFINITY, "  (o_lat bitwise vs attend prefill)");
    const double eg_tf =
        row("attend prefill-eg", eg_ms, same_eg ? 0.0 : INFINITY, "  (o_lat bitwise vs attend prefill)");
    std::printf("attend prefill / wgmma-S speedup %.2fx (overlap-PV schedule %.2fx, early-gather %.2fx)\n",
                old_ms / new_ms, old_ms / ov_ms, old_ms / eg_ms);

    if (heads == 64) {
      const double best = std::max({new_tf, ov_tf, eg_tf});
      std::printf("64 heads attend prefill: %.1f TFLOP/s (best schedule: %s; issue 36 target >= 450) %s\n", best,
                  best == eg_tf   ? "early-gather"
                  : best == ov_tf ? "overlap-PV"
                                  : "plain",
                  best >= 450 ? "MET" : "MISSED");
    }
    for (void* ptr : {static_cast<void*>(q_abs), static_cast<void*>(o_old), static_cast<void*>(o_new), parts})
      MX_CUDA_CHECK(cudaFree(ptr));
    if (attend_only) {
      for (void* ptr : {static_cast<void*>(kv_b), static_cast<void*>(q)}) MX_CUDA_CHECK(cudaFree(ptr));
      continue;
    }
    // The whole op through the launcher (absorb GEMM, attend, un-absorb GEMM per token group).
    const size_t ws_bytes = kc::mla_attention_workspace_bytes(T, p);
    void* ws = dev_alloc<uint8_t>(ws_bytes);
    uint16_t* out_ref = dev_alloc<uint16_t>(out_elems);
    uint16_t* out = dev_alloc<uint16_t>(out_elems);
    auto op = [&](kc::MlaAttendKernel k, uint16_t* dst) {
      kc::mla_attention_bf16(q, cache, kv_b, d_topk, top_k, d_seq, d_kv, d_tables, dst, p, ap, ws, ws_bytes, stream,
                             k);
    };
    std::vector<uint16_t> h_ref(static_cast<size_t>(out_elems)), h_out(h_ref.size());
    const kc::MlaAttendKernel ref_kernel = run_mma ? kc::MlaAttendKernel::kMma : kc::MlaAttendKernel::kWgmmaSplitS;
    op(ref_kernel, out_ref);
    op(kc::MlaAttendKernel::kWgmmaPrefill, out);
    MX_CUDA_CHECK(cudaStreamSynchronize(stream));
    MX_CUDA_CHECK(cudaMemcpy(h_ref.data(), out_ref, out_elems * 2, cudaMemcpyDeviceToHost));
    MX_CUDA_CHECK(cudaMemcpy(h_out.data(), out, out_elems * 2, cudaMemcpyDeviceToHost));
    const double op_err = rel_l2_bf16(h_out.data(), h_ref.data(), static_cast<size_t>(out_elems));
    std::vector<uint16_t> h_out_eg(h_ref.size());
    op(kc::MlaAttendKernel::kWgmmaPrefillEg, out);
    MX_CUDA_CHECK(cudaStreamSynchronize(stream));
    MX_CUDA_CHECK(cudaMemcpy(h_out_eg.data(), out, out_elems * 2, cudaMemcpyDeviceToHost));
    const double op_eg_err = rel_l2_bf16(h_out_eg.data(), h_ref.data(), static_cast<size_t>(out_elems));
    if (run_mma)
      row("op mma", kc::time_on_stream(stream, [&](int) { op(kc::MlaAttendKernel::kMma, out_ref); }, 1, 1, 3), -1, "");
    row("op wgmma-S",
        kc::time_on_stream(stream, [&](int) { op(kc::MlaAttendKernel::kWgmmaSplitS, out_ref); }, 2), -1, "");
    row("op prefill", kc::time_on_stream(stream, [&](int) { op(kc::MlaAttendKernel::kWgmmaPrefill, out); }, 2), op_err,
        run_mma ? "  (out vs op mma)" : "  (out vs op wgmma-S)");
    row("op prefill-eg",
        kc::time_on_stream(stream, [&](int) { op(kc::MlaAttendKernel::kWgmmaPrefillEg, out); }, 2), op_eg_err,
        run_mma ? "  (out vs op mma)" : "  (out vs op wgmma-S)");
    for (void* ptr : {static_cast<void*>(kv_b), static_cast<void*>(q), ws, static_cast<void*>(out_ref),
                      static_cast<void*>(out)})
      MX_CUDA_CHECK(cudaFree(ptr));
  }
  std::printf("%s: %d failing check(s)\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
