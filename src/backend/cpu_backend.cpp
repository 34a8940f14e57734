// The CPU backend: fp32 activations and weights, every op a call into kernels/cpu (the reference).
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/device_memory.h"
#include "backend/mla_dsa_ops.h"
#include "kernels/mla_fp8.h"
#ifdef MXSERVE_HAVE_CUDA
#include "backend/cuda_backend.h"
#endif
#include "core/check.h"
#include "core/device_oom.h"
#include "core/numeric.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/sampling.h"

namespace mxserve::backend {
namespace {

namespace k = kernels::cpu;

float* f32(Tensor& t) {
  MX_CHECK_MSG(t.dtype() == DType::kF32, "expected f32, got " << t.describe());
  return t.data<float>();
}
const float* f32(const Tensor& t) {
  MX_CHECK_MSG(t.dtype() == DType::kF32, "expected f32, got " << t.describe());
  return t.data<float>();
}
const int32_t* i32(const Tensor& t) {
  MX_CHECK_MSG(t.dtype() == DType::kI32, "expected i32, got " << t.describe());
  return t.data<int32_t>();
}

// An FP8 cache op needs u8/e4m3 caches of the params' width and both scale pointers.
void expect_fp8_cache(const Tensor& k_cache, const Tensor& v_cache, const kernels::AttentionParams& p, const char* op) {
  for (const Tensor* t : {&k_cache, &v_cache})
    MX_CHECK_MSG(t->dtype() == DType::kFP8E4M3 && t->dim(1) == static_cast<int64_t>(p.n_kv_heads) * p.head_dim,
                 op << ": FP8 KV scales given but the cache is " << t->describe());
  MX_CHECK_MSG(p.v_scales != nullptr, op << ": FP8 KV cache with k_scales but no v_scales");
}

class CpuBackend final : public Backend, public MlaDsaOps {
 public:
  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::cpu(); }
  DType activation_dtype() const override { return DType::kF32; }
  DType weight_dtype() const override { return DType::kF32; }

  Tensor alloc(DType dtype, Shape shape) override {
    if (alloc_fault::g_remaining.load(std::memory_order_relaxed) > 0) {  // tests only (core/device_oom.h)
      const uint64_t bytes = dtype_bytes(dtype, static_cast<uint64_t>(shape_numel(shape))).value_or(0);
      if (alloc_fault::take(bytes))
        throw DeviceOutOfMemory("cpu backend: allocation of " + std::to_string(bytes) + " bytes for " +
                                    shape_to_string(shape) + " failed (injected by the test hook)",
                                bytes);
    }
    return Tensor::empty(dtype, std::move(shape));
  }

  void copy_weight(const Tensor& host, Tensor& dst) override {
    MX_CHECK_MSG(host.numel() == dst.numel(), host.describe() << " into " << dst.describe());
    MX_CHECK(dst.dtype() == DType::kF32);
    float* out = dst.data<float>();
    const int64_t n = host.numel();
    switch (host.dtype()) {
      case DType::kF32: std::memcpy(out, host.raw(), sizeof(float) * n); break;
      case DType::kBF16: {
        const auto* src = static_cast<const uint8_t*>(host.raw());
        for (int64_t i = 0; i < n; ++i) {
          uint16_t v;
          std::memcpy(&v, src + 2 * i, 2);  // mmap offsets need not be aligned
          out[i] = bf16_to_f32(v);
        }
        break;
      }
      case DType::kF16: {
        const auto* src = static_cast<const uint8_t*>(host.raw());
        for (int64_t i = 0; i < n; ++i) {
          uint16_t v;
          std::memcpy(&v, src + 2 * i, 2);
          out[i] = f16_to_f32(v);
        }
        break;
      }
      default: MX_CHECK_MSG(false, "copy_weight: unsupported source " << host.describe());
    }
  }

  Tensor upload(const Tensor& host) override {
    Tensor t = Tensor::empty(host.dtype(), host.shape());
    std::memcpy(t.raw(), host.raw(), host.nbytes());
    return t;
  }
  Tensor to_host(const Tensor& t) override { return upload(t); }

  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override {
    k::embedding_f32(table.raw(), table.dtype() == DType::kBF16, i32(ids), f32(out), ids.numel(), table.dim(1));
  }
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override {
    const int64_t cols = w.numel();
    k::rmsnorm_f32(f32(x), f32(w), f32(out), x.numel() / cols, cols, eps);
  }
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override {
    const int64_t kdim = w.dim(1), n = w.dim(0);
    MX_CHECK_EQ(x.numel() % kdim, 0);
    k::linear_f32(f32(x), f32(w), bias ? f32(*bias) : nullptr, f32(out), x.numel() / kdim, n, kdim);
  }
  void rope(Tensor& x, const Tensor& positions, const kernels::RopeParams& p) override {
    k::rope_neox_f32(f32(x), i32(positions), positions.numel(), p);
  }
  void silu_mul(const Tensor& gate_up, Tensor& out) override {
    const int64_t inter = out.dim(-1);
    k::silu_mul_f32(f32(gate_up), f32(out), out.numel() / inter, inter);
  }
  void add(Tensor& x, const Tensor& y) override {
    float* a = f32(x);
    const float* b = f32(y);
    for (int64_t i = 0; i < x.numel(); ++i) a[i] += b[i];
  }
  void add_rmsnorm(const Tensor& x, Tensor& residual, const Tensor& w, float eps, Tensor& out) override {
    const int64_t cols = w.numel();
    MX_CHECK_MSG(x.numel() == residual.numel() && out.numel() == x.numel() && cols > 0 && x.numel() % cols == 0,
                 "cpu add_rmsnorm: x " << x.describe() << ", residual " << residual.describe() << ", w "
                                       << w.describe() << ", out " << out.describe());
    k::add_rmsnorm_f32(f32(x), f32(residual), f32(w), f32(out), x.numel() / cols, cols, eps);
  }
  void write_from_host(Tensor& dst, int64_t offset, const Tensor& host) override {
    MX_CHECK_MSG(host.dtype() == dst.dtype() && host.is_contiguous() && dst.is_contiguous() && offset >= 0 &&
                     offset + host.numel() <= dst.numel(),
                 "cpu write_from_host: " << host.describe() << " at " << offset << " into " << dst.describe());
    if (host.numel() > 0)
      std::memcpy(static_cast<char*>(dst.raw()) + offset * (host.nbytes() / host.numel()), host.raw(), host.nbytes());
  }
  void kv_write(const Tensor& kt, const Tensor& vt, const AttentionMeta& meta, Tensor& k_cache,
                Tensor& v_cache) override {
    const auto& p = meta.params;
    const int64_t width = static_cast<int64_t>(p.n_kv_heads) * p.head_dim;
    if (p.fp8_kv()) {
      expect_fp8_cache(k_cache, v_cache, p, "kv_write");
      k::kv_write_fp8(f32(kt), f32(vt), i32(meta.slot_mapping), k_cache.data<uint8_t>(), v_cache.data<uint8_t>(),
                      p.k_scales, p.v_scales, kt.numel() / width, p.n_kv_heads, p.head_dim);
      return;
    }
    k::kv_write_f32(f32(kt), f32(vt), i32(meta.slot_mapping), f32(k_cache), f32(v_cache), kt.numel() / width, width);
  }
  // Tensors are paired in layout order (two of one shape and dtype per call, e.g. K and V, or their
  // scales); one without a partner goes alone. Rows are copied as bytes, so every dtype works.
  void kv_copy(const Tensor& src_slots, const Tensor& dst_slots, const std::vector<Tensor*>& caches) override {
    MX_CHECK_EQ(src_slots.numel(), dst_slots.numel());
    for (size_t c = 0; c < caches.size();) {
      Tensor& a = *caches[c];
      const bool pair = c + 1 < caches.size() && caches[c + 1]->dim(1) == a.dim(1) &&
                        caches[c + 1]->dim(0) == a.dim(0) && caches[c + 1]->dtype() == a.dtype();
      Tensor& b = pair ? *caches[c + 1] : a;
      const int64_t n_slots = a.dim(0);
      for (int64_t i = 0; i < src_slots.numel(); ++i)
        MX_CHECK_MSG(i32(src_slots)[i] >= 0 && i32(src_slots)[i] < n_slots && i32(dst_slots)[i] >= 0 &&
                         i32(dst_slots)[i] < n_slots,
                     "kv_copy: slot pair " << i << " out of range");
      k::kv_copy_rows(i32(src_slots), i32(dst_slots), src_slots.numel(), static_cast<uint8_t*>(a.raw()),
                      static_cast<uint8_t*>(b.raw()), static_cast<int64_t>(a.nbytes()) / n_slots);
      c += pair ? 2 : 1;
    }
  }
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionMeta& meta,
                 Tensor& out) override {
    const auto& p = meta.params;
    if (p.fp8_kv()) {
      expect_fp8_cache(k_cache, v_cache, p, "attention");
      k::paged_attention_f32(f32(q), k_cache.raw(), v_cache.raw(), i32(meta.token_seq), i32(meta.kv_index),
                             i32(meta.block_tables), f32(out), p);
      return;
    }
    k::paged_attention_f32(f32(q), f32(k_cache), f32(v_cache), i32(meta.token_seq), i32(meta.kv_index),
                           i32(meta.block_tables), f32(out), p);
  }
  void router(const Tensor& x, const Tensor& gate_w, const Tensor& bias, const kernels::RouterParams& p,
              Tensor& topk_ids, Tensor& topk_weights) override {
    const int64_t n_tokens = x.dim(0);
    Tensor logits = Tensor::empty(DType::kF32, {n_tokens, p.n_experts});
    k::linear_f32(f32(x), f32(gate_w), nullptr, f32(logits), n_tokens, p.n_experts, x.dim(1));
    k::moe_router_f32(f32(logits), f32(bias), topk_ids.data<int32_t>(), f32(topk_weights), n_tokens, p);
  }
  void moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights, const ExpertWeights& ex,
                   Tensor& out) override {
    MX_CHECK_MSG(ex.format == ExpertFormat::kFloat,
                 "cpu moe_experts: experts stored as " << expert_format_name(ex.format) << " (the loader dequantizes for cpu)");
    const int64_t n_tokens = x.dim(0), d = x.dim(1), top_k = topk_ids.dim(1);
    const int64_t n_experts = ex.gate_up.dim(0), inter = ex.down.dim(2);
    // Group (token, slot) pairs by local expert: plain gather -> GEMM -> SwiGLU -> GEMM -> weighted scatter.
    // Expert parallel: ids of other ranks' experts are skipped (their ranks add them).
    const int64_t global = ex.global_experts > 0 ? ex.global_experts : n_experts;
    std::vector<std::vector<int64_t>> rows(n_experts);
    const int32_t* ids = i32(topk_ids);
    for (int64_t i = 0; i < n_tokens * top_k; ++i) {
      MX_CHECK(ids[i] >= 0 && ids[i] < global);
      const int64_t local = ids[i] - ex.first_expert;
      if (local >= 0 && local < n_experts) rows[local].push_back(i);
    }
    const float* xs = f32(x);
    const float* w = f32(topk_weights);
    float* o = f32(out);
    std::vector<float> xin, gate_up, act, y;
    for (int64_t e = 0; e < n_experts; ++e) {
      const int64_t m = static_cast<int64_t>(rows[e].size());
      if (m == 0) continue;
      xin.resize(m * d);
      for (int64_t r = 0; r < m; ++r) std::memcpy(&xin[r * d], xs + (rows[e][r] / top_k) * d, sizeof(float) * d);
      gate_up.resize(m * 2 * inter);
      act.resize(m * inter);
      y.resize(m * d);
      k::linear_f32(xin.data(), f32(ex.gate_up) + e * 2 * inter * d, nullptr, gate_up.data(), m, 2 * inter, d);
      k::silu_mul_f32(gate_up.data(), act.data(), m, inter);
      k::linear_f32(act.data(), f32(ex.down) + e * d * inter, nullptr, y.data(), m, d, inter);
      for (int64_t r = 0; r < m; ++r) {
        const int64_t t = rows[e][r] / top_k;
        const float wt = w[rows[e][r]];
        for (int64_t c = 0; c < d; ++c) o[t * d + c] += wt * y[r * d + c];
      }
    }
  }
  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override {  // any dtype (f32 rows, i32 top-k)
    MX_CHECK_MSG(x.dtype() == out.dtype() && x.is_contiguous() && out.is_contiguous(),
                 "cpu gather_rows: " << x.describe() << " -> " << out.describe());
    const int64_t row_bytes = static_cast<int64_t>(x.nbytes()) / x.dim(0);
    MX_CHECK_EQ(static_cast<int64_t>(out.nbytes()), row_bytes * rows.numel());
    const int32_t* r = i32(rows);
    const auto* src = static_cast<const uint8_t*>(x.raw());
    auto* dst = static_cast<uint8_t*>(out.raw());
    for (int64_t i = 0; i < rows.numel(); ++i)
      std::memcpy(dst + i * row_bytes, src + static_cast<int64_t>(r[i]) * row_bytes, row_bytes);
  }
  void argmax_rows(const Tensor& logits, Tensor& out) override {
    const int64_t V = logits.dim(1);
    MX_CHECK_EQ(out.numel(), logits.dim(0));
    for (int64_t r = 0; r < logits.dim(0); ++r) {
      const float* row = f32(logits) + r * V;
      out.data<int32_t>()[r] = static_cast<int32_t>(std::max_element(row, row + V) - row);
    }
  }
  std::vector<kernels::SampledRow> sample_rows(const Tensor& logits, const kernels::SampleRowsInput& in) override {
    MX_CHECK_MSG(logits.ndim() == 2, "cpu sample_rows: logits " << logits.describe() << " are not [R, V]");
    return k::sample_rows_f32(f32(logits), logits.dim(0), logits.dim(1), in);
  }
  void fill_synthetic(const kernels::SyntheticFill& p, Tensor& dst, Tensor* scales) override {
    MX_CHECK_MSG(dst.is_contiguous(), "cpu fill_synthetic: dst " << dst.describe() << " is not contiguous");
    if (p.kind == kernels::SyntheticKind::kMxfp4) {
      MX_CHECK_MSG(dst.dtype() == DType::kU8 && dst.numel() == p.rows * p.cols / 2 && scales &&
                       scales->dtype() == DType::kU8 && scales->numel() == p.rows * p.cols / 32,
                   "cpu fill_synthetic mxfp4: dst " << dst.describe() << ", scales "
                                                    << (scales ? scales->describe() : "none") << " for [" << p.rows
                                                    << ", " << p.cols << "]");
      kernels::cpu::synthetic_fill(p, dst.raw(), false, scales->data<uint8_t>());
      return;
    }
    MX_CHECK_MSG((dst.dtype() == DType::kF32 || dst.dtype() == DType::kBF16) && dst.numel() == p.rows * p.cols,
                 "cpu fill_synthetic: dst " << dst.describe() << " for [" << p.rows << ", " << p.cols << "]");
    kernels::cpu::synthetic_fill(p, dst.raw(), dst.dtype() == DType::kBF16, nullptr);
  }

  // ---- MlaDsaOps (backend/mla_dsa_ops.h; kernels/cpu/mla_dsa.cpp) ----
  void layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& out) override {
    const int64_t cols = x.dim(x.ndim() - 1);
    MX_CHECK_MSG(w.numel() == cols && b.numel() == cols && out.numel() == x.numel(),
                 "cpu layernorm: x " << x.describe() << ", w " << w.describe() << ", b " << b.describe());
    k::layernorm_f32(f32(x), f32(w), f32(b), f32(out), x.numel() / cols, cols, eps);
  }
  void rope_interleaved(Tensor& x, const Tensor& positions, const kernels::InterleavedRopeParams& p) override {
    MX_CHECK_MSG(x.numel() == positions.numel() * p.n_heads * p.head_stride && p.rotary_dim % 2 == 0 &&
                     p.rot_offset + p.rotary_dim <= p.head_stride,
                 "cpu rope_interleaved: x " << x.describe() << " for " << positions.numel() << " tokens x "
                                            << p.n_heads << " heads x " << p.head_stride);
    k::rope_interleaved_f32(f32(x), i32(positions), positions.numel(), p);
  }
  void copy_columns(const Tensor& x, int64_t begin, int64_t end, Tensor& out) override {
    const int64_t rows = x.dim(0), cols = x.numel() / rows;
    MX_CHECK_MSG(0 <= begin && begin <= end && end <= cols && out.numel() == rows * (end - begin),
                 "cpu copy_columns: x " << x.describe() << " [" << begin << ", " << end << ") into " << out.describe());
    k::copy_columns_f32(f32(x), f32(out), rows, cols, begin, end);
  }
  void cache_write(const Tensor& rows, const AttentionMeta& meta, Tensor& cache, int64_t col_offset) override {
    const int64_t n = meta.slot_mapping.numel(), width = rows.numel() / std::max<int64_t>(n, 1);
    MX_CHECK_MSG(rows.numel() == n * width && col_offset + width <= cache.dim(1),
                 "cpu cache_write: rows " << rows.describe() << " at column " << col_offset << " of "
                                          << cache.describe());
    if (cache.dtype() == DType::kU8) {  // packed FP8 rows (kernels/mla_fp8.h): codes + scales, or the bf16 tail
      const int64_t quant = col_offset > 0 ? col_offset : width, tail = col_offset > 0 ? width : 0;
      MX_CHECK_MSG(cache.ndim() == 2 && kernels::mla_fp8_tail_offset(quant) + 2 * tail <= cache.dim(1),
                   "cpu cache_write: rows " << rows.describe() << " at column " << col_offset
                                            << " do not fit the packed FP8 rows of " << cache.describe());
      k::cache_write_fp8_packed(f32(rows), i32(meta.slot_mapping), static_cast<uint8_t*>(cache.raw()), n, width,
                                cache.dim(1), col_offset);
      return;
    }
    k::cache_write_f32(f32(rows), i32(meta.slot_mapping), f32(cache), n, width, cache.dim(1), col_offset);
  }
  void indexer_topk(const Tensor& q, const Tensor& weights, const Tensor& key_cache, const AttentionMeta& meta,
                    const kernels::IndexerParams& p_in, Tensor& topk) override {
    const int64_t T = meta.params.n_tokens;
    kernels::IndexerParams p = p_in;
    p.fp8_keys = key_cache.dtype() == DType::kU8;  // packed FP8 rows (kernels/mla_fp8.h)
    const int64_t key_width = p.fp8_keys ? kernels::mla_fp8_row_bytes(p.head_dim, 0) : p.head_dim;
    MX_CHECK_MSG(q.numel() == T * p.n_heads * p.head_dim && weights.numel() == T * p.n_heads &&
                     key_cache.dim(1) == key_width && topk.dtype() == DType::kI32 && topk.numel() == T * p.top_k,
                 "cpu indexer_topk: q " << q.describe() << ", weights " << weights.describe() << ", keys "
                                        << key_cache.describe() << ", topk " << topk.describe());
    k::indexer_topk_f32(f32(q), f32(weights), p.fp8_keys ? key_cache.raw() : f32(key_cache), i32(meta.token_seq), i32(meta.kv_index),
                        i32(meta.block_tables), topk.data<int32_t>(), p, meta.params);
  }
  void mla_attention(const Tensor& q, const Tensor& latent_cache, const Tensor& kv_b, const Tensor* topk,
                     const AttentionMeta& meta, const kernels::MlaParams& p_in, Tensor& out) override {
    const int64_t T = meta.params.n_tokens;
    kernels::MlaParams p = p_in;
    p.fp8_cache = latent_cache.dtype() == DType::kU8;  // packed FP8 rows (kernels/mla_fp8.h)
    const int64_t row_width = p.fp8_cache ? kernels::mla_fp8_row_bytes(p.kv_lora_rank, p.qk_rope_dim)
                                          : p.kv_lora_rank + p.qk_rope_dim;
    MX_CHECK_MSG(q.numel() == T * p.n_heads * (p.qk_nope_dim + p.qk_rope_dim) &&
                     latent_cache.dim(1) == row_width &&
                     kv_b.numel() == static_cast<int64_t>(p.n_heads) * (p.qk_nope_dim + p.v_dim) * p.kv_lora_rank &&
                     out.numel() == T * p.n_heads * p.v_dim && (topk == nullptr || topk->dim(0) == T),
                 "cpu mla_attention: q " << q.describe() << ", cache " << latent_cache.describe() << ", kv_b "
                                         << kv_b.describe() << ", out " << out.describe());
    k::mla_attention_f32(f32(q), p.fp8_cache ? latent_cache.raw() : f32(latent_cache), f32(kv_b), topk ? i32(*topk) : nullptr, topk ? topk->dim(1) : 0,
                         i32(meta.token_seq), i32(meta.kv_index), i32(meta.block_tables), f32(out), p, meta.params);
  }
};

}  // namespace

void Backend::write_from_host(Tensor&, int64_t, const Tensor&) {
  MX_CHECK_MSG(false, "backend " << name() << " has no write_from_host (needed by the device block-table store)");
}

void Backend::kv_copy(const Tensor&, const Tensor&, const std::vector<Tensor*>&) {
  MX_CHECK_MSG(false, "backend " << name() << " has no kv_copy (needed by tree speculation's KV compaction)");
}

std::vector<kernels::SampledRow> Backend::sample_rows(const Tensor&, const kernels::SampleRowsInput&) {
  MX_CHECK_MSG(false, "backend " << name() << " has no sample_rows (device-side sampling)");
  return {};
}

const char* expert_format_name(ExpertFormat f) {
  switch (f) {
    case ExpertFormat::kFloat: return "float";
    case ExpertFormat::kMxfp4: return "mxfp4";
  }
  return "?";
}

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

Result<std::unique_ptr<Backend>> make_backend(const std::string& name, const BackendOptions& options) {
  if (name == "cpu") {
    auto be = make_cpu_backend();
    MX_RETURN_IF_ERROR(be->set_kernel_options(options.kernels));
    return be;
  }
  if (name == "cuda") {
#ifdef MXSERVE_HAVE_CUDA
    return make_cuda_backend(options);
#else
    return unsupported("--backend cuda: this build has no CUDA backend (configure with nvcc present, "
                       "-DMXSERVE_CUDA=ON)");
#endif
  }
  return invalid_argument("--backend '" + name + "': expected cpu or cuda");
}

DeviceMemory device_memory(Backend& be) {
#ifdef MXSERVE_HAVE_CUDA
  if (be.device().type == DeviceType::kCUDA) return cuda_backend_memory(be, false);
#endif
  (void)be;
  return {};
}

void reset_memory_peak(Backend& be) {
#ifdef MXSERVE_HAVE_CUDA
  if (be.device().type == DeviceType::kCUDA) (void)cuda_backend_memory(be, true);
#endif
  (void)be;
}

MemoryInterval take_memory_interval(Backend& be) {
#ifdef MXSERVE_HAVE_CUDA
  if (be.device().type == DeviceType::kCUDA) return cuda_backend_memory_interval(be);
#endif
  (void)be;
  return {};
}

}  // namespace mxserve::backend
