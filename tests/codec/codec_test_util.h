// Helpers shared by the codec tests.
#ifndef TQKV_TESTS_CODEC_CODEC_TEST_UTIL_H_
#define TQKV_TESTS_CODEC_CODEC_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tqkv/codec.h"
#include "tqkv/synthetic.h"

namespace tqkv::testing_util {

inline std::unique_ptr<Codec> MakeCodec(const std::string& spec, uint32_t d) {
  auto s = ParseCodecSpec(spec);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return nullptr;
  auto c = Codec::Create(*s, d);
  EXPECT_TRUE(c.ok()) << spec << " d=" << d << ": " << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// n vectors of d f32 values (one group: layer 0, K or V, head 0 for kv data).
inline std::vector<float> Data(SyntheticKind kind, size_t n, uint32_t d, uint64_t seed,
                               int kv = 0) {
  std::vector<float> x(n * d);
  SyntheticKv gen(kind, ModelGeometry{1, 1, d}, seed);
  EXPECT_TRUE(gen.FillGroup(0, kv, 0, 0, n, DType::kF32, x.data(), d).ok());
  return x;
}

struct Quality {
  double nmse = 0;    // sum |x - y|^2 / sum |x|^2
  double cosine = 0;  // mean over vectors
};

inline Quality Measure(const std::vector<float>& x, const std::vector<float>& y, uint32_t d) {
  Quality q;
  double err = 0, ref = 0, cos = 0;
  const size_t n = x.size() / d;
  for (size_t i = 0; i < n; ++i) {
    double xy = 0, xx = 0, yy = 0;
    for (size_t j = 0; j < d; ++j) {
      const double a = x[i * d + j], b = y[i * d + j];
      err += (a - b) * (a - b);
      xy += a * b;
      xx += a * a;
      yy += b * b;
    }
    ref += xx;
    cos += xy / std::sqrt(xx * yy);
  }
  q.nmse = err / ref;
  q.cosine = cos / n;
  return q;
}

// Encodes f32 vectors (selecting group meta over all of them) and decodes to f32.
inline std::vector<float> RoundTrip(const Codec& c, const std::vector<float>& x,
                                    std::vector<uint8_t>* codes_out = nullptr) {
  const uint32_t d = c.head_dim();
  const size_t n = x.size() / d;
  std::vector<uint8_t> meta(c.group_meta_bytes());
  EXPECT_TRUE(c.SelectGroupMeta(x.data(), DType::kF32, n, d, meta).ok());
  std::vector<uint8_t> codes(n * c.code_bytes());
  EXPECT_TRUE(c.Encode(x.data(), DType::kF32, n, d, meta, codes).ok());
  std::vector<float> y(n * d);
  EXPECT_TRUE(c.Decode(codes, n, meta, y.data(), DType::kF32, d).ok());
  if (codes_out) *codes_out = std::move(codes);
  return y;
}

}  // namespace tqkv::testing_util

#endif  // TQKV_TESTS_CODEC_CODEC_TEST_UTIL_H_
