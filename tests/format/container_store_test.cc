// The container with real codecs and real (test) stores: params stored in the header decode the
// stored codes bit for bit; short writes, bit rot and read errors from FaultInjectionStore surface
// as Corruption (or the store's IoError), never as wrong data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "format/container_test_util.h"
#include "tqkv/codec.h"
#include "tqkv/container.h"
#include "store/testing/store_testing.h"

namespace tqkv {
namespace {

using namespace testing_format;  // NOLINT

std::unique_ptr<Codec> MakeCodec(const char* spec, uint32_t d) {
  auto s = ParseCodecSpec(spec);
  EXPECT_TRUE(s.ok()) << spec << ": " << s.status().ToString();
  if (!s.ok()) return nullptr;
  auto c = Codec::Create(*s, d);
  EXPECT_TRUE(c.ok()) << spec << ": " << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// A session encoded with one codec per layer, written chunk by chunk as a checkpoint would.
struct Session {
  ContainerHeader header;
  std::vector<std::unique_ptr<Codec>> codecs;
  std::vector<std::vector<float>> tensors;  // [layer * 2 + kv]: [token][head][d] f32
};

Session MakeSession(const std::vector<const char*>& specs, ModelGeometry g, uint64_t tokens,
                    uint32_t block) {
  Session s;
  std::vector<CodecParams> params;
  std::vector<uint16_t> layer_codec;
  for (const char* spec : specs) {
    s.codecs.push_back(MakeCodec(spec, g.head_dim));
    if (s.codecs.back() == nullptr) return s;
    params.push_back(s.codecs.back()->params());
  }
  for (uint32_t l = 0; l < g.layers; ++l) layer_codec.push_back(l % specs.size());
  s.header = MakeHeader(g, tokens, block, params, layer_codec);
  s.header.source_dtype = DType::kF32;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal;
  for (uint32_t i = 0; i < 2 * g.layers; ++i) {
    std::vector<float> t(tokens * g.token_elems());
    for (size_t j = 0; j < t.size(); ++j) t[j] = normal(rng) * (j % g.head_dim == 3 ? 8.f : 1.f);
    s.tensors.push_back(std::move(t));
  }
  return s;
}

// Writes the session into `out`; payloads follow the chunk layout of container.h.
Status WriteSession(const Session& s, WritableObject* out) {
  TQKV_ASSIGN_OR_RETURN(auto writer, ContainerWriter::Create(out, s.header));
  const ModelGeometry& g = s.header.geometry;
  const size_t stride = g.token_elems();
  for (const ChunkEntry& key : ExpectedKeys(s.header)) {
    const Codec& codec = *s.codecs[s.header.layer_codec[key.layer]];
    std::vector<uint8_t> payload(ChunkBytes(s.header, key));
    std::vector<std::vector<uint8_t>> meta(2 * g.kv_heads);
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        auto& m = meta[kv * g.kv_heads + h];
        m.resize(codec.group_meta_bytes());
        const float* x = s.tensors[key.layer * 2 + kv].data() + h * g.head_dim;
        TQKV_RETURN_IF_ERROR(codec.SelectGroupMeta(x, DType::kF32, s.header.tokens, stride, m));
      }
    }
    if (key.type == ChunkType::kGroupMeta) {  // [K heads][V heads]
      size_t at = 0;
      for (const auto& m : meta) {
        std::memcpy(payload.data() + at, m.data(), m.size());
        at += m.size();
      }
    } else {  // [head][token][code_bytes]
      const size_t cb = codec.code_bytes();
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        const float* x = s.tensors[key.layer * 2 + key.kv].data() + key.token_begin * stride +
                         h * g.head_dim;
        std::span<uint8_t> out_codes(payload.data() + h * key.token_count * cb,
                                     key.token_count * cb);
        TQKV_RETURN_IF_ERROR(codec.Encode(x, DType::kF32, key.token_count, stride,
                                          meta[key.kv * g.kv_heads + h], out_codes));
      }
    }
    TQKV_RETURN_IF_ERROR(writer->AddChunk(key, payload));
  }
  return writer->Finish();
}

TEST(ContainerStoreTest, StoredParamsDecodeBitForBit) {
  Session s = MakeSession({"fp16", "tq3", "tq2.5", "tq4,qjl=1"}, {4, 2, 64}, 37, 16);
  ASSERT_EQ(s.codecs.size(), 4u);
  for (const auto& c : s.codecs) ASSERT_NE(c, nullptr);
  MemoryStore store;
  {
    auto out = store.Create("sessions/a.tqkv");
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ASSERT_TRUE(WriteSession(s, out->get()).ok());
    ASSERT_TRUE((*out)->Commit().ok());
  }
  auto in = store.Open("sessions/a.tqkv");
  ASSERT_TRUE(in.ok());
  auto reader = ContainerReader::Open(in->get(), "sessions/a.tqkv");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const ContainerHeader& h = (*reader)->header();
  ASSERT_EQ(h.codecs.size(), 4u);
  EXPECT_EQ((*reader)->chunks().size(), ExpectedKeys(s.header).size());
  const ModelGeometry& g = h.geometry;

  // Codecs rebuilt from the stored parameters alone.
  std::vector<std::unique_ptr<Codec>> stored;
  for (size_t i = 0; i < h.codecs.size(); ++i) {
    EXPECT_TRUE(h.codecs[i] == s.codecs[i]->params()) << "codec " << i;
    auto c = Codec::FromParams(h.codecs[i]);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    stored.push_back(std::move(c).value());
  }
  std::vector<std::vector<uint8_t>> meta_of_layer(g.layers);
  size_t decoded_vectors = 0;
  for (const ChunkEntry& e : (*reader)->chunks()) {
    std::vector<uint8_t> payload(e.size);
    ASSERT_TRUE((*reader)->ReadChunk(e, payload).ok());
    if (e.type == ChunkType::kGroupMeta) {
      meta_of_layer[e.layer] = payload;
      continue;
    }
    const uint16_t ci = h.layer_codec[e.layer];
    const size_t cb = stored[ci]->code_bytes(), mb = stored[ci]->group_meta_bytes();
    for (uint32_t head = 0; head < g.kv_heads; ++head) {
      std::span<const uint8_t> codes(payload.data() + head * e.token_count * cb,
                                     e.token_count * cb);
      std::span<const uint8_t> meta;
      if (mb > 0) {
        ASSERT_EQ(meta_of_layer[e.layer].size(), 2 * g.kv_heads * mb);
        meta = std::span<const uint8_t>(meta_of_layer[e.layer]).subspan(
            (e.kv * g.kv_heads + head) * mb, mb);
      }
      std::vector<float> a(e.token_count * g.head_dim), b(a.size());
      ASSERT_TRUE(stored[ci]->Decode(codes, e.token_count, meta, a.data(), DType::kF32,
                                     g.head_dim).ok());
      ASSERT_TRUE(s.codecs[ci]->Decode(codes, e.token_count, meta, b.data(), DType::kF32,
                                       g.head_dim).ok());
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
          << "layer " << e.layer << " head " << head;
      // And the codes are of this data (a loose sanity bound: same sign of the big channel).
      const float* x = s.tensors[e.layer * 2 + e.kv].data() + e.token_begin * g.token_elems() +
                       head * g.head_dim;
      size_t agree = 0;
      for (uint64_t t = 0; t < e.token_count; ++t) {
        agree += (a[t * g.head_dim + 3] > 0) == (x[t * g.token_elems() + 3] > 0) ? 1 : 0;
      }
      EXPECT_GE(agree * 10, e.token_count * 8) << "layer " << e.layer;
      decoded_vectors += e.token_count;
    }
  }
  EXPECT_EQ(decoded_vectors, 2u * g.layers * g.kv_heads * 37);
}

class ContainerFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    session_ = MakeSession({"tq3", "tq2.5"}, {2, 2, 32}, 20, 8);
    for (const auto& c : session_.codecs) ASSERT_NE(c, nullptr);
    MemoryStore clean;
    auto out = clean.Create("x");
    ASSERT_TRUE(out.ok());
    ASSERT_TRUE(WriteSession(session_, out->get()).ok());
    size_ = (*out)->BytesWritten();
    ASSERT_GT(size_, 4 * kContainerAlignment);
    auto base = std::make_unique<MemoryStore>();
    store_ = std::make_unique<FaultInjectionStore>(std::move(base));
  }

  // Writes the session under `key` (faults as set), then opens and reads every chunk.
  Status WriteThenReadAll(const std::string& key) {
    {
      TQKV_ASSIGN_OR_RETURN(auto out, store_->Create(key));
      TQKV_RETURN_IF_ERROR(WriteSession(session_, out.get()));
      TQKV_RETURN_IF_ERROR(out->Commit());
    }
    TQKV_ASSIGN_OR_RETURN(auto in, store_->Open(key));
    TQKV_ASSIGN_OR_RETURN(auto reader, ContainerReader::Open(in.get(), key));
    std::vector<uint8_t> buf;
    for (const ChunkEntry& e : reader->chunks()) {
      buf.resize(e.size);
      TQKV_RETURN_IF_ERROR(reader->ReadChunk(e, buf));
    }
    return Status::Ok();
  }

  Session session_;
  uint64_t size_ = 0;
  std::unique_ptr<FaultInjectionStore> store_;
};

TEST_F(ContainerFaultTest, CleanWriteReadsBack) { EXPECT_TRUE(WriteThenReadAll("ok").ok()); }

TEST_F(ContainerFaultTest, ShortWritesAreCorruption) {
  // A device that silently drops the tail: the object is published truncated.
  for (uint64_t at : {uint64_t{0}, uint64_t{100}, kContainerAlignment, kContainerAlignment + 5,
                      size_ / 2, size_ - 65, size_ - 64, size_ - 1}) {
    WriteFaults f;
    f.short_write_at = at;
    store_->SetWriteFaults(f);
    Status s = WriteThenReadAll("short" + std::to_string(at));
    EXPECT_TRUE(s.IsCorruption()) << "short write at " << at << ": " << s.ToString();
  }
}

TEST_F(ContainerFaultTest, BitRotIsCorruption) {
  for (uint64_t at : {uint64_t{3}, uint64_t{40}, uint64_t{500}, kContainerAlignment + 1,
                      2 * kContainerAlignment + 7, size_ - 200, size_ - 30, size_ - 1}) {
    ReadFaults f;
    f.corrupt_at = at;
    store_->SetReadFaults(f);
    Status s = WriteThenReadAll("rot" + std::to_string(at));
    EXPECT_TRUE(s.IsCorruption()) << "bit rot at " << at << ": " << s.ToString();
  }
}

TEST_F(ContainerFaultTest, ReadErrorsPassThrough) {
  ReadFaults f;
  f.io_error_at = 2 * kContainerAlignment + 1;
  store_->SetReadFaults(f);
  Status s = WriteThenReadAll("eio");
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
}

TEST_F(ContainerFaultTest, WriteErrorsPassThrough) {
  WriteFaults f;
  f.no_space_at = 3 * kContainerAlignment;
  store_->SetWriteFaults(f);
  Status s = WriteThenReadAll("enospc");
  EXPECT_EQ(s.code(), StatusCode::kNoSpace) << s.ToString();
}

}  // namespace
}  // namespace tqkv
