// Ragged sessions (format version 7): a KvCache whose layers hold different token counts is
// checkpointed as it is, restored by the canonical host restore into the same shape, verified,
// and refused clearly by the destinations of one token count (layout tensors, streaming, device).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "checkpoint/device_sink.h"
#include "tqkv/checkpoint.h"
#include "tqkv/container.h"
#include "tqkv/kv_cache.h"
#include "tqkv/kv_layout.h"
#include "tqkv/memory_store.h"
#include "tqkv/safetensors.h"

namespace tqkv {
namespace {

const ModelGeometry kGeometry{3, 2, 32};
const std::vector<uint64_t> kLayerTokens{70, 13, 70};

std::unique_ptr<KvCacheBuffer> RaggedSession(DType dtype) {
  auto buf = KvCacheBuffer::Allocate("ragged", kGeometry, dtype, 70, kLayerTokens).value();
  std::mt19937 rng(5);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  KvCache& c = buf->cache();
  for (uint32_t l = 0; l < kGeometry.layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      auto* p = static_cast<uint16_t*>(c.tensor(l, kv));
      for (size_t i = 0; i < c.layer_tokens(l) * kGeometry.token_elems(); ++i) {
        p[i] = FloatToHalf(n01(rng) + (kv == 0 ? 3.0f : 0.0f));
      }
    }
  }
  return buf;
}

std::unique_ptr<ContainerReader> OpenHeader(MemoryStore& store, const std::string& key,
                                            std::unique_ptr<ReadableObject>& object) {
  object = store.Open(key).value();
  return ContainerReader::Open(object.get(), key).value();
}

TEST(RaggedSessionTest, KvCacheHoldsOnlyEachLayersTokens) {
  auto buf = RaggedSession(DType::kF16);
  const KvCache& c = buf->cache();
  EXPECT_TRUE(c.ragged());
  EXPECT_EQ(c.layer_tokens(1), 13u);
  EXPECT_EQ(c.tensor_bytes(1), 13u * 64 * 2);
  EXPECT_EQ(c.tensor_bytes(0), 70u * 64 * 2);
  // Counts of every layer full make it rectangular; bad counts are refused.
  auto full = KvCacheBuffer::Allocate("r", kGeometry, DType::kF16, 70, {70, 70, 70}).value();
  EXPECT_FALSE(full->cache().ragged());
  EXPECT_FALSE(KvCacheBuffer::Allocate("r", kGeometry, DType::kF16, 70, {70, 71, 70}).ok());
  EXPECT_FALSE(KvCacheBuffer::Allocate("r", kGeometry, DType::kF16, 70, {70, 0, 70}).ok());
  EXPECT_FALSE(KvCacheBuffer::Allocate("r", kGeometry, DType::kF16, 70, {70, 1}).ok());
  EXPECT_FALSE(KvCacheBuffer::Allocate("r", kGeometry, DType::kF16, 70, {69, 13, 69}).ok());
}

TEST(RaggedSessionTest, Fp16RoundTripIsExactAndTheObjectHoldsOnlyWhatIsThere) {
  auto buf = RaggedSession(DType::kF16);
  MemoryStore store;
  CheckpointOptions opts;
  opts.codec = *ParseCodecSpec("fp16");
  opts.token_block = 16;
  auto st = Checkpoint(buf->cache(), opts, store, "s");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  // (70 + 13 + 70) tokens x 2 x 64 x 2 bytes held; fp16_bytes counts those, not 3 x 70.
  EXPECT_EQ(st->fp16_bytes, 153u * 2 * 64 * 2);
  std::unique_ptr<ReadableObject> object;
  auto reader = OpenHeader(store, "s", object);
  EXPECT_EQ(reader->header().layer_tokens, kLayerTokens);
  EXPECT_EQ(reader->header().tokens, 70u);
  ASSERT_TRUE(VerifyObject(store, "s").ok());
  RestoreOptions ro;
  ro.dtype = DType::kF16;
  auto back = Restore(store, "s", ro);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const KvCache& r = (*back)->cache();
  ASSERT_EQ(r.layer_token_counts(), kLayerTokens);
  for (uint32_t l = 0; l < kGeometry.layers; ++l) {
    EXPECT_EQ(0, std::memcmp(r.k(l), buf->cache().k(l), r.tensor_bytes(l))) << l;
    EXPECT_EQ(0, std::memcmp(r.v(l), buf->cache().v(l), r.tensor_bytes(l))) << l;
  }
  // Into a caller's ragged KvCache of the same shape; one of another shape is refused.
  auto dst = KvCacheBuffer::Allocate("d", kGeometry, DType::kF16, 70, kLayerTokens).value();
  ASSERT_TRUE(RestoreInto(store, "s", dst->cache(), ro).ok());
  EXPECT_EQ(0, std::memcmp(dst->cache().k(1), buf->cache().k(1), dst->cache().tensor_bytes(1)));
  auto rect = KvCacheBuffer::Allocate("d", kGeometry, DType::kF16, 70).value();
  Status s = RestoreInto(store, "s", rect->cache(), ro);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

// RestoreInto with a MakeCache: the cache is made from the header (its shape, any dtype), the
// engine state comes back in the stats; a cache that does not fit, or none, is refused.
TEST(RaggedSessionTest, RestoreIntoACacheMadeFromTheHeader) {
  auto buf = RaggedSession(DType::kF16);
  MemoryStore store;
  CheckpointOptions opts;
  opts.codec = *ParseCodecSpec("fp16");
  opts.engine_state = {7, 8};
  ASSERT_TRUE(Checkpoint(buf->cache(), opts, store, "s").ok());
  std::unique_ptr<KvCacheBuffer> made;
  RestoreStats st;
  Status s = RestoreInto(
      store, "s",
      [&](const ContainerHeader& h) -> Result<KvCache*> {
        TQKV_ASSIGN_OR_RETURN(made, KvCacheBuffer::Allocate(h.model, h.geometry, DType::kF32,
                                                            h.tokens, h.layer_tokens));
        return &made->cache();
      },
      RestoreOptions{}, &st);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(st.engine_state, (std::vector<uint8_t>{7, 8}));
  EXPECT_EQ(made->cache().dtype(), DType::kF32);
  const auto* k = static_cast<const float*>(made->cache().k(1));
  const auto* want = static_cast<const uint16_t*>(buf->cache().k(1));
  EXPECT_EQ(k[5], HalfToFloat(want[5]));
  auto rect = KvCacheBuffer::Allocate("d", kGeometry, DType::kF16, 70).value();
  s = RestoreInto(
      store, "s", [&](const ContainerHeader&) -> Result<KvCache*> { return &rect->cache(); },
      RestoreOptions{});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  const MakeCache none = [](const ContainerHeader&) -> Result<KvCache*> {
    return static_cast<KvCache*>(nullptr);
  };
  s = RestoreInto(store, "s", none, RestoreOptions{});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

TEST(RaggedSessionTest, LossyCodecsKeyMeansExactRowsAndTheGuardFollowEachLayer) {
  auto buf = RaggedSession(DType::kF16);
  MemoryStore store;
  CheckpointOptions opts;
  opts.codec = *ParseCodecSpec("tq3");
  opts.token_block = 16;
  opts.exact_head = 2;
  opts.exact_tail = 20;  // clamped to the shortest layer: 2 + 11
  opts.key_mean_block = 8;
  opts.guard = true;
  auto st = Checkpoint(buf->cache(), opts, store, "q");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_TRUE(st->guard_exceeded.empty());
  std::unique_ptr<ReadableObject> object;
  auto reader = OpenHeader(store, "q", object);
  const ContainerHeader& h = reader->header();
  EXPECT_EQ(h.exact_head, 2u);
  EXPECT_EQ(h.exact_tail, 11u);
  EXPECT_EQ(h.guard_stride, 1u);
  ASSERT_TRUE(VerifyObject(store, "q").ok());
  RestoreOptions ro;
  ro.dtype = DType::kF16;
  auto back = Restore(store, "q", ro);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const KvCache& r = (*back)->cache();
  const size_t row = kGeometry.token_elems() * 2;
  for (uint32_t l = 0; l < kGeometry.layers; ++l) {
    const uint64_t n = kLayerTokens[l];
    for (int kv = 0; kv < 2; ++kv) {
      const auto* a = static_cast<const uint8_t*>(r.tensor(l, kv));
      const auto* b = static_cast<const uint8_t*>(buf->cache().tensor(l, kv));
      EXPECT_EQ(0, std::memcmp(a, b, 2 * row)) << "exact head, layer " << l;
      EXPECT_EQ(0, std::memcmp(a + (n - 11) * row, b + (n - 11) * row, 11 * row))
          << "exact tail, layer " << l;
      if (n > 13) {
        EXPECT_NE(0, std::memcmp(a + 2 * row, b + 2 * row, (n - 13) * row)) << l;
      }
    }
  }
}

TEST(RaggedSessionTest, DestinationsOfOneTokenCountRefuseItClearly) {
  auto buf = RaggedSession(DType::kF16);
  MemoryStore store;
  CheckpointOptions opts;
  opts.codec = *ParseCodecSpec("fp16");
  ASSERT_TRUE(Checkpoint(buf->cache(), opts, store, "s").ok());
  // Layout tensors (as vLLM's or the Python package's): refused before a byte is written.
  std::vector<std::vector<uint16_t>> mem(6, std::vector<uint16_t>(70 * 64, 0xABCD));
  LayoutTensors dst;
  dst.geometry = kGeometry;
  dst.dtype = DType::kF16;
  dst.tokens = 70;
  dst.layout = KvLayout::Canonical(kGeometry);
  dst.tensor_elems = 70 * 64;
  for (uint32_t l = 0; l < 3; ++l) {
    dst.k.push_back(mem[2 * l].data());
    dst.v.push_back(mem[2 * l + 1].data());
  }
  Status s = RestoreInto(store, "s", dst, RestoreOptions{});
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  EXPECT_NE(s.message().find("different counts"), std::string::npos) << s.ToString();
  for (const auto& m : mem) EXPECT_EQ(m[0], 0xABCD);
  // Streaming: its callback's tensors have one token count.
  int calls = 0;
  s = RestoreStreaming(store, "s", RestoreOptions{}, [&](uint32_t, const void*, const void*) {
    ++calls;
    return Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  EXPECT_EQ(calls, 0);
  // The device plan (GPU restores) likewise.
  std::unique_ptr<ReadableObject> object;
  auto reader = OpenHeader(store, "s", object);
  EXPECT_EQ(MakeDevicePlan(reader->header()).status().code(), StatusCode::kUnsupported);
}

// decompress writes each layer's own shape; compress reads it back as the same ragged cache.
TEST(RaggedSessionTest, SafetensorsKeepEachLayersTokens) {
  auto buf = RaggedSession(DType::kF16);
  const std::string path = ::testing::TempDir() + "/ragged.safetensors";
  ASSERT_TRUE(WriteSafetensors(buf->cache(), path).ok());
  auto back = ReadSafetensors(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const KvCache& r = (*back)->cache();
  EXPECT_EQ(r.tokens(), 70u);
  ASSERT_EQ(r.layer_token_counts(), kLayerTokens);
  for (uint32_t l = 0; l < kGeometry.layers; ++l) {
    EXPECT_EQ(0, std::memcmp(r.k(l), buf->cache().k(l), r.tensor_bytes(l))) << l;
    EXPECT_EQ(0, std::memcmp(r.v(l), buf->cache().v(l), r.tensor_bytes(l))) << l;
  }
}

}  // namespace
}  // namespace tqkv
