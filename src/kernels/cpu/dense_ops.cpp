// CPU reference: GEMM (OpenBLAS), RMSNorm, embedding gather, SwiGLU activation.
#include <cblas.h>

#include <cmath>
#include <cstring>

#include "core/numeric.h"
#include "kernels/cpu/cpu_kernels.h"

namespace mxserve::kernels::cpu {

void linear_f32(const float* x, const float* w, const float* bias, float* out, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  if (bias != nullptr) {
    for (int64_t i = 0; i < m; ++i) std::memcpy(out + i * n, bias, sizeof(float) * n);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, x, static_cast<int>(k), w, static_cast<int>(k), bias ? 1.0f : 0.0f, out,
              static_cast<int>(n));
}

void rmsnorm_f32(const float* x, const float* w, float* out, int64_t rows, int64_t cols, float eps) {
#pragma omp parallel for if (rows > 16)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    double ss = 0.0;
    for (int64_t c = 0; c < cols; ++c) ss += static_cast<double>(xr[c]) * xr[c];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(cols)) + eps);
    float* o = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) o[c] = w[c] * (xr[c] * inv);
  }
}

void add_rmsnorm_f32(const float* x, float* residual, const float* w, float* out, int64_t rows, int64_t cols,
                     float eps) {
#pragma omp parallel for if (rows > 16)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* rr = residual + r * cols;
    for (int64_t c = 0; c < cols; ++c) rr[c] += xr[c];
    double ss = 0.0;
    for (int64_t c = 0; c < cols; ++c) ss += static_cast<double>(rr[c]) * rr[c];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(cols)) + eps);
    float* o = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) o[c] = w[c] * (rr[c] * inv);
  }
}

void embedding_f32(const void* table, bool table_is_bf16, const int32_t* ids, float* out, int64_t n_tokens,
                   int64_t d_model) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* o = out + t * d_model;
    if (table_is_bf16) {
      const uint16_t* row = static_cast<const uint16_t*>(table) + static_cast<int64_t>(ids[t]) * d_model;
      for (int64_t c = 0; c < d_model; ++c) o[c] = bf16_to_f32(row[c]);
    } else {
      std::memcpy(o, static_cast<const float*>(table) + static_cast<int64_t>(ids[t]) * d_model, sizeof(float) * d_model);
    }
  }
}

void silu_mul_f32(const float* gate_up, float* out, int64_t n_tokens, int64_t inter) {
#pragma omp parallel for if (n_tokens > 16)
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* g = gate_up + t * 2 * inter;
    const float* u = g + inter;
    float* o = out + t * inter;
    for (int64_t i = 0; i < inter; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

}  // namespace mxserve::kernels::cpu
