// A synthetic session in memory for the checkpoint tests.
#ifndef TQKV_TESTS_CHECKPOINT_SESSION_UTIL_H_
#define TQKV_TESTS_CHECKPOINT_SESSION_UTIL_H_

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "tqkv/kv_cache.h"
#include "tqkv/synthetic.h"

namespace tqkv::testing_util {

inline std::unique_ptr<KvCacheBuffer> MakeSession(const ModelGeometry& g, uint64_t tokens,
                                                  DType dtype, uint64_t seed) {
  auto buf = KvCacheBuffer::Allocate("test-model", g, dtype, tokens);
  EXPECT_TRUE(buf.ok());
  SyntheticKv gen(SyntheticKind::kKv, g, seed);
  EXPECT_TRUE(gen.FillCache(buf.value()->cache()).ok());
  return std::move(buf).value();
}

// Keys: one fixed vector per (layer, head) with |μ_c| up to 300, plus N(0, 1) per token: the
// shared part holds > 99 % of the energy (like Qwen2.5's K bias). Values: N(0, 1). f32.
inline std::unique_ptr<KvCacheBuffer> SharedMeanSession(const ModelGeometry& g, uint64_t tokens) {
  auto buf = KvCacheBuffer::Allocate("shared-mean", g, DType::kF32, tokens).value();
  std::mt19937 rng(17);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<float> big(-300.0f, 300.0f);
  const size_t row = g.token_elems();
  for (uint32_t l = 0; l < g.layers; ++l) {
    std::vector<float> mu(row);
    for (float& m : mu) m = big(rng);
    auto* k = static_cast<float*>(buf->cache().k(l));
    auto* v = static_cast<float*>(buf->cache().v(l));
    for (uint64_t t = 0; t < tokens; ++t) {
      for (size_t i = 0; i < row; ++i) {
        k[t * row + i] = mu[i] + n01(rng);
        v[t * row + i] = n01(rng);
      }
    }
  }
  return buf;
}

}  // namespace tqkv::testing_util

#endif  // TQKV_TESTS_CHECKPOINT_SESSION_UTIL_H_
