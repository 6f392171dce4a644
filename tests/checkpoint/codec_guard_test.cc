// The guard (docs/codec.md §9, format version 6): a session whose keys share a dominant mean,
// checkpointed with plain TurboQuant (--key-means off), trips it (and --strict refuses it, leaving
// nothing in the store); the default (mean-removed keys) passes; the figures are stored.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "checkpoint/codec_guard.h"
#include "checkpoint/session_util.h"
#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"
#include "tqkv/container.h"
#include "tqkv/describe.h"
#include "tqkv/memory_store.h"
#include "tqkv/synthetic.h"

namespace tqkv::codec_guard_test {
namespace {

constexpr ModelGeometry kGeo{2, 2, 128};
constexpr uint64_t kTokens = 300;

CheckpointOptions Tq3(uint32_t key_mean_block) {
  CheckpointOptions o;
  o.codec = ParseCodecSpec("tq3").value();
  o.key_mean_block = key_mean_block;
  return o;
}

ContainerHeader StoredHeader(MemoryStore& store, const std::string& key) {
  auto object = store.Open(key);
  EXPECT_TRUE(object.ok()) << object.status().ToString();
  auto reader = ContainerReader::Open(object->get(), key);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  return (*reader)->header();
}

TEST(CodecGuard, PlainKeysWithASharedMeanTripTheGuard) {
  auto session = testing_util::SharedMeanSession(kGeo, kTokens);
  MemoryStore store;
  auto st = Checkpoint(session->cache(), Tq3(0), store, "plain");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_EQ(st->codec_error.size(), 2u * kGeo.layers);
  EXPECT_EQ(st->guard_stride, 1u);
  // Every layer's K: the error of a 3-bit code of the whole vector (~0.034 of ~300²·128) against
  // a varying part of ~128 per key: far above 1. V (N(0, 1)) is the codec's own ~0.034.
  EXPECT_EQ(st->guard_exceeded, (std::vector<uint32_t>{0, 2}));
  for (uint32_t l = 0; l < kGeo.layers; ++l) {
    EXPECT_GT(RelativeError(st->codec_error[2 * l]), 10.0);
    EXPECT_GT(SharedFraction(st->codec_error[2 * l]), 0.99);
    EXPECT_NEAR(RelativeError(st->codec_error[2 * l + 1]), 0.034, 0.004);
  }
  const std::string said = DescribeGuardExceeded(st->codec_error, st->guard_exceeded, 0.5);
  EXPECT_NE(said.find("layer 0 K: "), std::string::npos) << said;
  EXPECT_NE(said.find("layer 1 K: "), std::string::npos) << said;
  // Stored as measured (format version 6).
  const ContainerHeader h = StoredHeader(store, "plain");
  EXPECT_EQ(ContainerVersionFor(h), 6u);
  EXPECT_EQ(h.guard_stride, 1u);
  EXPECT_EQ(h.codec_error, st->codec_error);
}

TEST(CodecGuard, StrictRefusesAndLeavesNothing) {
  auto session = testing_util::SharedMeanSession(kGeo, kTokens);
  MemoryStore store;
  CheckpointOptions o = Tq3(0);
  o.strict = true;
  auto st = Checkpoint(session->cache(), o, store, "s");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("layer 0 K"), std::string::npos) << st.status().ToString();
  EXPECT_NE(st.status().message().find("guard"), std::string::npos) << st.status().ToString();
  EXPECT_FALSE(store.Open("s").ok());
  // A previous object under the key stays as it was.
  ASSERT_TRUE(Checkpoint(session->cache(), Tq3(128), store, "s").ok());
  const ContainerHeader before = StoredHeader(store, "s");
  EXPECT_FALSE(Checkpoint(session->cache(), o, store, "s").ok());
  EXPECT_EQ(StoredHeader(store, "s").codec_error, before.codec_error);
}

TEST(CodecGuard, DefaultKeyMeansPass) {
  auto session = testing_util::SharedMeanSession(kGeo, kTokens);
  MemoryStore store;
  CheckpointOptions o = Tq3(kDefaultKeyMeanBlock);
  o.strict = true;
  auto st = Checkpoint(session->cache(), o, store, "c");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_TRUE(st->guard_exceeded.empty());
  for (const TensorCodecError& e : st->codec_error) {
    EXPECT_LT(RelativeError(e), 0.05);
    EXPECT_GT(RelativeError(e), 0.02);
  }
}

// The stored figure is the error of what a restore returns on the sampled tokens.
TEST(CodecGuard, FiguresMatchTheRestoredSession) {
  const ModelGeometry g{3, 2, 64};
  const uint64_t tokens = 2500;  // stride 3: tokens 0, 3, 6, ...
  auto session = testing_util::MakeSession(g, tokens, DType::kF16, 5);
  for (const char* spec : {"tq3", "tq2.5"}) {
    SCOPED_TRACE(spec);
    MemoryStore store;
    CheckpointOptions o;
    o.codec = ParseCodecSpec(spec).value();
    auto st = Checkpoint(session->cache(), o, store, "x");
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    ASSERT_EQ(st->guard_stride, GuardStride(tokens));
    ASSERT_EQ(st->guard_stride, 3u);
    RestoreOptions ro;
    ro.dtype = DType::kF32;
    auto restored = Restore(store, "x", ro);
    ASSERT_TRUE(restored.ok());
    const size_t d = g.head_dim, row = g.token_elems();
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        const void* x = session->cache().tensor(l, kv);
        const auto* r = static_cast<const float*>((*restored)->cache().tensor(l, kv));
        TensorCodecError want;
        for (size_t h = 0; h < g.kv_heads; ++h) {
          std::vector<double> mean(d, 0.0);
          uint64_t n = 0;
          for (uint64_t t = 0; t < tokens; t += 3, ++n) {
            for (size_t c = 0; c < d; ++c) mean[c] += LoadAsFloat(x, DType::kF16, t * row + h * d + c);
          }
          for (double& m : mean) m /= double(n);
          for (uint64_t t = 0; t < tokens; t += 3) {
            for (size_t c = 0; c < d; ++c) {
              const double v = LoadAsFloat(x, DType::kF16, t * row + h * d + c);
              const double e = v - r[t * row + h * d + c];
              want.err += e * e;
              want.var += (v - mean[c]) * (v - mean[c]);
              want.energy += v * v;
            }
          }
        }
        const TensorCodecError& got = st->codec_error[2 * l + kv];
        EXPECT_NEAR(got.err, want.err, 1e-6 * want.var + 1e-9) << l << " " << kv;
        EXPECT_NEAR(got.var, want.var, 1e-9 * want.var);
        EXPECT_NEAR(got.energy, want.energy, 1e-9 * want.energy);
      }
    }
  }
  // A raw session has no codec error to measure: no second pass over the source, none recorded.
  MemoryStore store;
  CheckpointOptions o;
  o.codec = ParseCodecSpec("fp16").value();
  auto st = Checkpoint(session->cache(), o, store, "raw");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->guard_stride, 0u);
  EXPECT_TRUE(st->codec_error.empty());
}

TEST(CodecGuard, OffWritesTheOldVersionAndInspectSaysNotRecorded) {
  auto session = testing_util::MakeSession(kGeo, 40, DType::kF16, 2);
  MemoryStore store;
  CheckpointOptions o = Tq3(kDefaultKeyMeanBlock);
  o.guard = false;
  auto st = Checkpoint(session->cache(), o, store, "old");
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->codec_error.empty());
  auto object = store.Open("old");
  auto reader = ContainerReader::Open(object->get(), "old");
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(ContainerVersionFor((*reader)->header()), 4u);
  const std::string json = ContainerDescriptionJson(DescribeContainer(**reader), false);
  EXPECT_NE(json.find("\"recorded\": false"), std::string::npos) << json;
}

TEST(CodecGuard, InspectJsonShowsTheFigures) {
  auto session = testing_util::SharedMeanSession(kGeo, kTokens);
  MemoryStore store;
  ASSERT_TRUE(Checkpoint(session->cache(), Tq3(0), store, "p").ok());
  auto object = store.Open("p");
  auto reader = ContainerReader::Open(object->get(), "p");
  ASSERT_TRUE(reader.ok());
  const std::string json = ContainerDescriptionJson(DescribeContainer(**reader), false);
  EXPECT_NE(json.find("\"recorded\": true"), std::string::npos) << json;
  EXPECT_NE(json.find("\"exceeded\": [\n      \"layer 0 K\",\n      \"layer 1 K\"\n    ]"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"rel_err\""), std::string::npos);
}

TEST(CodecGuard, ZeroTokensRecordsNothing) {
  auto session = testing_util::MakeSession(kGeo, 0, DType::kF16, 2);
  MemoryStore store;
  auto st = Checkpoint(session->cache(), Tq3(kDefaultKeyMeanBlock), store, "z");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->guard_stride, 0u);
}

}  // namespace
}  // namespace tqkv::codec_guard_test
