// Synthetic data: determinism, token-range independence, layouts and the kv distribution's shape.
#include "tqkv/synthetic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "tqkv/kv_cache.h"

namespace tqkv {
namespace {

const ModelGeometry kGeo{2, 3, 128};

std::vector<float> Group(const SyntheticKv& g, uint32_t layer, int kv, uint32_t head, uint64_t t0,
                         uint64_t t1) {
  std::vector<float> v((t1 - t0) * kGeo.head_dim);
  EXPECT_TRUE(g.FillGroup(layer, kv, head, t0, t1, DType::kF32, v.data(), kGeo.head_dim).ok());
  return v;
}

TEST(Synthetic, DeterministicAndRangeIndependent) {
  for (SyntheticKind kind : {SyntheticKind::kGaussian, SyntheticKind::kKv}) {
    const SyntheticKv a(kind, kGeo, 5), b(kind, kGeo, 5), c(kind, kGeo, 6);
    const auto full = Group(a, 1, 0, 2, 0, 100);
    EXPECT_EQ(full, Group(b, 1, 0, 2, 0, 100));
    EXPECT_NE(full, Group(c, 1, 0, 2, 0, 100));
    const auto tail = Group(a, 1, 0, 2, 60, 100);
    EXPECT_TRUE(std::equal(tail.begin(), tail.end(), full.begin() + 60 * kGeo.head_dim));
    EXPECT_NE(Group(a, 1, 1, 2, 0, 10), Group(a, 1, 0, 2, 0, 10));
    EXPECT_NE(Group(a, 0, 0, 2, 0, 10), Group(a, 1, 0, 2, 0, 10));
  }
}

TEST(Synthetic, LayerLayoutMatchesGroupsAndDtypes) {
  const SyntheticKv g(SyntheticKind::kKv, kGeo, 9);
  const uint64_t t0 = 7, t1 = 19;
  std::vector<float> layer((t1 - t0) * kGeo.token_elems());
  ASSERT_TRUE(g.FillLayer(1, 1, t0, t1, DType::kF32, layer.data()).ok());
  for (uint32_t h = 0; h < kGeo.kv_heads; ++h) {
    const auto grp = Group(g, 1, 1, h, t0, t1);
    for (uint64_t t = 0; t < t1 - t0; ++t) {
      ASSERT_EQ(0, std::memcmp(&layer[t * kGeo.token_elems() + h * kGeo.head_dim],
                               &grp[t * kGeo.head_dim], kGeo.head_dim * 4));
    }
  }
  for (DType t : {DType::kF16, DType::kBF16}) {
    std::vector<uint16_t> half(layer.size());
    ASSERT_TRUE(g.FillLayer(1, 1, t0, t1, t, half.data()).ok());
    for (size_t i = 0; i < layer.size(); ++i) {
      std::vector<uint16_t> one(2);  // room for any dtype: no -Warray-bounds on the f32 branch
      StoreFromFloat(one.data(), t, 0, layer[i]);
      ASSERT_EQ(one[0], half[i]);
    }
  }
  auto buf = KvCacheBuffer::Allocate("x", kGeo, DType::kF16, 33);
  ASSERT_TRUE(buf.ok());
  ASSERT_TRUE(g.FillCache((*buf)->cache()).ok());
  std::vector<uint16_t> want(33 * kGeo.token_elems());
  ASSERT_TRUE(g.FillLayer(1, 0, 0, 33, DType::kF16, want.data()).ok());
  EXPECT_EQ(0, std::memcmp(want.data(), (*buf)->cache().k(1), want.size() * 2));
}

TEST(Synthetic, KvShape) {
  const SyntheticKv g(SyntheticKind::kKv, kGeo, 3);
  const size_t n = 2000;
  const uint32_t d = kGeo.head_dim;
  for (int kv : {0, 1}) {
    const auto x = Group(g, 0, kv, 1, 0, n);
    std::vector<double> energy(d, 0.0);
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
      for (uint32_t c = 0; c < d; ++c) energy[c] += double(x[i * d + c]) * x[i * d + c];
    }
    total = std::accumulate(energy.begin(), energy.end(), 0.0);
    std::vector<double> sorted = energy;
    std::sort(sorted.rbegin(), sorted.rend());
    const double top4 = sorted[0] + sorted[1] + sorted[2] + sorted[3];
    const double median = sorted[d / 2];
    if (kv == 0) {
      // 4 of 128 K channels (two RoPE pairs) hold most of the energy, each 8-20x the typical rms.
      EXPECT_GT(top4 / total, 0.6);
      EXPECT_GT(std::sqrt(sorted[3] / median), 6.0);
      EXPECT_LT(std::sqrt(sorted[0] / median), 30.0);
    } else {
      // V is milder: its loudest channels are a few times the typical one.
      EXPECT_LT(top4 / total, 0.3);
      EXPECT_GT(std::sqrt(sorted[0] / median), 1.5);
    }
  }
  // RoPE: K's channel pairs rotate with position, so a pair's mean over many tokens shrinks
  // towards 0 in the fast pairs even though the pre-rotation bias is not zero.
  const auto k = Group(g, 0, 0, 1, 0, n);
  double m0 = 0, m1 = 0;
  for (size_t i = 0; i < n; ++i) {
    m0 += k[i * d + 0];
    m1 += k[i * d + 1];
  }
  EXPECT_LT(std::fabs(m0 / n), 0.1);
  EXPECT_LT(std::fabs(m1 / n), 0.1);
}

TEST(Synthetic, GaussianMoments) {
  const SyntheticKv g(SyntheticKind::kGaussian, kGeo, 1);
  const auto x = Group(g, 0, 0, 0, 0, 1000);
  double s1 = 0, s2 = 0;
  for (float v : x) {
    s1 += v;
    s2 += double(v) * v;
  }
  EXPECT_NEAR(s1 / x.size(), 0.0, 0.01);
  EXPECT_NEAR(s2 / x.size(), 1.0, 0.02);
}

TEST(Synthetic, BadArguments) {
  const SyntheticKv g(SyntheticKind::kKv, kGeo, 1);
  std::vector<float> v(10 * kGeo.head_dim);
  EXPECT_FALSE(g.FillGroup(2, 0, 0, 0, 10, DType::kF32, v.data(), kGeo.head_dim).ok());
  EXPECT_FALSE(g.FillGroup(0, 2, 0, 0, 10, DType::kF32, v.data(), kGeo.head_dim).ok());
  EXPECT_FALSE(g.FillGroup(0, 0, 3, 0, 10, DType::kF32, v.data(), kGeo.head_dim).ok());
  EXPECT_FALSE(g.FillGroup(0, 0, 0, 10, 5, DType::kF32, v.data(), kGeo.head_dim).ok());
  EXPECT_FALSE(g.FillGroup(0, 0, 0, 0, 10, DType::kF32, nullptr, kGeo.head_dim).ok());
  EXPECT_FALSE(g.FillGroup(0, 0, 0, 0, 10, DType::kF32, v.data(), kGeo.head_dim - 1).ok());
  EXPECT_TRUE(g.FillGroup(0, 0, 0, 5, 5, DType::kF32, nullptr, 0).ok());
  EXPECT_EQ(ParseSyntheticKind("kv"), SyntheticKind::kKv);
  EXPECT_EQ(ParseSyntheticKind("gaussian"), SyntheticKind::kGaussian);
  EXPECT_FALSE(ParseSyntheticKind("uniform").has_value());
}

}  // namespace
}  // namespace tqkv
