// `mxserve tune-attention`: times the decode attention kernel's context-split choices on this GPU over a grid
// of (rows, context) buckets for one KV cache dtype and head geometry, and writes the table the CUDA planner
// looks up (format mxserve-attention-tuning/1, kernels/attention_tuning.h; embedded from configs/attention/).
// Each cell: R sequences of one decode row each, all at context C, K/V blocks scattered over a pool far
// larger than L2 (rows map their blocks pseudo-randomly into it when the whole grid cell does not fit);
// every candidate split count and the heuristic's own plan timed with CUDA events (median of 5 regions).
// Prints, per cell, the best split count against the heuristic's choice. Needs the CUDA backend.
// --mla: the same grid for the Hopper absorbed-MLA attend kernel (MlaAttendKernel::kWgmma, mla_decode_wgmma.cu) at
// --heads query heads per rank over the bf16 latent cache (576 values a token, 64-token blocks): key Q<heads>_KV1_
// D576_bf16, candidates up to one wave of CTAs; CudaMlaDsaOps looks the table up by that key.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "kernels/attention_tuning.h"

#ifdef MXSERVE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda_backend.h"
#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/ceilings.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/mla_geometry.h"
#include "model/forward_batch.h"
#endif

namespace mxserve::cli {
namespace {

namespace kern = kernels;

struct TuneArgs {
  kern::AttentionTuningKey key;
  std::vector<int64_t> rows = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  std::vector<int64_t> contexts = {1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072};
  double pool_gib = 16;
  std::string out, command;
  bool mla = false;
};

Result<std::vector<int64_t>> int_list(const Args& a, const std::string& flag, std::vector<int64_t> fallback) {
  if (!a.has(flag)) return fallback;
  MX_ASSIGN_OR_RETURN(std::string text, a.get(flag));
  std::vector<int64_t> v;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    char* end = nullptr;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || x <= 0 || (!v.empty() && x <= v.back()))
      return invalid_argument(flag + " " + text + ": expected ascending positive integers, bad item '" + item + "'");
    v.push_back(x);
    pos = comma + 1;
  }
  return v;
}

#ifdef MXSERVE_HAVE_CUDA
uint64_t mix64(uint64_t x) {  // splitmix64: the pseudo-random block placement
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Split counts worth timing at context C: 1, then ~1.5x steps while a split keeps >= 128 keys.
std::vector<int32_t> candidates(int64_t context) {
  std::vector<int32_t> v;
  for (int32_t s : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256})
    if (s == 1 || context / s >= 128) v.push_back(s);
  return v;
}

// One tuned (rows, context) entry: the best split count and its time, printed beside the heuristic's.
void add_row(kern::AttentionSplitTable& table, int64_t R, int64_t C, int32_t best, double best_us, int32_t heur_splits,
             double heur_us) {
  table.n_splits.push_back(best);
  table.us.push_back(best_us);
  std::printf("%6lld %8lld %8d %10.1f %10d %10.1f %6.2fx\n", static_cast<long long>(R), static_cast<long long>(C), best,
              best_us, heur_splits, heur_us, heur_us / best_us);
  std::fflush(stdout);
}

// Writes the table as JSON to `out` and says where to put it; the command's exit code.
int write_table(const kern::AttentionSplitTable& table, const std::string& out) {
  std::ofstream f(out);
  f << kern::attention_tuning_json(table);
  if (!f) {
    std::fprintf(stderr, "error: cannot write %s\n", out.c_str());
    return 1;
  }
  std::printf("wrote %s (%s): copy it to configs/attention/%s and rebuild to embed it\n", out.c_str(),
              kern::describe(table.key).c_str(), kern::attention_tuning_file_name(table.key).c_str());
  return 0;
}

int tune(backend::Backend& be, const TuneArgs& a) {
  constexpr int64_t kBlock = 16;
  cudaStream_t stream = backend::cuda_backend_stream(be);
  cudaDeviceProp prop{};
  MX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int n_sms = prop.multiProcessorCount;
  kern::AttentionSplitTable table;
  table.key = a.key;
  table.key.gpu = prop.name;
  table.tuned = true;
  table.command = a.command;
  table.rows = a.rows;
  table.contexts = a.contexts;
  const bool fp8 = a.key.kv_dtype == "fp8_e4m3";
  const int64_t width = static_cast<int64_t>(a.key.n_kv_heads) * a.key.head_dim;
  const int64_t block_bytes = 2 * kBlock * width * (fp8 ? 1 : 2);  // K + V
  const int64_t most_blocks = a.rows.back() * ((a.contexts.back() + kBlock - 1) / kBlock);
  const int64_t pool_blocks =
      std::min<int64_t>(most_blocks, static_cast<int64_t>(a.pool_gib * (1ull << 30)) / block_bytes);
  const int64_t n_slots = pool_blocks * kBlock;
  std::printf("tune-attention: %s, %d SMs, %s, pool %lld blocks (%.1f GiB of K+V)\n", prop.name, n_sms,
              kern::describe(table.key).c_str(), static_cast<long long>(pool_blocks),
              pool_blocks * static_cast<double>(block_bytes) / (1ull << 30));
  Tensor kc = be.alloc(fp8 ? DType::kFP8E4M3 : DType::kBF16, {n_slots, width});
  Tensor vc = be.alloc(fp8 ? DType::kFP8E4M3 : DType::kBF16, {n_slots, width});
  Tensor ks, vs;
  if (fp8) {  // code 0x38 (1.0) and unit scales: timing only
    MX_CUDA_CHECK(cudaMemsetAsync(kc.raw(), 0x38, kc.nbytes(), stream));
    MX_CUDA_CHECK(cudaMemsetAsync(vc.raw(), 0x38, vc.nbytes(), stream));
    Tensor ones = Tensor::empty(DType::kF32, {n_slots, a.key.n_kv_heads});
    std::fill(ones.data<float>(), ones.data<float>() + ones.numel(), 1.f);
    ks = be.upload(ones);
    vs = be.upload(ones);
  } else {
    kernels::cuda::fill_random_bf16(kc.raw(), kc.numel(), 1, 1.f, stream);
    kernels::cuda::fill_random_bf16(vc.raw(), vc.numel(), 2, 1.f, stream);
  }
  std::printf("%6s %8s %8s %10s %10s %10s %7s\n", "rows", "context", "best", "best us", "heur", "heur us", "gain");
  for (int64_t R : a.rows) {
    Tensor q = be.alloc(DType::kBF16, {R, static_cast<int64_t>(a.key.n_heads) * a.key.head_dim});
    kernels::cuda::fill_random_bf16(q.raw(), q.numel(), 3, 1.f, stream);
    Tensor o = be.alloc(DType::kBF16, q.shape());
    for (int64_t C : a.contexts) {
      model::ForwardBatch fb;
      const int64_t per_row = (C + kBlock - 1) / kBlock;
      for (int64_t r = 0; r < R; ++r) {
        model::SequenceSpan span;
        span.token_begin = static_cast<int32_t>(r);
        span.n_tokens = 1;
        span.kv_len = static_cast<int32_t>(C);
        for (int64_t b = 0; b < per_row; ++b)
          span.block_table.push_back(static_cast<int32_t>(
              R * per_row <= pool_blocks ? r * per_row + b : mix64(r * 1000003ull + b) % pool_blocks));
        fb.token_ids.push_back(0);
        fb.positions.push_back(static_cast<int32_t>(C - 1));
        fb.seqs.push_back(std::move(span));
      }
      kern::AttentionParams shape;
      shape.n_heads = a.key.n_heads;
      shape.n_kv_heads = a.key.n_kv_heads;
      shape.head_dim = a.key.head_dim;
      shape.scale = 1.f / std::sqrt(static_cast<float>(a.key.head_dim));
      auto meta = model::build_attention_meta(fb, be, kBlock, shape);
      if (!meta.is_ok()) {
        std::fprintf(stderr, "error: %s\n", meta.status().to_string().c_str());
        return 1;
      }
      kern::AttentionParams p = meta->params;
      if (fp8) {
        p.k_scales = ks.data<float>();
        p.v_scales = vs.data<float>();
      }
      const double kv_bytes = static_cast<double>(R) * C * width * (fp8 ? 1 : 2) * 2;
      const int reps = static_cast<int>(std::clamp(2e-3 / (kv_bytes / 4e12), 3.0, 50.0));
      auto time_plan = [&](const kernels::cuda::AttentionPlanOptions& opts) {
        const kernels::cuda::AttentionBatchPlan plan = kernels::cuda::plan_paged_attention_batch(p, n_sms, opts);
        Tensor ws;
        if (plan.workspace_bytes > 0) ws = be.alloc(DType::kU8, {static_cast<int64_t>(plan.workspace_bytes)});
        const double ms = kernels::cuda::time_on_stream(
            stream,
            [&](int) {
              kernels::cuda::paged_attention_batch(q.raw(), kc.raw(), vc.raw(), meta->token_seq.data<int32_t>(),
                                                   meta->kv_index.data<int32_t>(),
                                                   meta->block_tables.data<int32_t>(), o.raw(), plan, ws.raw(),
                                                   stream);
            },
            reps);
        return std::pair<int, double>(plan.parts[0].launch.n_splits, ms * 1e3);
      };
      kernels::cuda::AttentionPlanOptions opts;
      opts.force = kernels::cuda::AttentionPlanOptions::Force::kWarp;
      const auto [heur_splits, heur_us] = time_plan(opts);
      int best = 0;
      double best_us = INFINITY;
      for (int32_t s : candidates(C)) {
        opts.warp_splits = s;
        const auto [got, us] = time_plan(opts);
        if (got == s && us < best_us) {  // a count the context cannot hold (fewer splits) is timed under its own
          best_us = us;
          best = s;
        }
      }
      add_row(table, R, C, best, best_us, heur_splits, heur_us);
    }
  }
  return write_table(table, a.out);
}

// --mla: the wgmma absorbed-MLA attend step (q_abs of zeros: the time does not depend on the values), R sequences
// of one decode row each at context C, latent blocks scattered over the pool.
int tune_mla(backend::Backend& be, const TuneArgs& a) {
  namespace kc = kernels::cuda;
  constexpr int64_t kBlock = 64, kWidth = 576;
  cudaStream_t stream = backend::cuda_backend_stream(be);
  cudaDeviceProp prop{};
  MX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int n_sms = prop.multiProcessorCount;
  const kern::MlaParams p = kern::glm_mla_params(a.key.n_heads);
  const char* why = nullptr;
  if (!kc::mla_attend_wgmma_supported(p, &why)) {
    std::fprintf(stderr, "error: tune-attention --mla --heads %d: the wgmma MLA kernel cannot run: %s\n", p.n_heads,
                 why);
    return 2;
  }
  kern::AttentionSplitTable table;
  table.key = a.key;
  table.key.gpu = prop.name;
  table.tuned = true;
  table.command = a.command;
  table.rows = a.rows;
  table.contexts = a.contexts;
  const int64_t block_bytes = kBlock * kWidth * 2;
  const int64_t most_blocks = a.rows.back() * ((a.contexts.back() + kBlock - 1) / kBlock);
  const int64_t pool_blocks =
      std::min<int64_t>(most_blocks, static_cast<int64_t>(a.pool_gib * (1ull << 30)) / block_bytes);
  std::printf("tune-attention --mla: %s, %d SMs, %s, pool %lld blocks (%.1f GiB of latent)\n", prop.name, n_sms,
              kern::describe(table.key).c_str(), static_cast<long long>(pool_blocks),
              pool_blocks * static_cast<double>(block_bytes) / (1ull << 30));
  Tensor cache = be.alloc(DType::kBF16, {pool_blocks * kBlock, kWidth});
  kc::fill_random_bf16(cache.raw(), cache.numel(), 1, 1.f, stream);
  std::printf("%6s %8s %8s %10s %10s %10s %7s\n", "rows", "context", "best", "best us", "heur", "heur us", "gain");
  for (int64_t R : a.rows) {
    Tensor q = be.alloc(DType::kBF16, {R, static_cast<int64_t>(p.n_heads) * (p.qk_nope_dim + p.qk_rope_dim)});
    kc::fill_random_bf16(q.raw(), q.numel(), 3, 1.f, stream);
    Tensor q_abs = be.alloc(DType::kBF16, {R, static_cast<int64_t>(p.n_heads) * p.kv_lora_rank});
    MX_CUDA_CHECK(cudaMemsetAsync(q_abs.raw(), 0, q_abs.nbytes(), stream));
    Tensor o_lat = be.alloc(DType::kBF16, q_abs.shape());
    const int64_t tpc = std::max(1, 64 / p.n_heads), ctas = (R + tpc - 1) / tpc;
    const int wave = static_cast<int>(std::max<int64_t>(1, n_sms / ctas));
    const size_t ws_bytes = kc::mla_attend_wgmma_workspace_bytes(R, p, wave);
    Tensor ws = be.alloc(DType::kU8, {static_cast<int64_t>(std::max<size_t>(ws_bytes, 16))});
    for (int64_t C : a.contexts) {
      model::ForwardBatch fb;
      const int64_t per_row = (C + kBlock - 1) / kBlock;
      for (int64_t r = 0; r < R; ++r) {
        model::SequenceSpan span;
        span.token_begin = static_cast<int32_t>(r);
        span.n_tokens = 1;
        span.kv_len = static_cast<int32_t>(C);
        for (int64_t b = 0; b < per_row; ++b)
          span.block_table.push_back(static_cast<int32_t>(
              R * per_row <= pool_blocks ? r * per_row + b : mix64(r * 1000003ull + b) % pool_blocks));
        fb.token_ids.push_back(0);
        fb.positions.push_back(static_cast<int32_t>(C - 1));
        fb.seqs.push_back(std::move(span));
      }
      kern::AttentionParams shape;
      shape.n_heads = p.n_heads;
      shape.n_kv_heads = 1;
      shape.head_dim = static_cast<int32_t>(kWidth);
      auto meta = model::build_attention_meta(fb, be, kBlock, shape);
      if (!meta.is_ok()) {
        std::fprintf(stderr, "error: %s\n", meta.status().to_string().c_str());
        return 1;
      }
      kern::AttentionParams ap = meta->params;
      ap.max_kv_len = static_cast<int32_t>(C);
      const double bytes = static_cast<double>(R) * C * kWidth * 2;
      const int reps = static_cast<int>(std::clamp(2e-3 / (bytes / 4e12), 3.0, 50.0));
      auto time_splits = [&](int splits) {
        return 1e3 * kc::time_on_stream(
                         stream,
                         [&](int) {
                           kc::mla_attend_wgmma(q.raw(), q_abs.raw(), cache.raw(), nullptr, 0,
                                                meta->token_seq.data<int32_t>(), meta->kv_index.data<int32_t>(),
                                                meta->block_tables.data<int32_t>(), o_lat.raw(), 0, R, C, p, ap,
                                                ws.raw(), ws_bytes, stream, splits);
                         },
                         reps);
      };
      const int heur_splits = kc::mla_attend_wgmma_split_plan(R, C, p, false).n_splits;
      const double heur_us = time_splits(0);
      int best = 0;
      double best_us = INFINITY;
      for (int32_t s : candidates(C)) {
        if (s > wave || (s > 1 && C / s < 64)) continue;
        const double us = time_splits(s);
        if (us < best_us) {
          best_us = us;
          best = s;
        }
      }
      add_row(table, R, C, best, best_us, heur_splits, heur_us);
    }
  }
  return write_table(table, a.out);
}
#endif  // MXSERVE_HAVE_CUDA

}  // namespace

int cmd_tune_attention(int argc, char** argv) {
  auto args = Args::parse(argc, argv,
                          {"--heads", "--kv-heads", "--head-dim", "--kv-cache-dtype", "--rows", "--contexts",
                           "--max-rows", "--max-context", "--pool-gib", "--out"},
                          {"--mla"});
  if (!args.is_ok()) {
    std::fprintf(stderr, "error: %s\n", args.status().to_string().c_str());
    return 2;
  }
  TuneArgs a;
  for (auto [flag, dst, fallback] : {std::tuple{"--heads", &a.key.n_heads, 96}, {"--kv-heads", &a.key.n_kv_heads, 8},
                                     {"--head-dim", &a.key.head_dim, 128}}) {
    auto v = args->get_int(flag, fallback);
    if (!v.is_ok() || *v <= 0 || *v > 4096) {
      std::fprintf(stderr, "error: %s must be a positive integer <= 4096\n", flag);
      return 2;
    }
    *dst = static_cast<int32_t>(*v);
  }
  if (!args->has("--mla") && a.key.n_heads % a.key.n_kv_heads != 0) {
    std::fprintf(stderr, "error: --heads %d is not a multiple of --kv-heads %d\n", a.key.n_heads, a.key.n_kv_heads);
    return 2;
  }
  a.key.kv_dtype = args->get_or("--kv-cache-dtype", "bf16");
  a.mla = args->has("--mla");
  if (a.mla) {  // the latent cache: one "kv head" of 576 values (kv_lora_rank 512 + rope 64), bf16
    if (a.key.n_heads > 64 || args->has("--kv-heads") || args->has("--head-dim") || a.key.kv_dtype != "bf16") {
      std::fprintf(stderr, "error: --mla takes --heads <= 64 (per rank) and no --kv-heads / --head-dim; the latent "
                           "cache is bf16 (576 values a token)\n");
      return 2;
    }
    a.key.n_kv_heads = 1;
    a.key.head_dim = 576;
  }
  if (a.key.kv_dtype != "bf16" && a.key.kv_dtype != "fp8_e4m3") {
    std::fprintf(stderr, "error: --kv-cache-dtype %s: expected bf16 or fp8_e4m3\n", a.key.kv_dtype.c_str());
    return 2;
  }
  auto rows = int_list(*args, "--rows", a.rows);
  auto contexts = int_list(*args, "--contexts", a.contexts);
  auto max_rows = args->get_int("--max-rows", 0), max_ctx = args->get_int("--max-context", 0);
  auto pool = args->get_double("--pool-gib", a.pool_gib);
  for (const Status& st : {rows.status(), contexts.status(), max_rows.status(), max_ctx.status(), pool.status()})
    if (!st.is_ok()) {
      std::fprintf(stderr, "error: %s\n", st.to_string().c_str());
      return 2;
    }
  a.rows = *rows;
  a.contexts = *contexts;
  if (*max_rows > 0) std::erase_if(a.rows, [&](int64_t r) { return r > *max_rows; });
  if (*max_ctx > 0) std::erase_if(a.contexts, [&](int64_t c) { return c > *max_ctx; });
  if (a.rows.empty() || a.contexts.empty() || a.rows.back() > 4096 || a.contexts.back() > (1 << 20) ||
      !(*pool > 0)) {
    std::fprintf(stderr, "error: the grid needs rows in [1, 4096], contexts in [1, 2^20] and --pool-gib > 0\n");
    return 2;
  }
  a.pool_gib = *pool;
  auto out = args->get("--out");
  if (!out.is_ok()) {
    std::fprintf(stderr, "error: --out FILE is required (e.g. configs/attention/%s)\n",
                 kern::attention_tuning_file_name({"NVIDIA H200", a.key.kv_dtype, a.key.n_heads, a.key.n_kv_heads,
                                                   a.key.head_dim})
                     .c_str());
    return 2;
  }
  a.out = *out;
  a.command = "mxserve tune-attention";
  for (int i = 1; i < argc; ++i) a.command += std::string(" ") + argv[i];
#ifdef MXSERVE_HAVE_CUDA
  auto be = backend::make_backend("cuda");
  if (!be.is_ok()) {
    std::fprintf(stderr, "error: tune-attention needs a CUDA device: %s\n", be.status().to_string().c_str());
    return 2;
  }
  return a.mla ? tune_mla(**be, a) : tune(**be, a);
#else
  std::fprintf(stderr, "error: tune-attention needs the CUDA backend; this mxserve was built without CUDA\n");
  return 2;
#endif
}

}  // namespace mxserve::cli
