// Engine layouts (kv_layout.h): a session checkpointed from a transposed or paged copy stores the
// same bytes as from the canonical layout; gather/scatter round trips; out-of-bounds layouts are
// refused; RestoreOptions::layer_ready reports each layer once it is in the destination.
#include "tqkv/kv_layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "checkpoint/session_util.h"
#include "tqkv/checkpoint.h"
#include "tqkv/memory_store.h"

namespace tqkv::kv_layout_test {
namespace {

constexpr ModelGeometry kGeo{3, 2, 64};
constexpr uint64_t kTokens = 50;

std::vector<uint8_t> ObjectBytes(Store& store, const std::string& key) {
  auto obj = store.Open(key);
  EXPECT_TRUE(obj.ok());
  std::vector<uint8_t> bytes((*obj)->Size());
  EXPECT_TRUE((*obj)->ReadAt(0, bytes).ok());
  return bytes;
}

TEST(KvLayout, TransposedSourceStoresTheCanonicalBytes) {
  auto session = testing_util::MakeSession(kGeo, kTokens, DType::kF16, 3);
  const KvCache& c = session->cache();
  // [kv_heads][tokens][head_dim], as transformers keeps a layer.
  KvLayout hnd;
  hnd.token_stride = kGeo.head_dim;
  hnd.head_stride = kTokens * kGeo.head_dim;
  const size_t elems = kTokens * kGeo.token_elems();
  ASSERT_TRUE(ValidateKvLayout(hnd, kGeo, kTokens, elems).ok());
  std::vector<std::vector<uint16_t>> k(kGeo.layers, std::vector<uint16_t>(elems)),
      v = k;
  std::vector<const void*> kp, vp;
  for (uint32_t l = 0; l < kGeo.layers; ++l) {
    ScatterLayer(c.k(l), hnd, kGeo, kTokens, DType::kF16, k[l].data());
    ScatterLayer(c.v(l), hnd, kGeo, kTokens, DType::kF16, v[l].data());
    // Spot check: token 7, head 1, channel 5 of K.
    EXPECT_EQ(k[l][1 * kTokens * 64 + 7 * 64 + 5],
              static_cast<const uint16_t*>(c.k(l))[7 * 128 + 64 + 5]);
    kp.push_back(k[l].data());
    vp.push_back(v[l].data());
  }
  MemoryStore store;
  CheckpointOptions opts;
  opts.codec = ParseCodecSpec("tq2.5").value();
  ASSERT_TRUE(Checkpoint(c, opts, store, "canonical").ok());
  LayoutKvSource source("test-model", kGeo, DType::kF16, kTokens, hnd, kp, vp);
  ASSERT_TRUE(Checkpoint(source, opts, store, "transposed").ok());
  EXPECT_EQ(ObjectBytes(store, "canonical"), ObjectBytes(store, "transposed"));
}

TEST(KvLayout, PagedScatterGatherRoundTrip) {
  auto session = testing_util::MakeSession(kGeo, kTokens, DType::kBF16, 4);
  KvLayout paged;
  paged.block_tokens = 16;  // 50 tokens: 4 blocks, the last partial
  paged.token_stride = kGeo.token_elems();
  paged.head_stride = kGeo.head_dim;
  paged.block_stride = 16 * kGeo.token_elems();
  paged.block_ids = {5, 0, 3, 1};
  const size_t pool_elems = 6 * 16 * kGeo.token_elems();
  ASSERT_TRUE(ValidateKvLayout(paged, kGeo, kTokens, pool_elems).ok());
  std::vector<uint16_t> pool(pool_elems, 0xFFFF), back(kTokens * kGeo.token_elems());
  const void* src = session->cache().k(1);
  ScatterLayer(src, paged, kGeo, kTokens, DType::kBF16, pool.data());
  // Token 17 is row 1 of block id 0.
  EXPECT_EQ(0, std::memcmp(&pool[1 * kGeo.token_elems()],
                           static_cast<const uint16_t*>(src) + 17 * kGeo.token_elems(),
                           kGeo.token_elems() * 2));
  EXPECT_EQ(pool[2 * 16 * kGeo.token_elems()], 0xFFFF);  // block 2 is in no slot: untouched
  GatherLayer(pool.data(), paged, kGeo, kTokens, DType::kBF16, back.data());
  EXPECT_EQ(0, std::memcmp(back.data(), src, back.size() * 2));
}

TEST(KvLayout, StridedChannelsRoundTrip) {
  auto session = testing_util::MakeSession(kGeo, kTokens, DType::kF32, 6);
  KvLayout l;  // [head_dim][tokens][kv_heads]: channels kTokens * kv_heads elements apart
  l.head_stride = 1;
  l.token_stride = kGeo.kv_heads;
  l.dim_stride = kTokens * kGeo.kv_heads;
  const size_t elems = kTokens * kGeo.token_elems();
  ASSERT_TRUE(ValidateKvLayout(l, kGeo, kTokens, elems).ok());
  std::vector<float> laid(elems), back(elems);
  const auto* src = static_cast<const float*>(session->cache().v(2));
  ScatterLayer(src, l, kGeo, kTokens, DType::kF32, laid.data());
  EXPECT_EQ(laid[5 * kTokens * 2 + 9 * 2 + 1], src[9 * 128 + 64 + 5]);  // channel 5, token 9, head 1
  GatherLayer(laid.data(), l, kGeo, kTokens, DType::kF32, back.data());
  EXPECT_EQ(0, std::memcmp(back.data(), src, elems * 4));
}

TEST(KvLayout, RefusesLayoutsOutsideTheTensor) {
  KvLayout l = KvLayout::Canonical(kGeo);
  EXPECT_TRUE(l.IsCanonical(kGeo));
  const size_t elems = kTokens * kGeo.token_elems();
  EXPECT_TRUE(ValidateKvLayout(l, kGeo, kTokens, elems).ok());
  EXPECT_FALSE(ValidateKvLayout(l, kGeo, kTokens + 1, elems).ok());
  l.token_stride = -1;
  EXPECT_FALSE(ValidateKvLayout(l, kGeo, kTokens, elems).ok());
  l = KvLayout::Canonical(kGeo);
  l.token_stride = INT64_MAX;  // would wrap a 64-bit offset
  EXPECT_FALSE(ValidateKvLayout(l, kGeo, kTokens, elems).ok());
  KvLayout p = KvLayout::Canonical(kGeo);
  p.block_tokens = 16;
  p.block_stride = 16 * kGeo.token_elems();
  p.block_ids = {0, 1, 2};  // 50 tokens need 4
  EXPECT_FALSE(ValidateKvLayout(p, kGeo, kTokens, 4 * 16 * kGeo.token_elems()).ok());
  p.block_ids = {0, 1, 2, 4};  // block 4 is past a 4-block pool
  EXPECT_FALSE(ValidateKvLayout(p, kGeo, kTokens, 4 * 16 * kGeo.token_elems()).ok());
  p.block_ids = {0, 1, 2, -1};
  EXPECT_FALSE(ValidateKvLayout(p, kGeo, kTokens, 4 * 16 * kGeo.token_elems()).ok());
}

TEST(KvLayout, LayerReadyReportsEachDecodedLayerInOrder) {
  auto session = testing_util::MakeSession(kGeo, kTokens, DType::kF16, 5);
  MemoryStore store;
  CheckpointOptions copts;
  copts.codec = ParseCodecSpec("tq3").value();
  ASSERT_TRUE(Checkpoint(session->cache(), copts, store, "s").ok());
  auto want = Restore(store, "s", {});
  ASSERT_TRUE(want.ok());
  auto dst = KvCacheBuffer::Allocate("test-model", kGeo, DType::kF16, kTokens).value();
  const size_t bytes = dst->cache().tensor_bytes();
  for (uint32_t l = 0; l < kGeo.layers; ++l) std::memset(dst->cache().k(l), 0, bytes);
  std::vector<uint32_t> seen;
  RestoreOptions ropts;
  ropts.layer_ready = [&](uint32_t layer) {
    // The layer is complete when reported; the next one is not written yet.
    EXPECT_EQ(0, std::memcmp(dst->cache().k(layer), (*want)->cache().k(layer), bytes));
    if (layer + 1 < kGeo.layers) {
      EXPECT_NE(0, std::memcmp(dst->cache().k(layer + 1), (*want)->cache().k(layer + 1), bytes));
    }
    seen.push_back(layer);
    return Status::Ok();
  };
  ASSERT_TRUE(RestoreInto(store, "s", dst->cache(), ropts).ok());
  EXPECT_EQ(seen, (std::vector<uint32_t>{0, 1, 2}));
  ropts.layer_ready = [](uint32_t layer) {
    return layer == 1 ? Status::Busy("stop here") : Status::Ok();
  };
  Status s = RestoreInto(store, "s", dst->cache(), ropts);
  EXPECT_EQ(s.code(), StatusCode::kBusy) << s.ToString();
}

}  // namespace
}  // namespace tqkv::kv_layout_test
