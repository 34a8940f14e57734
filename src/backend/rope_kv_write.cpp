// Backend::rope_kv_write's default (backend.h): the composed ops it must equal bit for bit -- the q, k, v columns of
// the QKV GEMM output copied out (views of its one row at T == 1, as the model used them before; above, the
// MlaDsaOps::copy_columns op the CPU and CUDA backends have, graph-safe; a gather for backends without it),
// rope(q), rope(k), kv_write.
// The CPU backend runs this; the CUDA backend runs it too unless its one fused kernel is on.
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/mla_dsa_ops.h"
#include "core/check.h"

namespace mxserve::backend {
namespace {

// Columns [begin, end) of y [1, N] as a [1, end - begin] view (contiguous y).
Tensor one_row_columns(const Tensor& y, int64_t begin, int64_t end) {
  return y.reshape({y.dim(1)}).slice_rows(begin, end).reshape({1, end - begin});
}

}  // namespace

Tensor Backend::rope_kv_write(Tensor& y, const Tensor& positions, const kernels::RopeParams& p,
                              const AttentionMeta& meta, Tensor& k_cache, Tensor& v_cache) {
  const int64_t hd = p.head_dim, hq = p.n_heads, hkv = meta.params.n_kv_heads;
  const int64_t nq = hq * hd, nkv = hkv * hd, T = y.ndim() == 2 ? y.dim(0) : -1;
  MX_CHECK_MSG(y.ndim() == 2 && y.dim(1) == nq + 2 * nkv && y.is_contiguous() && positions.numel() == T &&
                   meta.params.head_dim == p.head_dim,
               "backend " << name() << " rope_kv_write: y " << y.describe() << " for " << hq << " q heads, " << hkv
                          << " kv heads x " << hd << " (attention head_dim " << meta.params.head_dim << "), "
                          << positions.numel() << " positions");
  Tensor q, k, v;
  if (T == 1) {
    q = one_row_columns(y, 0, nq);
    k = one_row_columns(y, nq, nq + nkv);
    v = one_row_columns(y, nq + nkv, nq + 2 * nkv);
  } else if (MlaDsaOps* ops = mla_dsa_ops(*this)) {  // the CPU and CUDA backends: on the device, graph-safe
    q = alloc(y.dtype(), {T, nq});
    k = alloc(y.dtype(), {T, nkv});
    v = alloc(y.dtype(), {T, nkv});
    ops->copy_columns(y, 0, nq, q);
    ops->copy_columns(y, nq, nq + nkv, k);
    ops->copy_columns(y, nq + nkv, nq + 2 * nkv, v);
  } else {
    // A backend without the column op (test doubles): gather_rows over y as [T * (hq + 2 hkv), hd] head rows
    // with an uploaded index (part c's heads of token t are rows t * (hq + 2 hkv) + first_c + i); not inside
    // capture_graph.
    const int64_t heads = hq + 2 * hkv;
    const Tensor rows_of_y = y.reshape({T * heads, hd});
    auto part = [&](int64_t first, int64_t n) {
      Tensor idx = Tensor::empty(DType::kI32, {T * n});
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < n; ++i) idx.data<int32_t>()[t * n + i] = static_cast<int32_t>(t * heads + first + i);
      Tensor out = alloc(y.dtype(), {T * n, hd});
      gather_rows(rows_of_y, upload(idx), out);
      return out.reshape({T, n * hd});
    };
    q = part(0, hq);
    k = part(hq, hkv);
    v = part(hq + hkv, hkv);
  }
  rope(q, positions, p);
  kernels::RopeParams pk = p;
  pk.n_heads = static_cast<int32_t>(hkv);
  rope(k, positions, pk);
  kv_write(k, v, meta, k_cache, v_cache);
  return q;
}

}  // namespace mxserve::backend
