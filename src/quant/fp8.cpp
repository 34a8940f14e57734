// FP8 e4m3 reference implementation (see fp8.h for the rules and invariants).
#include "quant/fp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/numeric.h"
#include "quant/host_float.h"

namespace mxserve::quant {

uint8_t e4m3_encode(float v) {
  if (std::isnan(v)) return 0x7f;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const double m = std::fabs(static_cast<double>(v));
  if (m >= kE4M3Max) return sign | 0x7e;  // saturate (448 = E15 M6; E15 M7 is NaN)
  int e = m < std::ldexp(1.0, -6) ? -6 : std::ilogb(m);  // binade; below 2^-6 the subnormal step applies
  double q = std::nearbyint(std::ldexp(m, 3 - e));         // steps of 2^(e-3): ties to even
  if (q >= 16) {                                           // rounded up into the next binade
    ++e;
    q = 8;
  }
  if (e == -6 && q < 8) return sign | static_cast<uint8_t>(q);  // subnormal: E = 0, M = q
  return sign | static_cast<uint8_t>(((e + 7) << 3) | (static_cast<int>(q) - 8));
}

float e4m3_decode(uint8_t code) { return fp8_e4m3_to_f32(code); }

namespace {

Result<Fp8Tensors> quantize_blocks(const Tensor& w, int64_t br, int64_t bc, bool per_tensor, const std::string& name) {
  if (w.ndim() != 2) return invalid_argument(name + ": FP8 quantization needs a 2-D weight, found " + w.describe());
  if (!is_plain_float(w.dtype())) return invalid_argument(name + ": cannot quantize " + w.describe() + " to FP8");
  if (br <= 0 || bc <= 0) return invalid_argument(name + ": FP8 block size must be positive");
  const int64_t rows = w.dim(0), cols = w.dim(1);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  read_f32(w, 0, rows * cols, x.data());
  const int64_t gr = (rows + br - 1) / br, gc = (cols + bc - 1) / bc;
  Fp8Tensors out{Tensor::empty(DType::kFP8E4M3, {rows, cols}),
                 Tensor::empty(DType::kF32, per_tensor ? Shape{1} : Shape{gr, gc})};
  auto* q = out.weight.data<uint8_t>();
#pragma omp parallel for collapse(2) schedule(static) if (rows * cols > (1 << 16))
  for (int64_t bi = 0; bi < gr; ++bi) {
    for (int64_t bj = 0; bj < gc; ++bj) {
      const int64_t r0 = bi * br, r1 = std::min(rows, r0 + br), c0 = bj * bc, c1 = std::min(cols, c0 + bc);
      float amax = 0.0f;
      bool finite = true;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          finite &= std::isfinite(x[r * cols + c]);
          amax = std::max(amax, std::fabs(x[r * cols + c]));
        }
      const float s = !finite ? NAN : amax == 0.0f ? 1.0f : amax / kE4M3Max;
      out.scale.data<float>()[per_tensor ? 0 : bi * gc + bj] = s;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) q[r * cols + c] = finite ? e4m3_encode(x[r * cols + c] / s) : 0x7f;
    }
  }
  return out;
}

}  // namespace

Result<Fp8Tensors> quantize_fp8_block(const Tensor& w, int64_t block_rows, int64_t block_cols, const std::string& name) {
  return quantize_blocks(w, block_rows, block_cols, false, name);
}

Result<Fp8Tensors> quantize_fp8_tensor(const Tensor& w, const std::string& name) {
  if (w.ndim() != 2) return invalid_argument(name + ": FP8 quantization needs a 2-D weight, found " + w.describe());
  return quantize_blocks(w, std::max<int64_t>(w.dim(0), 1), std::max<int64_t>(w.dim(1), 1), true, name);
}

Result<Fp8Tensors> quantize_fp8_channel(const Tensor& w, const std::string& name) {
  if (w.ndim() != 2) return invalid_argument(name + ": FP8 quantization needs a 2-D weight, found " + w.describe());
  return quantize_blocks(w, 1, std::max<int64_t>(w.dim(1), 1), false, name);
}

Tensor dequantize_fp8_rows(const Tensor& weight, const Tensor& scale) {
  MX_CHECK(weight.ndim() == 2 && weight.dtype() == DType::kFP8E4M3 && is_plain_float(scale.dtype()));
  const int64_t rows = weight.dim(0), cols = weight.dim(1);
  MX_CHECK(scale.numel() == 1 || scale.numel() == rows);
  std::vector<float> s(static_cast<size_t>(scale.numel()));
  read_f32(scale, 0, scale.numel(), s.data());
  Tensor out = Tensor::empty(DType::kF32, {rows, cols});
  const auto* q = static_cast<const uint8_t*>(weight.raw());
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const float sr = s[s.size() == 1 ? 0 : r];
    for (int64_t c = 0; c < cols; ++c) out.data<float>()[r * cols + c] = e4m3_decode(q[r * cols + c]) * sr;
  }
  return out;
}

Tensor dequantize_fp8(const Tensor& weight, const Tensor& scale, int64_t br, int64_t bc) {
  MX_CHECK(weight.ndim() == 2 && weight.dtype() == DType::kFP8E4M3 && scale.dtype() == DType::kF32);
  const int64_t rows = weight.dim(0), cols = weight.dim(1);
  const bool per_tensor = scale.numel() == 1;
  const int64_t gc = per_tensor ? 1 : scale.dim(1);
  if (!per_tensor) MX_CHECK(scale.ndim() == 2 && scale.dim(0) == (rows + br - 1) / br && gc == (cols + bc - 1) / bc);
  Tensor out = Tensor::empty(DType::kF32, {rows, cols});
  const auto* q = static_cast<const uint8_t*>(weight.raw());
  const auto* sb = static_cast<const uint8_t*>(scale.raw());
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float s;
      const int64_t si = per_tensor ? 0 : (r / br) * gc + c / bc;
      std::memcpy(&s, sb + 4 * si, 4);  // mmap offsets need not be aligned
      out.data<float>()[r * cols + c] = e4m3_decode(q[r * cols + c]) * s;
    }
  return out;
}

}  // namespace mxserve::quant
