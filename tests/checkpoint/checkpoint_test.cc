// End-to-end checkpoint/restore: every preset through every store and io mode, bit-exact against
// a direct decode of the stored codes; streaming; geometry checks; per-layer overrides.
#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/session_util.h"
#include "format/container_layout.h"
#include "format/container_testing.h"
#include "store/store_test_util.h"
#include "tqkv/aligned_buffer.h"
#include "tqkv/container.h"
#include "store/testing/store_testing.h"
#include "tqkv/synthetic.h"
#include "tqkv/synthetic_source.h"
#include "tqkv/thread_pool.h"

namespace tqkv {
namespace {

constexpr ModelGeometry kSmall64{3, 2, 64};
constexpr ModelGeometry kSmall128{2, 2, 128};

using testing_util::MakeSession;

// The values of a key-means payload as f32, read field by field (docs/format.md §5): the means
// [head][block][head_dim], then the coefficients [head][token].
std::vector<float> MeansOf(const ContainerHeader& h, const std::vector<uint8_t>& payload) {
  std::vector<float> out;
  for (size_t i = 0; i < payload.size(); i += DTypeSize(h.key_mean_dtype)) {
    out.push_back(LoadAsFloat(payload.data() + i, h.key_mean_dtype, 0));
  }
  return out;
}

// Decodes every codes chunk of the stored container directly with the stored codec params; the
// keys of a layer with key means one vector at a time to f32, plus the block's mean.
std::unique_ptr<KvCacheBuffer> DirectDecode(Store& store, const std::string& key, DType dtype) {
  auto object = store.Open(key);
  EXPECT_TRUE(object.ok()) << object.status().ToString();
  auto reader = ContainerReader::Open(object->get(), key);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  const ContainerHeader& h = (*reader)->header();
  auto out = KvCacheBuffer::Allocate(h.model, h.geometry, dtype, h.tokens);
  EXPECT_TRUE(out.ok());
  std::vector<std::unique_ptr<Codec>> codecs;
  for (const auto& p : h.codecs) codecs.push_back(std::move(Codec::FromParams(p)).value());
  std::vector<uint8_t> meta, payload;
  std::vector<float> means;
  const size_t heads = h.geometry.kv_heads, d = h.geometry.head_dim;
  for (const ChunkEntry& e : (*reader)->chunks()) {
    payload.resize(e.size);
    EXPECT_TRUE((*reader)->ReadChunk(e, payload).ok());
    // V's codec: layer_codec_v from version 5 on (docs/format.md §4).
    const uint16_t v_index = h.layer_codec_v.empty() ? h.layer_codec[e.layer] : h.layer_codec_v[e.layer];
    const Codec& codec = *codecs[e.kv == 1 ? v_index : h.layer_codec[e.layer]];
    const size_t k_meta = codecs[h.layer_codec[e.layer]]->group_meta_bytes();
    if (e.type == ChunkType::kGroupMeta) {
      meta = payload;
      continue;
    }
    if (e.type == ChunkType::kKeyMeans) {
      means = MeansOf(h, payload);
      continue;
    }
    const size_t mb = codec.group_meta_bytes();
    auto* dst = static_cast<uint8_t*>((*out)->cache().tensor(e.layer, e.kv));
    for (size_t hd = 0; hd < heads; ++hd) {
      std::span<const uint8_t> m;
      if (mb) m = {meta.data() + e.kv * heads * k_meta + hd * mb, mb};  // K's masks, then V's
      const size_t cb = codec.code_bytes();
      if (e.kv == 0 && LayerHasKeyMeans(h, e.layer)) {
        const uint64_t blocks = KeyMeanBlocks(h, e.layer);
        EXPECT_EQ(means.size(), (blocks * d + h.tokens) * heads);
        std::vector<float> x(d);
        for (uint64_t t = 0; t < e.token_count; ++t) {
          const uint64_t tok = e.token_begin + t;
          EXPECT_TRUE(codec.Decode({payload.data() + (hd * e.token_count + t) * cb, cb}, 1, m,
                                   x.data(), DType::kF32, d)
                          .ok());
          const float* mu = means.data() + (hd * blocks + tok / h.key_mean_block) * d;
          const float a = means[blocks * heads * d + hd * h.tokens + tok];
          for (size_t i = 0; i < d; ++i) {
            const float am = a * mu[i];
            StoreFromFloat(dst, dtype, (tok * heads + hd) * d + i, x[i] + am);
          }
        }
        continue;
      }
      EXPECT_TRUE(codec
                      .Decode({payload.data() + hd * e.token_count * cb, e.token_count * cb},
                              e.token_count, m,
                              dst + (e.token_begin * heads * d + hd * d) * DTypeSize(dtype), dtype,
                              heads * d)
                      .ok());
    }
  }
  return std::move(out).value();
}

bool SameBytes(const KvCache& a, const KvCache& b) {
  if (a.geometry() != b.geometry() || a.tokens() != b.tokens() || a.dtype() != b.dtype()) return false;
  for (uint32_t l = 0; l < a.geometry().layers; ++l) {
    if (std::memcmp(a.k(l), b.k(l), a.tensor_bytes()) != 0) return false;
    if (std::memcmp(a.v(l), b.v(l), a.tensor_bytes()) != 0) return false;
  }
  return true;
}

struct StoreCase {
  std::string name;
  std::string io;  // empty: memory store
};

class CheckpointRoundTrip : public ::testing::TestWithParam<std::tuple<StoreCase, std::string>> {
 protected:
  void SetUp() override {
    const StoreCase& sc = std::get<0>(GetParam());
    if (sc.io.empty()) {
      store_ = std::make_unique<MemoryStore>();
    } else {
      ASSERT_TRUE(dir_.ok());
      auto s = OpenStore("file://" + dir_.path() + "?io=" + sc.io);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      store_ = std::move(s).value();
    }
  }
  testing_util::ScratchDir dir_;
  std::unique_ptr<Store> store_;
};

TEST_P(CheckpointRoundTrip, RestoreEqualsDirectDecodeBitForBit) {
  const std::string spec_text = std::get<1>(GetParam());
  ThreadPool pool(2);
  // Key means: off; the default (one block here); blocks of 24 (runs cross the chunks of 16).
  struct Means {
    uint32_t block;
    DType dtype;
  };
  for (const Means means : {Means{0, DType::kF32}, Means{kDefaultKeyMeanBlock, DType::kF32},
                            Means{24, DType::kF16}}) {
  for (const ModelGeometry& g : {kSmall64, kSmall128}) {
    const uint64_t tokens = 77;  // several chunks of 16 plus a short one
    auto session = MakeSession(g, tokens, DType::kF16, 7);
    CheckpointOptions opts;
    SetCodec(opts, ParseKvCodecSpec(spec_text).value());
    opts.token_block = 16;
    opts.pool = &pool;
    opts.key_mean_block = means.block;
    opts.key_mean_dtype = means.dtype;
    auto st = Checkpoint(session->cache(), opts, *store_, "s/one");
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_GT(st->bytes_written, 0u);
    EXPECT_EQ(st->fp16_bytes, g.SessionBytes(tokens, DType::kF16));

    for (DType dtype : {DType::kF16, DType::kF32, DType::kBF16}) {
      auto expected = DirectDecode(*store_, "s/one", dtype);
      RestoreOptions ro;
      ro.dtype = dtype;
      ro.pool = &pool;
      ro.inflight_bytes = 1;  // the smallest read-ahead ring exercises slot reuse
      RestoreStats rs;
      auto restored = Restore(*store_, "s/one", ro, &rs);
      ASSERT_TRUE(restored.ok()) << restored.status().ToString();
      EXPECT_TRUE(SameBytes(expected->cache(), (*restored)->cache()))
          << spec_text << " d=" << g.head_dim << " " << DTypeName(dtype) << " key means "
          << means.block;
      EXPECT_EQ(rs.tokens, tokens);
      EXPECT_EQ(rs.geometry, g);
    }
    if (spec_text == "fp16") {  // the raw codec is exactly lossless
      auto restored = Restore(*store_, "s/one", {});
      ASSERT_TRUE(restored.ok());
      EXPECT_TRUE(SameBytes(session->cache(), (*restored)->cache()));
    }
    {
      auto object = store_->Open("s/one");
      ASSERT_TRUE(object.ok());
      auto reader = ContainerReader::Open(object->get(), "s/one");
      ASSERT_TRUE(reader.ok());
      const bool tq = opts.codec.kind != CodecKind::kRaw;  // K's codec decides
      EXPECT_EQ(HasSeparateKvCodecs((*reader)->header()), opts.v_codec.has_value());
      EXPECT_EQ((*reader)->header().key_mean_block,
                tq ? std::min<uint32_t>(means.block, tokens) : 0u);
    }
  }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllPresetsAllStores, CheckpointRoundTrip,
    ::testing::Combine(::testing::Values(StoreCase{"memory", ""}, StoreCase{"buffered", "buffered"},
                                         StoreCase{"direct", "direct"}, StoreCase{"uring", "uring"}),
                       ::testing::Values("fp16", "tq2", "tq3", "tq4", "tq2.5", "tq3.5", "bf16",
                                         "tq3,norm=f16,nc=1", "tq:b=3,rot=haar", "k4v2",
                                         "k3v2", "k3.5v2.5", "k:tq2.5/v:fp16",
                                         "k:fp16/v:tq3,qjl=1", "kl:2.5", "kl:3,norm=f32",
                                         "k:kl:3/v:tq2")),
    [](const auto& info) {
      std::string s = std::get<0>(info.param).name + "_" + std::get<1>(info.param);
      for (char& c : s) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return s;
    });

TEST(Checkpoint, StoredCodesAreTheCodecsCodesVerbatim) {
  MemoryStore store;
  const ModelGeometry g = kSmall128;
  auto session = MakeSession(g, 40, DType::kF16, 3);
  CheckpointOptions opts;
  opts.codec = ParseCodecSpec("tq3").value();
  opts.token_block = 40;
  opts.key_mean_block = 0;
  ASSERT_TRUE(Checkpoint(session->cache(), opts, store, "k").ok());
  auto codec = Codec::Create(opts.codec, g.head_dim).value();
  auto object = store.Open("k").value();
  auto reader = ContainerReader::Open(object.get(), "k").value();
  const size_t heads = g.kv_heads, d = g.head_dim, cb = codec->code_bytes();
  for (const ChunkEntry& e : reader->chunks()) {
    std::vector<uint8_t> payload(e.size), fresh(e.size);
    ASSERT_TRUE(reader->ReadChunk(e, payload).ok());
    const auto* src = static_cast<const uint16_t*>(session->cache().tensor(e.layer, e.kv));
    for (size_t hd = 0; hd < heads; ++hd) {
      ASSERT_TRUE(codec
                      ->Encode(src + e.token_begin * heads * d + hd * d, DType::kF16, e.token_count,
                               heads * d, {}, {fresh.data() + hd * e.token_count * cb, e.token_count * cb})
                      .ok());
    }
    EXPECT_EQ(payload, fresh) << "layer " << e.layer << " kv " << int(e.kv);
  }
}

TEST(Checkpoint, CenteredKeyCodesAreTheCodesOfTheResiduals) {
  MemoryStore store;
  const ModelGeometry g = kSmall64;
  const uint64_t tokens = 45;
  auto session = MakeSession(g, tokens, DType::kF16, 9);
  CheckpointOptions opts;
  opts.codec = ParseCodecSpec("tq3").value();
  opts.token_block = 32;
  opts.key_mean_block = 20;  // blocks [0,20) [20,40) [40,45)
  opts.key_mean_dtype = DType::kF32;
  ASSERT_TRUE(Checkpoint(session->cache(), opts, store, "c").ok());
  auto codec = Codec::Create(opts.codec, g.head_dim).value();
  auto object = store.Open("c").value();
  auto reader = ContainerReader::Open(object.get(), "c").value();
  const ContainerHeader& h = reader->header();
  ASSERT_EQ(h.key_mean_block, 20u);
  ASSERT_EQ(KeyMeanBlocks(h, 0), 3u);
  const size_t heads = g.kv_heads, d = g.head_dim, row = heads * d, cb = codec->code_bytes();
  std::vector<float> means;
  int key_chunks = 0;
  for (const ChunkEntry& e : reader->chunks()) {
    std::vector<uint8_t> payload(e.size);
    ASSERT_TRUE(reader->ReadChunk(e, payload).ok());
    const auto* src = static_cast<const uint16_t*>(session->cache().tensor(e.layer, e.kv));
    if (e.type == ChunkType::kKeyMeans) {
      ASSERT_EQ(e.size, (3 * row + heads * tokens) * 4);
      means = MeansOf(h, payload);
      for (size_t hd = 0; hd < heads; ++hd) {  // the block means and coefficients, recomputed
        for (uint64_t b = 0; b < 3; ++b) {
          const uint64_t lo = b * 20, hi = std::min<uint64_t>(tokens, lo + 20);
          const float* mu = &means[(hd * 3 + b) * d];
          double mm = 0;
          for (size_t i = 0; i < d; ++i) {
            double acc = 0;
            for (uint64_t t = lo; t < hi; ++t) acc += HalfToFloat(src[t * row + hd * d + i]);
            EXPECT_EQ(mu[i], static_cast<float>(acc / double(hi - lo)));
            mm += double(mu[i]) * mu[i];
          }
          for (uint64_t t = lo; t < hi; ++t) {
            double dot = 0;
            for (size_t i = 0; i < d; ++i) dot += double(HalfToFloat(src[t * row + hd * d + i])) * mu[i];
            EXPECT_EQ(means[3 * row + hd * tokens + t], static_cast<float>(dot / mm));
          }
        }
      }
      continue;
    }
    if (e.kv != 0) continue;
    ++key_chunks;
    std::vector<uint8_t> fresh(e.size);
    std::vector<float> r(d);
    for (size_t hd = 0; hd < heads; ++hd) {
      for (uint64_t t = 0; t < e.token_count; ++t) {
        const uint64_t tok = e.token_begin + t;
        for (size_t i = 0; i < d; ++i) {
          const float am = means[3 * row + hd * tokens + tok] * means[(hd * 3 + tok / 20) * d + i];
          r[i] = HalfToFloat(src[tok * row + hd * d + i]) - am;
        }
        ASSERT_TRUE(codec->Encode(r.data(), DType::kF32, 1, d, {},
                                  {fresh.data() + (hd * e.token_count + t) * cb, cb})
                        .ok());
      }
    }
    EXPECT_EQ(payload, fresh) << "layer " << e.layer;
  }
  EXPECT_EQ(key_chunks, 3 * 2);
}

TEST(Checkpoint, StreamingRestoreHandsOutEveryLayerInOrder) {
  MemoryStore store;
  const ModelGeometry g = kSmall64;
  auto session = MakeSession(g, 50, DType::kF16, 11);
  CheckpointOptions opts;
  opts.codec = ParseCodecSpec("tq2.5").value();
  opts.token_block = 16;
  ASSERT_TRUE(Checkpoint(session->cache(), opts, store, "stream").ok());
  auto expected = DirectDecode(store, "stream", DType::kF16);
  std::vector<uint32_t> seen;
  Status s = RestoreStreaming(store, "stream", {}, [&](uint32_t layer, const void* k, const void* v) {
    seen.push_back(layer);
    EXPECT_EQ(std::memcmp(k, expected->cache().k(layer), expected->cache().tensor_bytes()), 0);
    EXPECT_EQ(std::memcmp(v, expected->cache().v(layer), expected->cache().tensor_bytes()), 0);
    return Status::Ok();
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(seen, (std::vector<uint32_t>{0, 1, 2}));
  // A callback error stops the restore and is returned.
  s = RestoreStreaming(store, "stream", {}, [](uint32_t layer, const void*, const void*) {
    return layer == 1 ? Status::Busy("engine full") : Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kBusy);
}

TEST(Checkpoint, PerLayerOverridesAreStoredAndDecoded) {
  MemoryStore store;
  const ModelGeometry g = kSmall64;
  auto session = MakeSession(g, 33, DType::kF32, 5);
  CheckpointOptions opts;
  opts.codec = ParseCodecSpec("tq3").value();
  opts.layer_overrides.push_back(ParseLayerCodec("0:tq4").value());
  opts.layer_overrides.push_back(ParseLayerCodec("2:fp16").value());
  ASSERT_TRUE(Checkpoint(session->cache(), opts, store, "mixed").ok());
  auto object = store.Open("mixed").value();
  auto reader = ContainerReader::Open(object.get(), "mixed").value();
  const auto& h = reader->header();
  ASSERT_EQ(h.codecs.size(), 3u);
  EXPECT_EQ(h.codecs[h.layer_codec[0]].subsets.at(0).bits, 4);
  EXPECT_EQ(h.codecs[h.layer_codec[1]].subsets.at(0).bits, 3);
  EXPECT_EQ(h.codecs[h.layer_codec[2]].kind, CodecKind::kRaw);
  auto expected = DirectDecode(store, "mixed", DType::kF32);
  RestoreOptions ro;
  ro.dtype = DType::kF32;
  auto restored = Restore(store, "mixed", ro);
  ASSERT_TRUE(restored.ok());
  EXPECT_TRUE(SameBytes(expected->cache(), (*restored)->cache()));
  EXPECT_FALSE(ParseLayerCodec("x:tq3").ok());
  EXPECT_FALSE(ParseLayerCodec("1").ok());
  opts.layer_overrides = {ParseLayerCodec("9:tq4").value()};  // no layer 9
  EXPECT_EQ(Checkpoint(session->cache(), opts, store, "bad").status().code(),
            StatusCode::kInvalidArgument);
}

// K/V overrides per layer: the stored indices, restore and streaming restore against the direct
// decode, and K and V code chunks of each codec's own size.
TEST(Checkpoint, PerLayerKvOverridesAreStoredAndDecoded) {
  MemoryStore store;
  const ModelGeometry g = kSmall64;
  const uint64_t tokens = 33;
  auto session = MakeSession(g, tokens, DType::kF32, 6);
  CheckpointOptions opts;
  SetCodec(opts, ParseKvCodecSpec("k4v2").value());
  opts.token_block = 16;
  opts.layer_overrides.push_back(ParseLayerCodec("1:k:fp16/v:tq2.5").value());
  opts.layer_overrides.push_back(ParseLayerCodec("2:tq3").value());
  ASSERT_TRUE(Checkpoint(session->cache(), opts, store, "kv").ok());
  auto object = store.Open("kv").value();
  auto reader = ContainerReader::Open(object.get(), "kv").value();
  const auto& h = reader->header();
  ASSERT_EQ(ContainerVersionFor(h), 6u);  // the guard's figures; separate K/V codecs as in 5
  ASSERT_TRUE(HasSeparateKvCodecs(h));
  ASSERT_EQ(h.layer_codec_v.size(), 3u);
  const auto label = [&](uint32_t l, uint8_t kv) { return CodecLabel(h.codecs[LayerCodecIndex(h, l, kv)]); };
  EXPECT_EQ(label(0, 0), "tq4");
  EXPECT_EQ(label(0, 1), "tq2");
  EXPECT_EQ(label(1, 0), "fp16");
  EXPECT_EQ(label(1, 1), "tq2.5");
  EXPECT_EQ(label(2, 0), "tq3");
  EXPECT_EQ(label(2, 1), "tq3");
  // Key means stay on for TurboQuant keys (layers 0 and 2), not for layer 1's raw keys.
  EXPECT_TRUE(LayerHasKeyMeans(h, 0));
  EXPECT_FALSE(LayerHasKeyMeans(h, 1));
  EXPECT_TRUE(LayerHasKeyMeans(h, 2));
  // Layer 1's group metadata is V's masks only (8 bytes per head at d = 64).
  uint64_t code_bytes[3][2] = {};
  for (const ChunkEntry& e : reader->chunks()) {
    if (e.type == ChunkType::kGroupMeta) {
      EXPECT_EQ(e.layer, 1u);
      EXPECT_EQ(e.size, g.kv_heads * 8u);
    }
    if (e.type == ChunkType::kCodes) code_bytes[e.layer][e.kv] += e.size;
  }
  for (uint32_t l = 0; l < 3; ++l) {
    for (uint8_t kv = 0; kv < 2; ++kv) {
      EXPECT_EQ(code_bytes[l][kv], tokens * g.kv_heads * CodeBytesOf(h.codecs[LayerCodecIndex(h, l, kv)]));
    }
  }
  EXPECT_EQ(code_bytes[0][0], tokens * g.kv_heads * (4 * 64 / 8 + 4));  // tq4: bits + f32 norm
  EXPECT_EQ(code_bytes[0][1], tokens * g.kv_heads * (2 * 64 / 8 + 4));  // tq2
  auto expected = DirectDecode(store, "kv", DType::kF32);
  RestoreOptions ro;
  ro.dtype = DType::kF32;
  auto restored = Restore(store, "kv", ro);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  EXPECT_TRUE(SameBytes(expected->cache(), (*restored)->cache()));
  uint32_t seen = 0;
  const size_t bytes = expected->cache().tensor_bytes();
  ASSERT_TRUE(RestoreStreaming(store, "kv", ro, [&](uint32_t l, const void* k, const void* v) {
                EXPECT_EQ(std::memcmp(k, expected->cache().k(l), bytes), 0) << l;
                EXPECT_EQ(std::memcmp(v, expected->cache().v(l), bytes), 0) << l;
                ++seen;
                return Status::Ok();
              }).ok());
  EXPECT_EQ(seen, 3u);
}

// Bits per value of a K/V session count every byte: K at 4 bits and V at 2 average about 3 plus
// the norms and the container, and the file is the sum of its parts.
TEST(Checkpoint, KvBitsPerValueAverageKAndV) {
  MemoryStore store;
  const ModelGeometry g{2, 2, 128};
  const uint64_t tokens = 512;
  auto session = MakeSession(g, tokens, DType::kF16, 8);
  uint64_t bytes[3] = {};
  const char* specs[3] = {"tq4", "tq2", "k4v2"};
  for (int i = 0; i < 3; ++i) {
    CheckpointOptions opts;
    SetCodec(opts, ParseKvCodecSpec(specs[i]).value());
    opts.key_mean_block = 0;
    auto st = Checkpoint(session->cache(), opts, store, specs[i]);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    bytes[i] = st->bytes_written;
  }
  const double values = 2.0 * g.layers * tokens * g.kv_heads * g.head_dim;
  const double bpv_k4v2 = 8.0 * bytes[2] / values;
  // Codes alone: (4·128 + 32) and (2·128 + 32) bits per 128 values: 4.25 and 2.25, mean 3.25.
  EXPECT_GT(bpv_k4v2, 3.25);
  EXPECT_LT(bpv_k4v2, 3.25 + 0.2);  // header, index, footer and padding at 512 tokens
  // Half of tq4's codes plus half of tq2's: the container of k4v2 is their mean within a page
  // per chunk (one more codec record, the V indices).
  EXPECT_NEAR(static_cast<double>(bytes[2]), (bytes[0] + bytes[1]) / 2.0, 4096.0 * 2);
}

TEST(Checkpoint, RestoreChecksGeometryAndTokens) {
  MemoryStore store;
  auto session = MakeSession(kSmall64, 20, DType::kF16, 1);
  CheckpointOptions opts;
  opts.codec = ParseCodecSpec("tq3").value();
  ASSERT_TRUE(Checkpoint(session->cache(), opts, store, "g").ok());
  auto other = KvCacheBuffer::Allocate("m", ModelGeometry{3, 2, 128}, DType::kF16, 20).value();
  Status s = RestoreInto(store, "g", other->cache(), {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected 3 layers x 2 KV heads x 128 dims"), std::string::npos)
      << s.ToString();
  auto shorter = KvCacheBuffer::Allocate("m", kSmall64, DType::kF16, 19).value();
  EXPECT_EQ(RestoreInto(store, "g", shorter->cache(), {}).code(), StatusCode::kInvalidArgument);
  ModelGeometry want{3, 2, 64};
  RestoreOptions ro;
  ro.expect_geometry = &want;
  EXPECT_TRUE(Restore(store, "g", ro).ok());
  EXPECT_EQ(Restore(store, "absent", {}).status().code(), StatusCode::kNotFound);
}

TEST(Checkpoint, StreamsFromASourceLayerByLayer) {
  MemoryStore store;
  const ModelGeometry g = kSmall64;
  auto source = MakeSyntheticSource("synthetic", g, DType::kF16, 64, 9);
  CheckpointOptions opts;
  opts.codec = ParseCodecSpec("fp16").value();
  auto st = Checkpoint(*source, opts, store, "src");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  auto same = MakeSession(g, 64, DType::kF16, 9);
  auto restored = Restore(store, "src", {});
  ASSERT_TRUE(restored.ok());
  EXPECT_TRUE(SameBytes(same->cache(), (*restored)->cache()));
  EXPECT_EQ((*restored)->cache().model(), "synthetic");
}

// A kl group whose norm scale g was edited to 2^127 (every checksum fixed) passed verify and
// restored infinities (issue 49, item 14): such metadata can decode finite codes to infinity, and
// the metadata check refuses it as Corruption before anything is decoded.
TEST(Checkpoint, KlNormScaleThatCanOverflowIsRefused) {
  testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(store.ok());
  auto session = MakeSession(kSmall64, 48, DType::kF16, 11);
  CheckpointOptions o;
  o.codec = *ParseCodecSpec("kl:2.5");
  ASSERT_TRUE(Checkpoint(session->cache(), o, **store, "s").ok());
  ASSERT_TRUE(VerifyObject(**store, "s").ok());
  ChunkEntry meta;
  {
    auto object = (*store)->Open("s");
    ASSERT_TRUE(object.ok());
    auto reader = ContainerReader::Open(object->get(), "s");
    ASSERT_TRUE(reader.ok());
    for (const ChunkEntry& e : (*reader)->chunks()) {
      if (e.type == ChunkType::kGroupMeta) {
        meta = e;
        break;
      }
    }
  }
  ASSERT_EQ(meta.type, ChunkType::kGroupMeta);
  const std::string path = dir.path() + "/s.tqkv";
  std::vector<uint8_t> f;
  {
    std::ifstream in(path, std::ios::binary);
    f.assign(std::istreambuf_iterator<char>(in), {});
  }
  const float g = 0x1p127f;  // layer 0 K head 0's g: after u8 bits[d], f16 mean[d], f16 scale[d]
  std::memcpy(&f[meta.offset + 5 * kSmall64.head_dim], &g, 4);
  // The chunk's checksum in the index (found by value), then the structural ones.
  const uint64_t fixed = format::Checksum(std::span<const uint8_t>(&f[meta.offset], meta.size));
  auto at = std::search(f.begin() + meta.offset + meta.size, f.end(),
                        reinterpret_cast<const uint8_t*>(&meta.checksum),
                        reinterpret_cast<const uint8_t*>(&meta.checksum) + 8);
  ASSERT_NE(at, f.end());
  std::memcpy(&*at, &fixed, 8);
  format::ResignContainerForTesting(f);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(f.data()), static_cast<std::streamsize>(f.size()));
  }
  const Status v = VerifyObject(**store, "s");
  EXPECT_EQ(v.code(), StatusCode::kCorruption) << v.ToString();
  EXPECT_NE(v.message().find("can decode a finite code to infinity"), std::string::npos)
      << v.ToString();
  auto r = Restore(**store, "s", RestoreOptions{});
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
}

}  // namespace
}  // namespace tqkv
