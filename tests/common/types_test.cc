// types.h's scalar conversions: FloatToHalf rounds to nearest even like the straightforward
// reference below (the form it had before its rounding lost its branch), at every exponent and
// sign with the low bits that decide the rounding; NaN stays NaN with its payload's top bits.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "tqkv/types.h"

namespace tqkv {
namespace {

uint16_t ReferenceFloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {
    if (abs == 0x7F800000u) return sign | 0x7C00u;
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  if (abs >= 0x477FF000u) return sign | 0x7C00u;
  if (abs < 0x38800000u) {
    if (abs < 0x33000000u) return sign;
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = abs - 0x38000000u;
  const uint32_t rem = r & 0x1FFFu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

TEST(Types, FloatToHalfRoundsLikeTheReference) {
  // Every sign, exponent and top 7 mantissa bits, with the low 16 bits that matter to the
  // rounding (bit 13 is the last kept bit, bits 0-12 the rest): 65,536 x 16 values.
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x2FFF,
                           0x3000, 0x3001, 0x7FFF, 0x8000, 0x8001, 0xEFFF, 0xF000, 0xFFFF};
  uint64_t checked = 0;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (uint32_t lo : lows) {
      const float f = std::bit_cast<float>(hi << 16 | lo);
      ASSERT_EQ(FloatToHalf(f), ReferenceFloatToHalf(f)) << std::hex << (hi << 16 | lo);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 65536u * 16);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFFu);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00u);  // ties to even: up to inf
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3C00u);  // a tie rounds to the even 1.0
  EXPECT_EQ(HalfToFloat(FloatToHalf(-2.5f)), -2.5f);
}

}  // namespace
}  // namespace tqkv
