// Element types. F32 is the reference dtype; BF16 is a storage/compute format with fp32
// accumulation; BOOL (one byte, 0/1) and I64 exist for masks and token ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace cabm {

enum class DType { F32, BF16, BOOL, I64 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // safetensors spelling: "F32", "BF16", "BOOL", "I64"

// bfloat16: the upper 16 bits of an IEEE float32.
struct bf16 {
  uint16_t bits;
};

// Round to nearest, ties to even; NaN stays NaN (quiet), inf stays inf.
inline bf16 float_to_bf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

inline float bf16_to_float(bf16 value) {
  uint32_t u = static_cast<uint32_t>(value.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE half (safetensors F16) to float, exact (subnormals, inf, NaN included).
float half_bits_to_float(uint16_t bits);

}  // namespace cabm
