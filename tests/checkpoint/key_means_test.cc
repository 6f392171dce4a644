// Mean-removed keys (docs/format.md §4): on keys that share a dominant mean (like Qwen2.5's K bias),
// plain TurboQuant loses the part of each key that varies between tokens, centered keys keep it.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "checkpoint/key_means.h"
#include "checkpoint/session_util.h"
#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"
#include "tqkv/memory_store.h"

namespace tqkv::key_means_test {
namespace {

constexpr ModelGeometry kGeo{2, 2, 128};
constexpr uint64_t kTokens = 300;

std::unique_ptr<KvCacheBuffer> SharedMeanSession() {
  return testing_util::SharedMeanSession(kGeo, kTokens);
}

// Mean over all (layer, head, token) of cos(k̂ − m, k − m), m the head's mean key over the
// session (computed from the original): how well the varying part survives.
double VaryingPartCosine(const KvCache& original, const KvCache& restored) {
  const size_t d = kGeo.head_dim, row = kGeo.token_elems();
  double sum = 0;
  size_t count = 0;
  for (uint32_t l = 0; l < kGeo.layers; ++l) {
    const auto* k = static_cast<const float*>(original.k(l));
    const auto* r = static_cast<const float*>(restored.k(l));
    for (size_t h = 0; h < kGeo.kv_heads; ++h) {
      std::vector<double> m(d, 0.0);
      for (uint64_t t = 0; t < kTokens; ++t) {
        for (size_t i = 0; i < d; ++i) m[i] += k[t * row + h * d + i] / double(kTokens);
      }
      for (uint64_t t = 0; t < kTokens; ++t) {
        double dot = 0, a2 = 0, b2 = 0;
        for (size_t i = 0; i < d; ++i) {
          const double a = k[t * row + h * d + i] - m[i], b = r[t * row + h * d + i] - m[i];
          dot += a * b;
          a2 += a * a;
          b2 += b * b;
        }
        sum += dot / std::sqrt(a2 * b2);
        ++count;
      }
    }
  }
  return sum / count;
}

double CheckpointAndMeasure(const KvCache& session, uint32_t key_mean_block, uint64_t* bytes) {
  MemoryStore store;
  CheckpointOptions opts;
  opts.codec = ParseCodecSpec("tq3").value();
  opts.key_mean_block = key_mean_block;
  auto st = Checkpoint(session, opts, store, "s");
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  *bytes = st->bytes_written;
  RestoreOptions ro;
  ro.dtype = DType::kF32;
  auto restored = Restore(store, "s", ro);
  EXPECT_TRUE(restored.ok()) << restored.status().ToString();
  return VaryingPartCosine(session, (*restored)->cache());
}

TEST(KeyMeans, SharedMeanBreaksPlainTq3AndCenteredKeysRepairIt) {
  auto session = SharedMeanSession();
  uint64_t plain_bytes = 0, centered_bytes = 0;
  const double plain = CheckpointAndMeasure(session->cache(), 0, &plain_bytes);
  const double centered = CheckpointAndMeasure(session->cache(), kDefaultKeyMeanBlock, &centered_bytes);
  EXPECT_LT(plain, 0.7) << "plain tq3 should lose the varying part of keys with a dominant mean";
  EXPECT_GT(centered, 0.97);
  // Means (3 blocks x 2 heads x 128) and coefficients (2 heads x 300), f16, per layer, plus at
  // most one 4 KiB page of padding per layer.
  const uint64_t stored = kGeo.layers * (3 * 2 * 128 + 2 * kTokens) * 2;
  EXPECT_GE(centered_bytes, plain_bytes + stored);
  EXPECT_LE(centered_bytes, plain_bytes + stored + kGeo.layers * 4096);
}

TEST(KeyMeans, NonFiniteKeysDoNotPoisonTheirBlock) {
  ContainerHeader h;
  h.geometry = {1, 1, 16};
  h.tokens = 4;
  h.key_mean_block = 4;
  h.key_mean_dtype = DType::kF32;
  std::vector<float> k(4 * 16, 2.0f);
  k[1 * 16 + 3] = std::nanf("");
  k[2 * 16 + 5] = INFINITY;
  for (int i = 0; i < 16; ++i) k[3 * 16 + i] = 4.0f;
  std::vector<uint8_t> payload(KeyMeanValues(h, 0) * 4);
  ComputeKeyMeans(h, 0, k.data(), DType::kF32, payload);
  const KeyMeans m = KeyMeansAsF32(h, 0, payload);
  ASSERT_EQ(m.means.size(), 16u);
  ASSERT_EQ(m.alphas.size(), 4u);
  for (float mu : m.means) EXPECT_EQ(mu, 3.0f);  // tokens 0 and 3 only
  EXPECT_EQ(m.alphas[0], 2.0f / 3.0f);
  EXPECT_EQ(m.alphas[1], 0.0f);
  EXPECT_EQ(m.alphas[2], 0.0f);
  EXPECT_EQ(m.alphas[3], 4.0f / 3.0f);
  // A mean that f16 cannot hold is stored as 0 (the keys are then encoded as they are).
  h.key_mean_dtype = DType::kF16;
  for (float& x : k) x = 1e5f;
  std::vector<uint8_t> half(KeyMeanValues(h, 0) * 2);
  ComputeKeyMeans(h, 0, k.data(), DType::kF32, half);
  const KeyMeans mh = KeyMeansAsF32(h, 0, half);
  for (float mu : mh.means) EXPECT_EQ(mu, 0.0f);
  for (float a : mh.alphas) EXPECT_EQ(a, 0.0f);
}

TEST(KeyMeans, ParseAndFormat) {
  EXPECT_EQ(ParseKeyMeans("off")->block, 0u);
  EXPECT_EQ(ParseKeyMeans("session")->block, kKeyMeanPerSession);
  const KeyMeanSetting s = ParseKeyMeans("64,f32").value();
  EXPECT_EQ(s.block, 64u);
  EXPECT_EQ(s.dtype, DType::kF32);
  EXPECT_EQ(FormatKeyMeans(s), "64,f32");
  EXPECT_EQ(FormatKeyMeans(ParseKeyMeans("128").value()), "128");
  for (const char* bad : {"", "x", "12,bf16", "-1", "64,", "session,f8"}) {
    EXPECT_FALSE(ParseKeyMeans(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace tqkv::key_means_test
