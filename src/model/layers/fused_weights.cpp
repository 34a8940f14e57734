// fuse_rows / row_columns_view (fused_weights.h): the concatenation runs once at load through the host
// (bf16 -> f32 -> bf16 is exact), so it works on any backend that can copy weights.
#include "model/layers/fused_weights.h"

#include <cstdlib>
#include <cstring>

namespace mxserve::model {

Tensor fuse_rows(backend::Backend& be, const std::vector<Tensor*>& parts, std::string* why) {
  if (parts.empty()) {
    *why = "nothing to fuse";
    return Tensor();
  }
  const int rank = parts[0]->ndim();
  const DType dt = parts[0]->dtype();
  const bool dtype_ok = dt == DType::kBF16 || (dt == DType::kF32 && fused_projections_forced());
  const int64_t K = rank == 2 ? parts[0]->dim(1) : 1;
  int64_t N = 0;
  for (const Tensor* t : parts) {
    if (!dtype_ok || t->dtype() != dt || t->ndim() != rank || (rank != 1 && rank != 2) || (rank == 2 && t->dim(1) != K) ||
        !t->is_contiguous()) {
      *why = "weight " + t->describe() + " does not fuse with " + parts[0]->describe() +
             " (contiguous bf16 weights of one width only; f32 with MXSERVE_FUSED_PROJ=force)";
      return Tensor();
    }
    N += t->dim(0);
  }
  Tensor host = Tensor::empty(DType::kF32, rank == 2 ? Shape{N, K} : Shape{N});
  int64_t row = 0;
  for (const Tensor* t : parts) {
    const Tensor h = be.to_host(*t);  // f32, exact for bf16
    std::memcpy(host.data<float>() + row * K, h.raw(), sizeof(float) * t->numel());
    row += t->dim(0);
  }
  Tensor fused = be.alloc(dt, host.shape());
  be.copy_weight(host, fused);  // f32 -> bf16: exact (the values were bf16)
  row = 0;
  for (Tensor* t : parts) {
    const int64_t n = t->dim(0);
    *t = fused.slice_rows(row, row + n);
    row += n;
  }
  return fused;
}

bool fused_projections_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MXSERVE_FUSED_PROJ");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

bool fused_projections_forced() {
  static const bool force = [] {
    const char* v = std::getenv("MXSERVE_FUSED_PROJ");
    return v != nullptr && std::strcmp(v, "force") == 0;
  }();
  return force;
}

Tensor row_columns_view(const Tensor& y, int64_t begin, int64_t end) {
  if (y.ndim() != 2 || y.dim(0) != 1 || begin % 8 != 0 || !y.is_contiguous() || begin < 0 || end > y.dim(1) ||
      begin > end)
    return Tensor();
  return y.reshape({y.dim(1)}).slice_rows(begin, end).reshape({1, end - begin});
}

}  // namespace mxserve::model
