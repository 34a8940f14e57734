// Reading float weights of any stored float dtype (f32, bf16, f16) from host memory that may be
// unaligned (mmap offsets), as f32. Shared by the quantizers and the dequantizing loader.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/check.h"
#include "core/numeric.h"
#include "core/tensor.h"

namespace mxserve::quant {

inline bool is_plain_float(DType dt) { return dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16; }

// Elements [begin, begin + n) of a contiguous host float tensor, as f32.
inline void read_f32(const Tensor& t, int64_t begin, int64_t n, float* out) {
  MX_CHECK(is_plain_float(t.dtype()));
  const auto* src = static_cast<const uint8_t*>(t.raw());
  switch (t.dtype()) {
    case DType::kF32: std::memcpy(out, src + 4 * begin, 4 * n); break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, src + 2 * (begin + i), 2);
        out[i] = bf16_to_f32(v);
      }
      break;
    default:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, src + 2 * (begin + i), 2);
        out[i] = f16_to_f32(v);
      }
      break;
  }
}

}  // namespace mxserve::quant
