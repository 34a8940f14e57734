// CudaMlaDsaOps: entry checks and launches of the MLA / DSA ops on CUDA (see cuda_mla_dsa_ops.h). Each op
// refuses, naming itself and the tensors, anything the kernels do not implement (a non-bf16 tensor, a
// latent rank above kMlaMaxLatent, an indexer shape whose score tile exceeds 48 KiB of shared memory) --
// no fallback to another backend. A u8 latent / indexer-key cache holds packed FP8 rows
// (--kv-cache-dtype fp8_e4m3, kernels/mla_fp8.h): the ops set MlaParams::fp8_cache / IndexerParams::fp8_keys.
#include "backend/cuda_mla_dsa_ops.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/check.h"
#include "kernels/attention_tuning.h"
#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/attention/mla_key_write.h"
#include "kernels/mla_fp8.h"
#include "core/logging.h"  // MX_WARN_ONCE (the FP8 kernel choice)

namespace mxserve::backend {
namespace {

namespace kc = kernels::cuda;

void expect(const Tensor& t, DType dt, const char* op, const char* what) {
  MX_CHECK_MSG(t.dtype() == dt, "cuda " << op << ": " << what << " is " << t.describe() << ", expected "
                                        << dtype_name(dt) << " (not implemented on the CUDA backend)");
  MX_CHECK_MSG(t.device().type == DeviceType::kCUDA || t.numel() == 0,
               "cuda " << op << ": " << what << " is on " << t.device().to_string());
  MX_CHECK_MSG(t.is_contiguous(), "cuda " << op << ": " << what << " is not contiguous");
}

void expect_meta(const AttentionMeta& meta, const char* op) {
  for (const Tensor* t : {&meta.token_seq, &meta.kv_index, &meta.block_tables})
    expect(*t, DType::kI32, op, "attention metadata");
  MX_CHECK_MSG(meta.token_seq.numel() == meta.params.n_tokens && meta.kv_index.numel() == meta.params.n_tokens,
               "cuda " << op << ": metadata for " << meta.params.n_tokens << " tokens has token_seq "
                       << meta.token_seq.describe() << ", kv_index " << meta.kv_index.describe());
  if (meta.params.tree_mask != nullptr) {
    expect(meta.tree_mask, DType::kI64, op, "tree_mask");
    expect(meta.tree_base, DType::kI32, op, "tree_base");
  }
}

// Bound on every token's kv_index + 1 (AttentionParams::max_kv_len, else the block table's capacity).
int64_t max_context(const kernels::AttentionParams& ap) {
  return ap.max_kv_len > 0 ? ap.max_kv_len : static_cast<int64_t>(ap.max_blocks_per_seq) * ap.block_size;
}

// The tuned split table of the Hopper MLA attend kernel (MlaAttendKernel::kWgmma) for the current GPU and this
// head count -- key (gpu, bf16, n_heads, 1 kv head, kv_lora + rope), written by `mxserve tune-attention --mla` --
// or null (the kernel's heuristic). Looked up once per (device, heads, width).
const kernels::AttentionSplitTable* mla_split_table(const kernels::MlaParams& p) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int>, const kernels::AttentionSplitTable*> cache;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return nullptr;
  const auto key = std::make_tuple(dev, p.n_heads, p.kv_lora_rank + p.qk_rope_dim);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  cudaDeviceProp prop{};
  const kernels::AttentionSplitTable* t = nullptr;
  if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
    t = kernels::find_attention_split_table({prop.name, "bf16", p.n_heads, 1, p.kv_lora_rank + p.qk_rope_dim});
  cache.emplace(key, t);
  return t;
}

}  // namespace

void CudaMlaDsaOps::layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& out) {
  expect(x, DType::kBF16, "layernorm", "x");
  expect(w, DType::kBF16, "layernorm", "w");
  expect(b, DType::kBF16, "layernorm", "b");
  expect(out, DType::kBF16, "layernorm", "out");
  const int64_t cols = x.dim(x.ndim() - 1);
  MX_CHECK_MSG(w.numel() == cols && b.numel() == cols && out.numel() == x.numel(),
               "cuda layernorm: x " << x.describe() << ", w " << w.describe() << ", b " << b.describe() << ", out "
                                    << out.describe());
  kc::layernorm_bf16(x.raw(), w.raw(), b.raw(), out.raw(), x.numel() / cols, cols, eps, mla_stream_);
}

void CudaMlaDsaOps::rope_interleaved(Tensor& x, const Tensor& positions, const kernels::InterleavedRopeParams& p) {
  expect(x, DType::kBF16, "rope_interleaved", "x");
  expect(positions, DType::kI32, "rope_interleaved", "positions");
  MX_CHECK_MSG(x.numel() == positions.numel() * p.n_heads * p.head_stride && p.rotary_dim % 2 == 0 &&
                   p.rot_offset >= 0 && p.rot_offset + p.rotary_dim <= p.head_stride,
               "cuda rope_interleaved: x " << x.describe() << " for " << positions.numel() << " tokens x " << p.n_heads
                                           << " heads x " << p.head_stride << ", rotary dims [" << p.rot_offset
                                           << ", +" << p.rotary_dim << ")");
  kc::rope_interleaved_bf16(x.raw(), positions.data<int32_t>(), positions.numel(), p, mla_stream_);
}

namespace {
bool fused_key_write() {
  static const bool on = [] {
    const char* v = std::getenv("MXSERVE_FUSED_KEY_WRITE");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}
}  // namespace

bool CudaMlaDsaOps::try_latent_cache_write(const Tensor& kv, int64_t col0, const Tensor& norm_w, float eps,
                                           const Tensor& positions, const kernels::InterleavedRopeParams& p,
                                           const AttentionMeta& meta, Tensor& cache) {
  const int64_t T = positions.numel(), L = norm_w.numel(), R = p.head_stride;
  const int64_t N = T > 0 && kv.ndim() == 2 ? kv.dim(1) : 0;
  const bool fits = fused_key_write() && cache.dtype() == DType::kBF16 && kv.dtype() == DType::kBF16 &&
                    kv.is_contiguous() && norm_w.dtype() == DType::kBF16 && positions.dtype() == DType::kI32 &&
                    meta.slot_mapping.dtype() == DType::kI32 && meta.slot_mapping.numel() == T && T > 0 &&
                    kv.dim(0) == T && col0 >= 0 && col0 % 8 == 0 && N % 8 == 0 && col0 + L + R <= N &&
                    L % 8 == 0 && L <= kc::latent_cache_write_max_latent() && cache.ndim() == 2 &&
                    cache.dim(1) == L + R && p.n_heads == 1 && p.rot_offset == 0 && p.rotary_dim == R && R % 2 == 0 &&
                    R / 2 <= 256;
  if (!fits) return false;
  kc::latent_cache_write_bf16(kv.raw(), N, col0, norm_w.raw(), L, eps, positions.data<int32_t>(), p,
                              meta.slot_mapping.data<int32_t>(), cache.raw(), T, mla_stream_);
  return true;
}

void CudaMlaDsaOps::norm_rope_cache_write(Tensor& k, const Tensor& w, const Tensor& b, float eps,
                                          const Tensor& positions, const kernels::InterleavedRopeParams& p,
                                          const AttentionMeta& meta, Tensor& cache) {
  const bool fused = fused_key_write();
  const int64_t T = positions.numel(), C = w.numel();
  const bool fits = fused && cache.dtype() == DType::kBF16 && k.dtype() == DType::kBF16 &&
                    w.dtype() == DType::kBF16 && b.dtype() == DType::kBF16 && positions.dtype() == DType::kI32 &&
                    meta.slot_mapping.dtype() == DType::kI32 && meta.slot_mapping.numel() == T &&
                    k.numel() == T * C && b.numel() == C && cache.ndim() == 2 && cache.dim(1) == C && p.n_heads == 1 &&
                    p.head_stride == C && p.rot_offset % 2 == 0 && p.rotary_dim % 2 == 0 && p.rot_offset >= 0 &&
                    p.rot_offset + p.rotary_dim <= C;
  if (!fits) return MlaDsaOps::norm_rope_cache_write(k, w, b, eps, positions, p, meta, cache);
  kc::norm_rope_cache_write_bf16(k.raw(), w.raw(), b.raw(), eps, positions.data<int32_t>(), p,
                                 meta.slot_mapping.data<int32_t>(), cache.raw(), T, C, mla_stream_);
}

void CudaMlaDsaOps::copy_columns(const Tensor& x, int64_t begin, int64_t end, Tensor& out) {
  expect(x, DType::kBF16, "copy_columns", "x");
  expect(out, DType::kBF16, "copy_columns", "out");
  const int64_t rows = x.dim(0), cols = rows > 0 ? x.numel() / rows : 0;
  MX_CHECK_MSG(0 <= begin && begin <= end && end <= cols && out.numel() == rows * (end - begin),
               "cuda copy_columns: x " << x.describe() << " [" << begin << ", " << end << ") into " << out.describe());
  kc::copy_columns_bf16(x.raw(), out.raw(), rows, cols, begin, end, mla_stream_);
}

void CudaMlaDsaOps::cache_write(const Tensor& rows, const AttentionMeta& meta, Tensor& cache, int64_t col_offset) {
  expect(rows, DType::kBF16, "cache_write", "rows");
  expect(cache, cache.dtype() == DType::kU8 ? DType::kU8 : DType::kBF16, "cache_write", "cache");
  expect(meta.slot_mapping, DType::kI32, "cache_write", "slot_mapping");
  const int64_t n = meta.slot_mapping.numel(), width = rows.numel() / std::max<int64_t>(n, 1);
  if (cache.dtype() == DType::kU8) {  // packed FP8 rows: codes + scales (col_offset 0) or the bf16 tail
    const int64_t quant = col_offset > 0 ? col_offset : width, tail = col_offset > 0 ? width : 0;
    MX_CHECK_MSG(cache.ndim() == 2 && rows.numel() == n * width && kernels::mla_fp8_shape_ok(quant, tail) &&
                     kernels::mla_fp8_tail_offset(quant) + 2 * tail <= cache.dim(1) && cache.dim(1) % 4 == 0,
                 "cuda cache_write: rows " << rows.describe() << " at column " << col_offset
                                           << " do not fit the packed FP8 rows of " << cache.describe());
    kc::cache_write_fp8_packed_bf16(rows.raw(), meta.slot_mapping.data<int32_t>(), cache.raw(), n, width,
                                    cache.dim(1), col_offset, mla_stream_);
    return;
  }
  MX_CHECK_MSG(cache.ndim() == 2 && rows.numel() == n * width && col_offset >= 0 && col_offset + width <= cache.dim(1),
               "cuda cache_write: rows " << rows.describe() << " at column " << col_offset << " of "
                                         << cache.describe());
  kc::cache_write_columns_bf16(rows.raw(), meta.slot_mapping.data<int32_t>(), cache.raw(), n, width, cache.dim(1),
                               col_offset, mla_stream_);
}

namespace {

// FP8 caches name the kernels that read packed FP8 rows instead of kAuto where kAuto could pick a bf16-only
// kernel (the indexer's kMma / kSimple score kernels); the choice is logged once. Every MLA attend kernel reads
// FP8 rows (the Hopper wgmma attend, mla_decode_wgmma.cu, since session 8), so the attend runs kAuto: wgmma on
// sm_90, mma.sync elsewhere, SIMT outside the tensor-core shape (mla_attention_bf16 warns once then).
// kFp8AutoWgmma false: FP8 caches run the mma.sync attend as before session 8 (the switch back, should a GPU run
// refute the wgmma kernel's FP8 variant; test_cuda_mla_fp8 / bench_mla_fp8 are its oracle and benchmark).
constexpr bool kFp8AutoWgmma = true;
kc::MlaAttendKernel fp8_attend_kernel(const kernels::MlaParams& p) {
  if (!p.fp8_cache) return kc::MlaAttendKernel::kAuto;
  const char* why = kFp8AutoWgmma ? nullptr : "kFp8AutoWgmma is off (backend/cuda_mla_dsa_ops.cpp)";
  const bool wgmma = kFp8AutoWgmma && kc::kMlaAutoWgmma && kc::mla_attend_wgmma_supported(p, &why);
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) {
    MX_LOG(kInfo) << "mla_attention: FP8 latent cache (--kv-cache-dtype fp8_e4m3): the attend step runs the "
                  << (wgmma ? "Hopper wgmma kernel (FP8 rows dequantized per tile)"
                            : kc::mla_attend_mma_supported(p) ? "mma.sync tensor-core kernel"
                                                               : "SIMT kernel (slow: outside the tensor-core shape)")
                  << (wgmma || why == nullptr ? "" : std::string(" (wgmma: ") + why + ")");
  }
  if (!kFp8AutoWgmma) return kc::mla_attend_mma_supported(p) ? kc::MlaAttendKernel::kMma : kc::MlaAttendKernel::kSimple;
  return kc::MlaAttendKernel::kAuto;
}
kc::IndexerScoreKernel fp8_score_kernel(const kernels::IndexerParams& p, const void* q, const void* keys) {
  if (!p.fp8_keys) return kc::IndexerScoreKernel::kAuto;
  const bool mma = kc::dsa_indexer_mma_supported(p) && reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(keys) % 16 == 0;
  MX_WARN_ONCE << "indexer_topk: FP8 indexer keys (--kv-cache-dtype fp8_e4m3): scores run the "
               << (mma ? "mma.sync tensor-core score kernel" : "SIMT score kernel (slow: outside the tensor-core shape)")
               << " + radix select, the FP8 reader; other indexer paths read bf16 keys only";
  return mma ? kc::IndexerScoreKernel::kMma : kc::IndexerScoreKernel::kSimple;
}

}  // namespace

void CudaMlaDsaOps::indexer_topk(const Tensor& q, const Tensor& weights, const Tensor& key_cache,
                                 const AttentionMeta& meta, const kernels::IndexerParams& p_in, Tensor& topk) {
  kernels::IndexerParams p = p_in;
  p.fp8_keys = key_cache.dtype() == DType::kU8;  // packed FP8 rows (kernels/mla_fp8.h)
  const int64_t key_width = p.fp8_keys ? kernels::mla_fp8_row_bytes(p.head_dim, 0) : p.head_dim;
  expect(q, DType::kBF16, "indexer_topk", "q");
  expect(weights, DType::kBF16, "indexer_topk", "weights");
  expect(key_cache, p.fp8_keys ? DType::kU8 : DType::kBF16, "indexer_topk", "key_cache");
  expect(topk, DType::kI32, "indexer_topk", "topk");
  expect_meta(meta, "indexer_topk");
  const int64_t T = meta.params.n_tokens;
  MX_CHECK_MSG(q.numel() == T * p.n_heads * p.head_dim && weights.numel() == T * p.n_heads && key_cache.ndim() == 2 &&
                   key_cache.dim(1) == key_width && topk.numel() == T * p.top_k && p.top_k > 0,
               "cuda indexer_topk: q " << q.describe() << ", weights " << weights.describe() << ", keys "
                                       << key_cache.describe() << ", topk " << topk.describe() << " for " << T
                                       << " tokens, " << p.n_heads << " heads x " << p.head_dim << ", top_k "
                                       << p.top_k);
  const size_t smem = kc::dsa_indexer_smem_bytes(p);
  MX_CHECK_MSG(smem <= 48 * 1024, "cuda indexer_topk: " << p.n_heads << " index heads x head_dim " << p.head_dim
                                                        << " need " << smem
                                                        << " bytes of shared memory per score block (48 KiB "
                                                           "implemented)");
  if (T == 0) return;
  const int64_t max_ctx = max_context(meta.params);
  const size_t ws_bytes = kc::dsa_indexer_workspace_bytes(T, max_ctx);
  Tensor ws = mla_backend_->alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)});
  kc::dsa_indexer_topk(q.raw(), weights.raw(), key_cache.raw(), meta.token_seq.data<int32_t>(),
                       meta.kv_index.data<int32_t>(), meta.block_tables.data<int32_t>(), topk.data<int32_t>(), p,
                       meta.params, max_ctx, ws.raw(), ws_bytes, mla_stream_, fp8_score_kernel(p, q.raw(), key_cache.raw()));
}

void CudaMlaDsaOps::mla_attention(const Tensor& q, const Tensor& latent_cache, const Tensor& kv_b, const Tensor* topk,
                                  const AttentionMeta& meta, const kernels::MlaParams& p_in, Tensor& out) {
  kernels::MlaParams p = p_in;
  p.fp8_cache = latent_cache.dtype() == DType::kU8;  // packed FP8 rows (kernels/mla_fp8.h)
  const int64_t row_width = p.fp8_cache ? kernels::mla_fp8_row_bytes(p.kv_lora_rank, p.qk_rope_dim)
                                        : p.kv_lora_rank + p.qk_rope_dim;
  expect(q, DType::kBF16, "mla_attention", "q");
  expect(latent_cache, p.fp8_cache ? DType::kU8 : DType::kBF16, "mla_attention", "latent_cache");
  expect(kv_b, DType::kBF16, "mla_attention", "kv_b");
  expect(out, DType::kBF16, "mla_attention", "out");
  if (topk != nullptr) expect(*topk, DType::kI32, "mla_attention", "topk");
  expect_meta(meta, "mla_attention");
  const int64_t T = meta.params.n_tokens;
  MX_CHECK_MSG(q.numel() == T * p.n_heads * (p.qk_nope_dim + p.qk_rope_dim) && latent_cache.ndim() == 2 &&
                   latent_cache.dim(1) == row_width &&
                   kv_b.numel() == static_cast<int64_t>(p.n_heads) * (p.qk_nope_dim + p.v_dim) * p.kv_lora_rank &&
                   out.numel() == T * p.n_heads * p.v_dim &&
                   (topk == nullptr || (topk->ndim() == 2 && topk->dim(0) == T)),
               "cuda mla_attention: q " << q.describe() << ", cache " << latent_cache.describe() << ", kv_b "
                                        << kv_b.describe() << ", out " << out.describe() << ", topk "
                                        << (topk ? topk->describe() : std::string("none")));
  MX_CHECK_MSG(p.kv_lora_rank > 0 && p.kv_lora_rank <= kc::kMlaMaxLatent && p.qk_nope_dim <= 1024,
               "cuda mla_attention: kv_lora_rank " << p.kv_lora_rank << ", qk_nope_dim " << p.qk_nope_dim
                                                   << " (kv_lora_rank <= " << kc::kMlaMaxLatent
                                                   << " and qk_nope_dim <= 1024 implemented)");
  if (T == 0) return;
  const size_t ws_bytes = kc::mla_attention_workspace_bytes(T, p);
  Tensor ws = mla_backend_->alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)});
  // Packed FP8 rows: kAuto (every attend kernel reads them, fp8_attend_kernel logs which runs); no split table
  // (the tuned tables are keyed and measured for bf16 rows): the wgmma kernel plans its own splits.
  if (p.fp8_cache) {
    kc::mla_attention_bf16(q.raw(), latent_cache.raw(), kv_b.raw(), topk ? topk->data<int32_t>() : nullptr,
                           topk ? topk->dim(1) : 0, meta.token_seq.data<int32_t>(), meta.kv_index.data<int32_t>(),
                           meta.block_tables.data<int32_t>(), out.raw(), p, meta.params, ws.raw(), ws_bytes,
                           mla_stream_, fp8_attend_kernel(p));
    return;
  }
  kc::mla_attention_bf16(q.raw(), latent_cache.raw(), kv_b.raw(), topk ? topk->data<int32_t>() : nullptr,
                         topk ? topk->dim(1) : 0, meta.token_seq.data<int32_t>(), meta.kv_index.data<int32_t>(),
                         meta.block_tables.data<int32_t>(), out.raw(), p, meta.params, ws.raw(), ws_bytes,
                         mla_stream_, kc::MlaAttendKernel::kAuto, 0, mla_split_table(p));
}

}  // namespace mxserve::backend
