// types.h's FloatToHalf (its rounding without a branch) gives the bits of the CUDA kernels' own
// conversion (src/cuda/packed.h, the straightforward form) at every sign, exponent and top
// mantissa bits with the low bits that decide the rounding; NaN stays NaN with its payload's top bits.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "cuda/packed.h"
#include "tqkv/types.h"

namespace tqkv {
namespace {

TEST(Types, FloatToHalfEqualsTheDeviceConversion) {
  // Every sign, exponent and top 7 mantissa bits, with the low 16 bits that matter to the
  // rounding (bit 13 is the last kept bit, bits 0-12 the rest): 65,536 x 16 values.
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x2FFF,
                           0x3000, 0x3001, 0x7FFF, 0x8000, 0x8001, 0xEFFF, 0xF000, 0xFFFF};
  uint64_t checked = 0;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (uint32_t lo : lows) {
      const float f = std::bit_cast<float>(hi << 16 | lo);
      ASSERT_EQ(FloatToHalf(f), cuda::FloatToHalfBits(f)) << std::hex << (hi << 16 | lo);
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
