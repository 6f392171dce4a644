// Element types and exact scalar conversions (the reference for every SIMD and CUDA path).
#ifndef TQKV_INCLUDE_TQKV_TYPES_H_
#define TQKV_INCLUDE_TQKV_TYPES_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tqkv {

// Serialized in the container: never renumber.
enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }
std::string_view DTypeName(DType t);                         // "f32", "f16", "bf16"
std::optional<DType> ParseDType(std::string_view name);      // accepts fp16/fp32/bf16 too

// IEEE binary16 <-> binary32, round to nearest even; NaN stays NaN (quiet bit set), like F16C.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3FFu) << 13;
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | mant << 13 | (mant ? 0x400000u : 0u);
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or NaN
    if (abs == 0x7F800000u) return sign | 0x7C00u;
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {                         // result is subnormal or zero
    if (abs < 0x33000000u) return sign;            // < 2^-25: rounds to zero
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 + (113 - e) - 1 ... shift into the subnormal grid
    uint32_t r = m >> (shift - 0);
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  // Rebias the exponent 127 -> 15 and round to nearest even without a branch (the carry of
  // rem + 0xFFF + odd is the round-up: rem > 0x1000, or rem == 0x1000 with r odd).
  const uint32_t r = abs - 0x38000000u;
  return static_cast<uint16_t>(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
}

// bfloat16: the top half of a binary32, round to nearest even; NaN stays NaN.
inline float BF16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }
inline uint16_t FloatToBF16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t rounding = 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

// Load element i of a typed array as float; store a float into element i.
inline float LoadAsFloat(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return BF16ToFloat(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.0f;
}
inline void StoreFromFloat(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = FloatToHalf(v); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = FloatToBF16(v); break;
  }
}

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_TYPES_H_
