#include "core/dtype.h"

namespace mxserve {
namespace {
struct DTypeInfo {
  DType dt;
  int bits;
  const char* name;
  const char* st_name;
  bool is_float;
};
constexpr DTypeInfo kInfos[] = {
    {DType::kF32, 32, "f32", "F32", true},          {DType::kF64, 64, "f64", "F64", true},
    {DType::kBF16, 16, "bf16", "BF16", true},       {DType::kF16, 16, "f16", "F16", true},
    {DType::kFP8E4M3, 8, "fp8_e4m3", "F8_E4M3", true}, {DType::kFP8E5M2, 8, "fp8_e5m2", "F8_E5M2", true},
    {DType::kE8M0, 8, "e8m0", "F8_E8M0", true},     {DType::kFP4E2M1, 4, "fp4_e2m1", "F4", true},
    {DType::kI8, 8, "i8", "I8", false},             {DType::kI16, 16, "i16", "I16", false},
    {DType::kI32, 32, "i32", "I32", false},         {DType::kI64, 64, "i64", "I64", false},
    {DType::kU8, 8, "u8", "U8", false},             {DType::kBool, 8, "bool", "BOOL", false},
};
const DTypeInfo& info(DType dt) {
  for (const auto& i : kInfos)
    if (i.dt == dt) return i;
  return kInfos[0];
}
}  // namespace

int dtype_bits(DType dt) { return info(dt).bits; }
const char* dtype_name(DType dt) { return info(dt).name; }
const char* dtype_safetensors_name(DType dt) { return info(dt).st_name; }
bool dtype_is_float(DType dt) { return info(dt).is_float; }

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& i : kInfos)
    if (name == i.st_name) return i.dt;
  return std::nullopt;
}

std::optional<uint64_t> dtype_bytes(DType dt, uint64_t numel) {
  const int bits = dtype_bits(dt);
  if (bits >= 8) return numel * static_cast<uint64_t>(bits / 8);
  const uint64_t total_bits = numel * static_cast<uint64_t>(bits);
  if (total_bits % 8 != 0) return std::nullopt;
  return total_bits / 8;
}

}  // namespace mxserve
