// Transpose16 (src/kv/transpose.h; SSE2 tiles on x86) against its element-by-element reference,
// for shapes with and without whole 8x8 tiles and padded strides.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kv/transpose.h"

namespace tqkv {
namespace {

TEST(Transpose16, EqualsTheReference) {
  for (size_t rows : {1, 7, 8, 9, 16, 33, 128}) {
    for (size_t cols : {1, 8, 12, 64, 130}) {
      for (size_t pad : {0, 5}) {
        const size_t ss = cols + pad, ds = rows + pad;
        std::vector<uint16_t> src(rows * ss), a(cols * ds, 0xAAAA), b(cols * ds, 0xAAAA);
        for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
        Transpose16(src.data(), ss, a.data(), ds, rows, cols);
        Transpose16Reference(src.data(), ss, b.data(), ds, rows, cols);
        ASSERT_EQ(a, b) << rows << "x" << cols << " pad " << pad;
        EXPECT_EQ(a[(cols - 1) * ds + rows - 1], src[(rows - 1) * ss + cols - 1]);
      }
    }
  }
}

}  // namespace
}  // namespace tqkv
