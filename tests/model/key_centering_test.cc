// Key centering (the analysis behind `tqkv-bench migrate --center-keys`): the residual never grows,
// a shared component is removed, and uncentering restores the keys within fp16 rounding.
#include "model/key_centering.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "tqkv/types.h"

namespace tqkv::model {
namespace {

constexpr ModelGeometry kGeo{2, 3, 16};

// Keys: a per-head common vector plus noise, token 0 an outlier (an attention sink) far from it.
std::unique_ptr<KvCacheBuffer> MakeCache(uint64_t tokens) {
  auto buf = KvCacheBuffer::Allocate("t", kGeo, DType::kF16, tokens).value();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t row = kGeo.kv_heads * kGeo.head_dim;
  std::vector<float> common(row);
  for (auto& c : common) c = 4.f * nd(rng);
  for (uint32_t l = 0; l < kGeo.layers; ++l) {
    auto* k = static_cast<uint16_t*>(buf->cache().k(l));
    auto* v = static_cast<uint16_t*>(buf->cache().v(l));
    for (uint64_t t = 0; t < tokens; ++t) {
      for (size_t i = 0; i < row; ++i) {
        const float x = t == 0 ? -20.f * common[i] + nd(rng) : common[i] + nd(rng);
        k[t * row + i] = FloatToHalf(x);
        v[t * row + i] = FloatToHalf(nd(rng));
      }
    }
  }
  return buf;
}

double Norm2(const uint16_t* x, size_t d) {
  double s = 0;
  for (size_t i = 0; i < d; ++i) s += static_cast<double>(HalfToFloat(x[i])) * HalfToFloat(x[i]);
  return s;
}

TEST(KeyCentering, ResidualIsSmallerAndUncenterRestores) {
  const uint64_t tokens = 70;
  auto orig = MakeCache(tokens);
  auto res = KvCacheBuffer::Allocate("t", kGeo, DType::kF16, tokens).value();
  auto c = CenterKeys(orig->cache(), 32, res->cache());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->means.size(), kGeo.layers * 3u * kGeo.kv_heads * kGeo.head_dim);  // 3 blocks
  EXPECT_EQ(c->alphas.size(), kGeo.layers * tokens * kGeo.kv_heads);
  EXPECT_EQ(c->StoredBits(), 16 * (c->means.size() + c->alphas.size()));
  // The common component carries ~16/17 of the energy: the residual keeps little of it.
  EXPECT_LT(c->energy_fraction, 0.2);
  EXPECT_GT(c->energy_fraction, 0.0);
  const size_t row = kGeo.kv_heads * kGeo.head_dim, d = kGeo.head_dim;
  for (uint32_t l = 0; l < kGeo.layers; ++l) {
    const auto* k = static_cast<const uint16_t*>(orig->cache().k(l));
    const auto* r = static_cast<const uint16_t*>(res->cache().k(l));
    for (uint64_t t = 0; t < tokens; ++t) {
      for (size_t h = 0; h < kGeo.kv_heads; ++h) {
        // The projection never makes a vector longer, the sink included (fp16 slack).
        EXPECT_LE(Norm2(r + t * row + h * d, d), Norm2(k + t * row + h * d, d) * 1.001 + 1e-3);
      }
    }
    EXPECT_EQ(std::memcmp(orig->cache().v(l), res->cache().v(l), orig->cache().tensor_bytes()), 0);
  }
  ASSERT_TRUE(UncenterKeys(*c, res->cache()).ok());
  for (uint32_t l = 0; l < kGeo.layers; ++l) {
    const auto* k = static_cast<const uint16_t*>(orig->cache().k(l));
    const auto* r = static_cast<const uint16_t*>(res->cache().k(l));
    for (size_t i = 0; i < tokens * row; ++i) {
      const float a = HalfToFloat(k[i]), b = HalfToFloat(r[i]);
      ASSERT_NEAR(a, b, 0.02f + 4e-3f * std::fabs(a)) << "layer " << l << " element " << i;
    }
  }
}

TEST(KeyCentering, BadArgumentsAreErrors) {
  auto orig = MakeCache(8);
  auto other = KvCacheBuffer::Allocate("t", kGeo, DType::kF16, 9).value();
  EXPECT_FALSE(CenterKeys(orig->cache(), 0, orig->cache()).ok());
  EXPECT_FALSE(CenterKeys(orig->cache(), 4, other->cache()).ok());
  auto f32 = KvCacheBuffer::Allocate("t", kGeo, DType::kF32, 8).value();
  EXPECT_FALSE(CenterKeys(orig->cache(), 4, f32->cache()).ok());
  auto c = CenterKeys(orig->cache(), 4, orig->cache());  // in place is allowed
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(UncenterKeys(*c, other->cache()).ok());
}

}  // namespace
}  // namespace tqkv::model
