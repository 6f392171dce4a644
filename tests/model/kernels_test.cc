// The AVX2 model kernels against their scalar references (bit for bit), and the quantized dot
// products against float math on dequantized values.
#include "model/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "model/ggml_types.h"
#include "tqkv/simd.h"
#include "tqkv/types.h"

namespace tqkv::model {
namespace {

bool HaveAvx2() { return SimdLevelSupported(SimdLevel::kAvx2); }

std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

std::vector<uint8_t> QuantizeMatrix(GgmlType type, const std::vector<float>& x, size_t rows,
                                    size_t cols) {
  const size_t rb = *GgmlRowBytes(type, cols);
  std::vector<uint8_t> out(rb * rows);
  for (size_t r = 0; r < rows; ++r)
    QuantizeRow(type, x.data() + r * cols, cols, out.data() + r * rb);
  return out;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(ModelKernelsTest, QuantDotAvx2MatchesScalarBitForBit) {
  if (!HaveAvx2()) GTEST_SKIP() << "CPU has no AVX2+FMA+F16C";
  const ModelKernels& ref = ScalarModelKernels();
  const ModelKernels& avx = Avx2ModelKernels();
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    for (size_t cols : {32u, 64u, 576u, 1536u}) {
      for (size_t n_tokens : {1u, 3u, 4u, 7u, 9u}) {
        const size_t rows = 5, nb = cols / 32;
        auto w = RandomFloats(rows * cols, 1 + static_cast<uint32_t>(cols));
        // Edge rows: all zero, constant, huge range.
        for (size_t j = 0; j < cols; ++j) {
          w[j] = 0.0f;
          w[cols + j] = 0.75f;
          w[2 * cols + j] = (j % 2 ? 1e4f : -1e-3f);
        }
        const auto wq = QuantizeMatrix(type, w, rows, cols);
        auto x = RandomFloats(n_tokens * cols, 7 + static_cast<uint32_t>(n_tokens), 3.0f);
        for (size_t j = 0; j < cols; ++j) x[j] = (j % 3 == 0) ? -127.0f : 0.0f;  // -127 codes
        const size_t groups = (n_tokens + 3) / 4;
        std::vector<BlockQ8x4> xq(groups * nb), xq2(groups * nb);
        for (size_t g = 0; g < groups; ++g) {
          const size_t nt = std::min<size_t>(4, n_tokens - 4 * g);
          ref.quantize_x4(x.data() + 4 * g * cols, cols, nt, cols, xq.data() + g * nb);
          avx.quantize_x4(x.data() + 4 * g * cols, cols, nt, cols, xq2.data() + g * nb);
        }
        ASSERT_EQ(std::memcmp(xq.data(), xq2.data(), xq.size() * sizeof(BlockQ8x4)), 0)
            << "quantize_x4 differs, cols " << cols << " tokens " << n_tokens;
        const size_t rb = wq.size() / rows;
        for (size_t r = 0; r < rows; ++r) {
          std::vector<float> a(n_tokens, -1.0f), b(n_tokens, -2.0f);
          ref.quant_dot(type)(wq.data() + r * rb, xq.data(), nb, n_tokens, a.data(), 1);
          avx.quant_dot(type)(wq.data() + r * rb, xq.data(), nb, n_tokens, b.data(), 1);
          for (size_t t = 0; t < n_tokens; ++t) {
            ASSERT_EQ(Bits(a[t]), Bits(b[t]))
                << GgmlTraits(type).name << " cols " << cols << " row " << r << " token " << t
                << ": " << a[t] << " vs " << b[t];
          }
        }
      }
    }
  }
}

// The f32-activation kernels: AVX2 == scalar bit for bit (strided rows, 1..9 tokens, edge
// rows), and both == dot_f32 of the dequantized row (the documented order).
TEST(ModelKernelsTest, QuantDotF32Avx2MatchesScalarAndDequantizedDotBitForBit) {
  const ModelKernels& ref = ScalarModelKernels();
  const bool avx2 = HaveAvx2();
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    for (size_t cols : {32u, 64u, 576u, 1536u}) {
      for (size_t n_tokens : {1u, 3u, 4u, 7u, 9u}) {
        const size_t rows = 5, nb = cols / 32, stride = cols + 8;
        auto w = RandomFloats(rows * cols, 11 + static_cast<uint32_t>(cols));
        for (size_t j = 0; j < cols; ++j) {
          w[j] = 0.0f;
          w[cols + j] = 0.75f;
          w[2 * cols + j] = (j % 2 ? 1e4f : -1e-3f);
        }
        const auto wq = QuantizeMatrix(type, w, rows, cols);
        auto x = RandomFloats(n_tokens * stride, 17 + static_cast<uint32_t>(n_tokens), 3.0f);
        for (size_t j = 0; j < cols; ++j) x[j] = (j % 3 == 0) ? -1e-30f : 1e20f * (j % 5);
        const size_t rb = wq.size() / rows;
        for (size_t r = 0; r < rows; ++r) {
          std::vector<float> a(2 * n_tokens, -1.0f), b(2 * n_tokens, -2.0f);
          ref.quant_dot_f32(type)(wq.data() + r * rb, nb, x.data(), stride, n_tokens, a.data(),
                                  2);
          std::vector<float> wd(cols);
          DequantizeRow(type, wq.data() + r * rb, cols, wd.data());
          for (size_t t = 0; t < n_tokens; ++t) {
            const float e = ref.dot_f32(wd.data(), x.data() + t * stride, cols);
            ASSERT_EQ(Bits(a[2 * t]), Bits(e)) << GgmlTraits(type).name << " cols " << cols
                                               << " row " << r << " token " << t;
            ASSERT_EQ(a[2 * t + 1], -1.0f);
          }
          if (!avx2) continue;
          Avx2ModelKernels().quant_dot_f32(type)(wq.data() + r * rb, nb, x.data(), stride,
                                                 n_tokens, b.data(), 2);
          for (size_t t = 0; t < n_tokens; ++t) {
            ASSERT_EQ(Bits(a[2 * t]), Bits(b[2 * t]))
                << GgmlTraits(type).name << " cols " << cols << " row " << r << " token " << t
                << ": " << a[2 * t] << " vs " << b[2 * t];
            ASSERT_EQ(b[2 * t + 1], -2.0f);
          }
        }
      }
    }
  }
}

TEST(ModelKernelsTest, QuantDotMatchesDequantizedFloatDot) {
  const ModelKernels& k = ActiveModelKernels();
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    const size_t cols = 256, rows = 8, nb = cols / 32;
    const auto w = RandomFloats(rows * cols, 3);
    const auto wq = QuantizeMatrix(type, w, rows, cols);
    const auto x = RandomFloats(cols, 4);
    std::vector<BlockQ8x4> xq(nb);
    k.quantize_x4(x.data(), cols, 1, cols, xq.data());
    std::vector<float> xd(cols);
    for (size_t b = 0; b < nb; ++b) {
      for (size_t j = 0; j < 32; ++j) xd[b * 32 + j] = xq[b].d[0] * xq[b].qs[0][j];
    }
    const size_t rb = wq.size() / rows;
    for (size_t r = 0; r < rows; ++r) {
      std::vector<float> wd(cols);
      DequantizeRow(type, wq.data() + r * rb, cols, wd.data());
      double expect = 0.0, exact = 0.0, norm = 0.0;
      for (size_t j = 0; j < cols; ++j) {
        expect += static_cast<double>(wd[j]) * xd[j];
        exact += static_cast<double>(w[r * cols + j]) * x[j];
        norm += std::fabs(static_cast<double>(w[r * cols + j]) * x[j]);
      }
      float got = 0.0f;
      k.quant_dot(type)(wq.data() + r * rb, xq.data(), nb, 1, &got, 1);
      EXPECT_NEAR(got, expect, 1e-4 * norm + 1e-6) << GgmlTraits(type).name << " row " << r;
      // And the quantization error against the unquantized dot is bounded.
      const double tol = type == GgmlType::kQ8_0 ? 0.02 : 0.15;
      EXPECT_NEAR(got, exact, tol * norm) << GgmlTraits(type).name << " row " << r;
    }
  }
}

TEST(ModelKernelsTest, FloatKernelsAvx2MatchScalarBitForBit) {
  if (!HaveAvx2()) GTEST_SKIP() << "CPU has no AVX2+FMA+F16C";
  const ModelKernels& ref = ScalarModelKernels();
  const ModelKernels& avx = Avx2ModelKernels();
  for (size_t n : {1u, 7u, 8u, 9u, 64u, 172u, 576u, 1001u}) {
    const auto a = RandomFloats(n, 11 + static_cast<uint32_t>(n));
    auto b = RandomFloats(n, 12 + static_cast<uint32_t>(n), 5.0f);
    std::vector<uint16_t> h(n), bf(n);
    for (size_t i = 0; i < n; ++i) {
      h[i] = FloatToHalf(b[i]);
      bf[i] = FloatToBF16(b[i]);
    }
    if (n > 3) h[3] = 0x0001;  // subnormal
    EXPECT_EQ(Bits(ref.dot_f32(a.data(), b.data(), n)), Bits(avx.dot_f32(a.data(), b.data(), n)))
        << n;
    EXPECT_EQ(Bits(ref.dot_f16(h.data(), a.data(), n)), Bits(avx.dot_f16(h.data(), a.data(), n)))
        << n;
    EXPECT_EQ(Bits(ref.dot_bf16(bf.data(), a.data(), n)),
              Bits(avx.dot_bf16(bf.data(), a.data(), n)))
        << n;
  }
}

TEST(ModelKernelsTest, AttentionKernelsAvx2MatchScalarBitForBit) {
  if (!HaveAvx2()) GTEST_SKIP() << "CPU has no AVX2+FMA+F16C";
  const ModelKernels& ref = ScalarModelKernels();
  const ModelKernels& avx = Avx2ModelKernels();
  for (size_t hd : {8u, 12u, 64u, 72u, 128u}) {
    for (size_t rows : {1u, 7u, 8u, 9u, 33u}) {
      const size_t stride = 3 * hd;  // three KV heads per token
      const auto kf = RandomFloats(rows * stride, 21 + static_cast<uint32_t>(hd * rows), 2.0f);
      std::vector<uint16_t> kh(kf.size());
      for (size_t i = 0; i < kf.size(); ++i) kh[i] = FloatToHalf(kf[i]);
      const auto q = RandomFloats(hd, 5);
      std::vector<float> s1(rows), s2(rows);
      ref.dot_f16_rows(kh.data() + hd, stride, rows, q.data(), hd, s1.data());
      avx.dot_f16_rows(kh.data() + hd, stride, rows, q.data(), hd, s2.data());
      for (size_t r = 0; r < rows; ++r) {
        ASSERT_EQ(Bits(s1[r]), Bits(s2[r])) << hd << " " << rows << " " << r;
        ASSERT_EQ(Bits(s1[r]), Bits(ref.dot_f16(kh.data() + hd + r * stride, q.data(), hd)));
      }
      auto p = RandomFloats(rows, 9);
      for (auto& x : p) x = std::fabs(x);
      std::vector<float> o1(hd, 7.0f), o2(hd, 8.0f);
      ref.weighted_sum_f16(p.data(), kh.data() + 2 * hd, stride, rows, hd, o1.data());
      avx.weighted_sum_f16(p.data(), kh.data() + 2 * hd, stride, rows, hd, o2.data());
      for (size_t i = 0; i < hd; ++i) ASSERT_EQ(Bits(o1[i]), Bits(o2[i])) << hd << " " << i;
    }
  }
}

TEST(ModelKernelsTest, ExpNegIsAccurateAndSoftmaxMatchesAcrossLevels) {
  double worst = 0.0;
  for (float x = -87.0f; x <= 0.0f; x += 0.0137f) {
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(ExpNeg(x) - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(ExpNeg(0.0f), 1.0f);
  EXPECT_EQ(ExpNeg(-88.0f), 0.0f);
  EXPECT_EQ(ExpNeg(-INFINITY), 0.0f);
  EXPECT_EQ(ExpNeg(std::nanf("")), 0.0f);
  for (size_t n : {1u, 5u, 8u, 9u, 64u, 1000u}) {
    auto x = RandomFloats(n, 40 + static_cast<uint32_t>(n), 6.0f);
    if (n > 3) x[2] = -1e30f;  // underflows to 0
    std::vector<float> a = x;
    ScalarModelKernels().softmax(a.data(), n, 8.0f);
    double total = 0.0;
    for (float v : a) total += v;
    EXPECT_NEAR(total, 1.0, 1e-5) << n;
    if (!HaveAvx2()) continue;
    std::vector<float> b = x;
    Avx2ModelKernels().softmax(b.data(), n, 8.0f);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(Bits(a[i]), Bits(b[i])) << n << " " << i;
  }
}

TEST(ModelKernelsTest, DequantizeMatchesBlockLayout) {
  // q4_0 block: d = 0.5, nibbles: byte j = (j & 15) | ((15 - j) << 4).
  uint8_t blk[18];
  const uint16_t d = FloatToHalf(0.5f);
  std::memcpy(blk, &d, 2);
  for (int j = 0; j < 16; ++j) blk[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float out[32];
  DequantizeRow(GgmlType::kQ4_0, blk, 32, out);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * (j - 8)) << j;            // low nibbles: elements 0..15
    EXPECT_EQ(out[j + 16], 0.5f * (15 - j - 8)) << j;  // high nibbles: elements 16..31
  }
  // q4_1: x = d * q + m.
  uint8_t blk1[20];
  const uint16_t m = FloatToHalf(-2.0f);
  std::memcpy(blk1, &d, 2);
  std::memcpy(blk1 + 2, &m, 2);
  for (int j = 0; j < 16; ++j) blk1[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  DequantizeRow(GgmlType::kQ4_1, blk1, 32, out);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * j - 2.0f);
    EXPECT_EQ(out[j + 16], 0.5f * (15 - j) - 2.0f);
  }
  // q8_0 round trip of exactly representable values.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  x[0] = -127.0f;
  uint8_t blk8[34];
  QuantizeRowQ8_0(x.data(), 32, blk8);
  DequantizeRow(GgmlType::kQ8_0, blk8, 32, out);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], x[j]);
}

TEST(ModelKernelsTest, ActivationQuantizationIsExactForSmallIntegers) {
  for (SimdLevel level : SupportedSimdLevels()) {
    const ModelKernels& k = ModelKernelsFor(level);
    std::vector<float> x(3 * 64);
    for (int j = 0; j < 64; ++j) x[j] = static_cast<float>((j % 32) * 4 - 62);
    x[5] = 127.0f;
    x[64 + 3] = std::nanf("");
    x[128 + 1] = 1e30f;
    std::vector<BlockQ8x4> q(2);
    k.quantize_x4(x.data(), 64, 3, 64, q.data());
    for (int b = 0; b < 2; ++b) {
      for (int t = 0; t < 4; ++t) {
        int32_t sum = 0;
        for (int j = 0; j < 32; ++j) sum += q[b].qs[t][j];
        EXPECT_EQ(sum, q[b].sum[t]);
        EXPECT_EQ(q[b].ds[t], q[b].d[t] * static_cast<float>(sum));
      }
      EXPECT_EQ(q[b].d[3], 0.0f);  // absent 4th token
    }
    EXPECT_EQ(q[0].d[0], 1.0f);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(q[0].qs[0][j], static_cast<int8_t>(x[j]));
    EXPECT_EQ(q[0].qs[1][3], -127);  // NaN
    EXPECT_EQ(q[0].qs[2][1], 127);
  }
}

}  // namespace
}  // namespace tqkv::model
