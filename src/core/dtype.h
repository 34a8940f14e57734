// DType: element types mxserve stores, with their safetensors names and sizes in bits.
// Key invariant: fp4_e2m1 packs two elements per byte (element 2i in the low nibble), so byte sizes
// must be computed with dtype_bytes(), never numel * sizeof.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mxserve {

enum class DType : uint8_t {
  kF32,
  kF64,
  kBF16,
  kF16,
  kFP8E4M3,   // OCP e4m3fn: no inf, 0x7f/0xff NaN, max 448
  kFP8E5M2,
  kE8M0,      // OCP MX scale: value 2^(byte-127), 0xff = NaN
  kFP4E2M1,   // packed two per byte
  kI8,
  kI16,
  kI32,
  kI64,
  kU8,
  kBool,
};

int dtype_bits(DType dt);
const char* dtype_name(DType dt);                       // "bf16", "fp8_e4m3", ...
const char* dtype_safetensors_name(DType dt);           // "BF16", "F8_E4M3", ...
std::optional<DType> dtype_from_safetensors(std::string_view name);
bool dtype_is_float(DType dt);

// Bytes for numel elements; nullopt when numel does not fill whole bytes (odd fp4 count).
std::optional<uint64_t> dtype_bytes(DType dt, uint64_t numel);

}  // namespace mxserve
