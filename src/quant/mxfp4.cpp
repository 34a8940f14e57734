// MXFP4 reference implementation (see mxfp4.h for the rules and invariants).
#include "quant/mxfp4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/numeric.h"
#include "quant/host_float.h"

namespace mxserve::quant {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

uint8_t biased(int e) { return static_cast<uint8_t>(std::clamp(e, -127, 127) + 127); }

}  // namespace

const char* scale_rule_name(ScaleRule r) {
  switch (r) {
    case ScaleRule::kEven: return "even";
    case ScaleRule::kFloor: return "floor";
    case ScaleRule::kCeil: return "ceil";
  }
  return "?";
}

Result<ScaleRule> parse_scale_rule(const std::string& name) {
  if (name == "even") return ScaleRule::kEven;
  if (name == "floor") return ScaleRule::kFloor;
  if (name == "ceil") return ScaleRule::kCeil;
  return invalid_argument("scale rule '" + name + "': expected one of even, floor, ceil");
}

uint8_t e2m1_encode(float v) {
  if (std::isnan(v)) return 0x0;
  const uint8_t sign = std::signbit(v) ? 0x8 : 0x0;
  const float m = std::fabs(v);
  // Decision points are the midpoints between neighbouring values; a midpoint goes to the even code.
  uint8_t code;
  if (m <= 0.25f) code = 0;        // 0.25: 0 (code 0) vs 0.5 (code 1) -> 0
  else if (m < 0.75f) code = 1;
  else if (m <= 1.25f) code = 2;   // 0.75 -> 1.0 (code 2); 1.25 -> 1.0 (code 2)
  else if (m < 1.75f) code = 3;
  else if (m <= 2.5f) code = 4;    // 1.75 -> 2 (code 4); 2.5 -> 2 (code 4)
  else if (m < 3.5f) code = 5;
  else if (m <= 5.0f) code = 6;    // 3.5 -> 4 (code 6); 5 -> 4 (code 6)
  else code = 7;                   // (5, inf]: 6, saturating
  return sign | code;
}

float e2m1_decode(uint8_t code) { return fp4_e2m1_to_f32(code); }

uint8_t e8m0_scale_for(float amax, ScaleRule rule) {
  if (!std::isfinite(amax)) return kE8M0Nan;
  if (amax <= 0.0f) return 0;
  switch (rule) {
    case ScaleRule::kEven: {
      // Quark DequantScaleRoundingMode.EVEN: add half an E2M1 mantissa ulp (bit 21), keep the exponent.
      const uint32_t a = (bits_of(amax) + 0x200000u) & 0x7f800000u;
      const int field = static_cast<int>(a >> 23);
      if (field == 0) return biased(-127);  // log2(0) = -inf, clamped
      if (field == 255) return biased(127);
      return biased(field - 127 - 2);
    }
    case ScaleRule::kFloor:
      return biased(std::ilogb(amax) - 2);  // ilogb is exact for subnormals too
    case ScaleRule::kCeil: {
      // triton_kernels ROUND_UP: round amax/6 (in f32) up to a power of two via its bit pattern.
      const float s = amax / 6.0f;
      const uint32_t a = (bits_of(s) + 0x7fffffu) & 0x7f800000u;
      return static_cast<uint8_t>(std::min<uint32_t>(a >> 23, 254u));
    }
  }
  return kE8M0Nan;
}

void mxfp4_quantize_row(const float* x, int64_t k, ScaleRule rule, uint8_t* packed, uint8_t* scales) {
  MX_CHECK(k % 2 == 0);
  std::memset(packed, 0, static_cast<size_t>(k / 2));
  for (int64_t b = 0; b < mx_scale_cols(k); ++b) {
    const int64_t begin = b * kMxBlock, end = std::min(k, begin + kMxBlock);
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = begin; i < end; ++i) {
      finite &= std::isfinite(x[i]);
      amax = std::max(amax, std::fabs(x[i]));
    }
    const uint8_t s = finite ? e8m0_scale_for(amax, rule) : kE8M0Nan;
    scales[b] = s;
    if (s == kE8M0Nan) continue;  // codes stay 0; the NaN scale makes the block NaN
    // x * 2^-e is exact (a power of two; |x| * 2^-e < 8 so no overflow), like ldexp, and cheaper.
    const float inv = std::ldexp(1.0f, 127 - static_cast<int>(s));
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t code = e2m1_encode(x[i] * inv);
      packed[i / 2] |= (i % 2 == 0) ? code : static_cast<uint8_t>(code << 4);
    }
  }
}

void mxfp4_dequantize_row(const uint8_t* packed, const uint8_t* scales, int64_t k, float* out) {
  for (int64_t b = 0; b < mx_scale_cols(k); ++b) {
    const uint8_t s = scales[b];
    const float scale = s == kE8M0Nan ? NAN : std::ldexp(1.0f, static_cast<int>(s) - 127);
    const int64_t end = std::min(k, (b + 1) * kMxBlock);
    for (int64_t i = b * kMxBlock; i < end; i += 2) {  // k is even, blocks start even
      const uint8_t byte = packed[i / 2];
      out[i] = e2m1_decode(byte & 0x0f) * scale;    // exact: a power-of-two scale
      out[i + 1] = e2m1_decode(byte >> 4) * scale;
    }
  }
}

Result<MxTensors> quantize_mxfp4(const Tensor& w, ScaleRule rule, const std::string& name) {
  if (w.ndim() != 2) return invalid_argument(name + ": MXFP4 needs a 2-D weight, found " + w.describe());
  if (!is_plain_float(w.dtype())) return invalid_argument(name + ": cannot quantize " + w.describe() + " to MXFP4");
  const int64_t rows = w.dim(0), k = w.dim(1);
  if (k % 2 != 0)
    return invalid_argument(name + ": MXFP4 packs two elements per byte along the input dimension, but " +
                            w.describe() + " has an odd input width " + std::to_string(k));
  MxTensors out{Tensor::empty(DType::kU8, {rows, k / 2}), Tensor::empty(DType::kU8, {rows, mx_scale_cols(k)})};
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      read_f32(w, r * k, k, row.data());
      mxfp4_quantize_row(row.data(), k, rule, out.packed.data<uint8_t>() + r * (k / 2),
                         out.scales.data<uint8_t>() + r * mx_scale_cols(k));
    }
  }
  return out;
}

Tensor dequantize_mxfp4(const Tensor& packed, const Tensor& scales, int64_t k) {
  MX_CHECK(packed.ndim() == 2 && scales.ndim() == 2 && packed.dim(0) == scales.dim(0));
  MX_CHECK(packed.dim(1) * 2 == k && scales.dim(1) == mx_scale_cols(k));
  const int64_t rows = packed.dim(0);
  Tensor out = Tensor::empty(DType::kF32, {rows, k});
  const auto* p = static_cast<const uint8_t*>(packed.raw());
  const auto* s = static_cast<const uint8_t*>(scales.raw());
#pragma omp parallel for schedule(static) if (rows * k > (1 << 16))
  for (int64_t r = 0; r < rows; ++r)
    mxfp4_dequantize_row(p + r * (k / 2), s + r * mx_scale_cols(k), k, out.data<float>() + r * k);
  return out;
}

}  // namespace mxserve::quant
