// Container round trips, layout, writer order enforcement and reader API checks.
#include "tqkv/container.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

#include "format/container_layout.h"
#include "format/container_parse.h"
#include "format/container_test_util.h"
#include "test_paths.h"

namespace tqkv {
namespace {

using namespace testing_format;  // NOLINT

void ExpectCodecEq(const CodecParams& a, const CodecParams& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.raw_dtype, b.raw_dtype);
  EXPECT_EQ(a.norm_dtype, b.norm_dtype);
  EXPECT_EQ(a.norm_correction, b.norm_correction);
  EXPECT_EQ(a.qjl, b.qjl);
  EXPECT_EQ(a.qjl_seed, b.qjl_seed);
  ASSERT_EQ(a.subsets.size(), b.subsets.size());
  for (size_t i = 0; i < a.subsets.size(); ++i) {
    EXPECT_EQ(a.subsets[i].channels, b.subsets[i].channels);
    EXPECT_EQ(a.subsets[i].bits, b.subsets[i].bits);
    EXPECT_EQ(a.subsets[i].rotation, b.subsets[i].rotation);
    EXPECT_EQ(a.subsets[i].seed, b.subsets[i].seed);
    EXPECT_EQ(a.subsets[i].centroids, b.subsets[i].centroids);  // bit-exact floats
  }
}

void ExpectHeaderEq(const ContainerHeader& a, const ContainerHeader& b) {
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.geometry, b.geometry);
  EXPECT_EQ(a.source_dtype, b.source_dtype);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.token_block, b.token_block);
  ASSERT_EQ(a.codecs.size(), b.codecs.size());
  for (size_t i = 0; i < a.codecs.size(); ++i) ExpectCodecEq(a.codecs[i], b.codecs[i]);
  EXPECT_EQ(a.layer_codec, b.layer_codec);
  EXPECT_EQ(a.exact_head, b.exact_head);
  EXPECT_EQ(a.exact_tail, b.exact_tail);
  EXPECT_EQ(a.engine_state, b.engine_state);
}

// Writes, opens, compares header and chunk table, reads every payload back.
void RoundTrip(const ContainerHeader& h) {
  WrittenContainer w = WriteContainer(h, 7);
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  MemoryReadable in(w.file);
  auto reader = ContainerReader::Open(&in, "rt.tqkv");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  ExpectHeaderEq((*reader)->header(), h);
  EXPECT_EQ((*reader)->file_bytes(), w.file.size());
  const auto& chunks = (*reader)->chunks();
  ASSERT_EQ(chunks.size(), w.keys.size());
  uint64_t prev_end = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkEntry& e = chunks[i];
    SCOPED_TRACE("chunk " + std::to_string(i));
    EXPECT_EQ(e.type, w.keys[i].type);
    EXPECT_EQ(e.layer, w.keys[i].layer);
    EXPECT_EQ(e.kv, w.keys[i].kv);
    EXPECT_EQ(e.token_begin, w.keys[i].token_begin);
    EXPECT_EQ(e.token_count, w.keys[i].token_count);
    EXPECT_EQ(e.size, w.payloads[i].size());
    EXPECT_EQ(e.offset % kContainerAlignment, 0u);
    EXPECT_GE(e.offset, prev_end);
    EXPECT_GE(e.offset, kContainerAlignment);  // after the header block
    prev_end = e.offset + e.size;
    auto expected = ExpectedChunkBytes(h, e);
    ASSERT_TRUE(expected.ok());
    EXPECT_EQ(*expected, e.size);
    // The payload sits verbatim at its offset.
    ASSERT_LE(e.offset + e.size, w.file.size());
    EXPECT_EQ(0, std::memcmp(w.file.data() + e.offset, w.payloads[i].data(), e.size));
    std::vector<uint8_t> got(e.size);
    ASSERT_TRUE((*reader)->ReadChunk(e, got).ok());
    EXPECT_EQ(got, w.payloads[i]);
    EXPECT_TRUE((*reader)->VerifyChunk(e, got).ok());
  }
  auto parsed = format::ParseAndVerifyContainer(w.file, "rt.tqkv");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->chunks.size(), chunks.size());
  ExpectHeaderEq(parsed->header, h);
}

TEST(ContainerTest, RoundTripRaw) {
  RoundTrip(MakeHeader({3, 2, 16}, 40, 16, {RawParams(16, DType::kF16)}, {0, 0, 0}));
  RoundTrip(MakeHeader({1, 4, 64}, 100, 32, {RawParams(64, DType::kF32)}, {0}));
  RoundTrip(MakeHeader({2, 1, 8}, 7, 1, {RawParams(8, DType::kBF16)}, {0, 0}));
}

TEST(ContainerTest, RoundTripTurboQuant) {
  RoundTrip(MakeHeader({2, 2, 32}, 33, 16, {TqParams(32, 3)}, {0, 0}));
  RoundTrip(MakeHeader({2, 2, 32}, 16, 16, {TqParams(32, 4, /*qjl=*/true)}, {0, 0}));
}

TEST(ContainerTest, RoundTripPerLayerOverridesAndSplitMeta) {
  ContainerHeader h = MakeHeader({4, 2, 16}, 50, 16,
                                 {RawParams(16), TqParams(16, 2), SplitParams(16)}, {0, 2, 1, 2});
  h.model = "qwen2.5-7b \xe2\x9c\x93";  // arbitrary bytes
  RoundTrip(h);
  WrittenContainer w = WriteContainer(h);
  ASSERT_TRUE(w.status.ok());
  size_t meta = 0;
  for (const ChunkEntry& k : w.keys) {
    if (k.type == ChunkType::kGroupMeta) {
      ++meta;
      EXPECT_TRUE(k.layer == 1 || k.layer == 3);
      EXPECT_EQ(ChunkBytes(h, k), 2u * 2 * 2);  // 2 (K,V) x 2 heads x ceil(16/8)
    }
  }
  EXPECT_EQ(meta, 2u);
}

TEST(ContainerTest, ZeroTokens) {
  // No code chunks; split layers still carry their (empty-session) group metadata.
  RoundTrip(MakeHeader({2, 1, 16}, 0, 16, {RawParams(16)}, {0, 0}));
  RoundTrip(MakeHeader({2, 1, 16}, 0, 16, {SplitParams(16)}, {0, 0}));
  WrittenContainer w = WriteContainer(MakeHeader({1, 1, 16}, 0, 4, {RawParams(16)}, {0}));
  ASSERT_TRUE(w.status.ok());
  EXPECT_EQ(w.file.size(), format::kMinFileBytes);
}

TEST(ContainerTest, ByteLayout) {
  WrittenContainer w = WriteContainer(SmallHeader());
  ASSERT_TRUE(w.status.ok());
  const auto& f = w.file;
  const uint8_t magic[8] = {0x89, 'T', 'Q', 'K', 'V', '\r', '\n', 0x1A};
  ASSERT_GT(f.size(), 64u);
  EXPECT_EQ(0, std::memcmp(f.data(), magic, 8));
  EXPECT_EQ(0, std::memcmp(f.data() + f.size() - 8, magic, 8));
  EXPECT_EQ(format::LoadU32(f.data() + 8), 1u);  // no exact rows: still version 1
  EXPECT_EQ(format::LoadU32(f.data() + 12), 0u);  // flags
  EXPECT_EQ(f[16], 1);                            // XXH3-64
  const uint64_t fat = f.size() - 64;
  EXPECT_EQ(format::LoadU64(f.data() + fat + 24), f.size());
  EXPECT_EQ(format::LoadU64(f.data() + fat + 0) + format::LoadU64(f.data() + fat + 8), fat);
  EXPECT_EQ(format::LoadU64(f.data() + fat + 32), format::LoadU64(f.data() + 24));
  // 2 layers: layer 0 raw (3 K + 3 V), layer 1 split (meta + 3 K + 3 V).
  EXPECT_EQ(w.keys.size(), 13u);
  EXPECT_EQ(format::LoadU64(f.data() + format::LoadU64(f.data() + fat)), 13u);
  // Header block is one alignment unit; the first chunk follows it.
  EXPECT_EQ(format::LoadU64(f.data() + format::LoadU64(f.data() + fat) + 8 + 24), 4096u);
  // The worked example of docs/format.md §11.
  EXPECT_EQ(format::LoadU32(f.data() + 20), 191u);
  EXPECT_EQ(format::LoadU64(f.data() + fat), 53376u);
  EXPECT_EQ(f.size(), 54080u);
  // Deterministic: the same input gives the same bytes.
  EXPECT_EQ(WriteContainer(SmallHeader()).file, f);
}

TEST(ContainerTest, ExpectedChunkBytes) {
  const ContainerHeader h =
      MakeHeader({2, 3, 16}, 40, 16, {RawParams(16), SplitParams(16)}, {0, 1});
  ChunkEntry e;
  e.type = ChunkType::kCodes;
  e.token_count = 5;
  EXPECT_EQ(*ExpectedChunkBytes(h, e), 5u * 3 * 32);
  e.layer = 1;
  // split: f32 norm + 4 bits x 1 byte, f32 norm + 2 bits x 2 bytes = 4+4+4+4
  EXPECT_EQ(*ExpectedChunkBytes(h, e), 5u * 3 * 16);
  e.type = ChunkType::kGroupMeta;
  EXPECT_EQ(*ExpectedChunkBytes(h, e), 2u * 3 * 2);
  e.layer = 0;
  EXPECT_FALSE(ExpectedChunkBytes(h, e).ok());  // raw layer has no metadata
  e.layer = 2;
  EXPECT_FALSE(ExpectedChunkBytes(h, e).ok());
  e.layer = 0;
  e.type = static_cast<ChunkType>(9);
  EXPECT_FALSE(ExpectedChunkBytes(h, e).ok());
  e.type = ChunkType::kCodes;
  e.token_count = UINT64_MAX / 2;
  EXPECT_FALSE(ExpectedChunkBytes(h, e).ok());  // overflow
}

TEST(ContainerWriterTest, RejectsInvalidHeaders) {
  MemoryWritable out;
  auto expect_invalid = [&](ContainerHeader h, const char* what) {
    auto w = ContainerWriter::Create(&out, h);
    EXPECT_FALSE(w.ok()) << what;
    if (!w.ok()) {
      EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << what;
    }
  };
  const ContainerHeader good = SmallHeader();
  ASSERT_TRUE(ContainerWriter::Create(&out, good).ok());
  ContainerHeader h = good;
  h.layer_codec = {0};
  expect_invalid(h, "layer_codec size");
  h = good;
  h.layer_codec = {0, 2};
  expect_invalid(h, "codec index out of range");
  h = good;
  h.token_block = 0;
  expect_invalid(h, "token_block 0");
  h = good;
  h.codecs.clear();
  expect_invalid(h, "no codecs");
  h = good;
  h.codecs[1].subsets[0].centroids[1] = h.codecs[1].subsets[0].centroids[0];
  expect_invalid(h, "centroids not ascending");
  h = good;
  h.codecs[0].head_dim = 32;
  expect_invalid(h, "codec head_dim differs from geometry");
  h = good;
  h.geometry.kv_heads = 0;
  expect_invalid(h, "zero kv_heads");
  h = good;
  h.model.assign(300, 'x');
  expect_invalid(h, "model name too long");
  h = good;
  h.source_dtype = static_cast<DType>(7);
  expect_invalid(h, "source dtype");
  EXPECT_FALSE(ContainerWriter::Create(nullptr, good).ok());
}

class WriterOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h_ = SmallHeader();
    keys_ = ExpectedKeys(h_);
    auto w = ContainerWriter::Create(&out_, h_);
    ASSERT_TRUE(w.ok());
    writer_ = std::move(*w);
  }
  Status Add(size_t i) { return writer_->AddChunk(keys_[i], Payload(ChunkBytes(h_, keys_[i]), i)); }
  Status AddKey(const ChunkEntry& k, size_t bytes) {
    return writer_->AddChunk(k, Payload(bytes, 0));
  }

  ContainerHeader h_;
  std::vector<ChunkEntry> keys_;
  MemoryWritable out_;
  std::unique_ptr<ContainerWriter> writer_;
};

TEST_F(WriterOrderTest, RejectsOutOfOrderAndRecovers) {
  // keys: 0..5 layer 0 (K 0,16,32; V 0,16,32), 6 layer-1 meta, 7..12 layer 1.
  ASSERT_EQ(keys_.size(), 13u);
  EXPECT_EQ(Add(1).code(), StatusCode::kInvalidArgument);  // K tokens 16 before 0
  EXPECT_EQ(Add(3).code(), StatusCode::kInvalidArgument);  // V before K
  EXPECT_EQ(Add(6).code(), StatusCode::kInvalidArgument);  // next layer first
  ChunkEntry k = keys_[0];
  k.token_count = 15;
  EXPECT_EQ(AddKey(k, 15 * 32).code(), StatusCode::kInvalidArgument);  // wrong token block
  k = keys_[0];
  k.kv = 2;
  EXPECT_EQ(AddKey(k, 16 * 32).code(), StatusCode::kInvalidArgument);
  k = keys_[0];
  k.type = ChunkType::kGroupMeta;  // raw layer: no meta chunk
  k.token_count = 0;
  EXPECT_EQ(AddKey(k, 4).code(), StatusCode::kInvalidArgument);
  const uint64_t before = writer_->BytesWritten();
  EXPECT_EQ(before, kContainerAlignment);  // header block only
  // Rejected chunks wrote nothing; the right one is still accepted.
  for (size_t i = 0; i < 6; ++i) ASSERT_TRUE(Add(i).ok()) << i;
  // Layer 1 is split: its meta chunk must come first.
  EXPECT_EQ(Add(7).code(), StatusCode::kInvalidArgument);
  for (size_t i = 6; i < keys_.size(); ++i) ASSERT_TRUE(Add(i).ok()) << i;
  EXPECT_EQ(Add(12).code(), StatusCode::kInvalidArgument);  // after the last one
  ASSERT_TRUE(writer_->Finish().ok());
  EXPECT_FALSE(writer_->Finish().ok());
  EXPECT_FALSE(Add(0).ok());
  EXPECT_EQ(writer_->BytesWritten(), out_.bytes.size());
  EXPECT_TRUE(OpenAndReadAll(out_.bytes).ok());
}

TEST_F(WriterOrderTest, RejectsWrongSizes) {
  const size_t n = ChunkBytes(h_, keys_[0]);
  EXPECT_EQ(AddKey(keys_[0], n - 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AddKey(keys_[0], n + 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AddKey(keys_[0], 0).code(), StatusCode::kInvalidArgument);
  for (size_t i = 0; i < 6; ++i) ASSERT_TRUE(Add(i).ok());
  const size_t m = ChunkBytes(h_, keys_[6]);  // meta: 2 x 1 head x 2 bytes
  EXPECT_EQ(m, 4u);
  EXPECT_EQ(AddKey(keys_[6], m * 2).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Add(6).ok());
  // The last (short) block: 8 tokens.
  for (size_t i = 7; i < 9; ++i) ASSERT_TRUE(Add(i).ok());
  EXPECT_EQ(keys_[9].token_count, 8u);
  EXPECT_EQ(AddKey(keys_[9], ChunkBytes(h_, keys_[8])).code(), StatusCode::kInvalidArgument);
}

TEST_F(WriterOrderTest, FinishFailsWhenChunksAreMissing) {
  EXPECT_EQ(writer_->Finish().code(), StatusCode::kInvalidArgument);
  for (size_t i = 0; i + 1 < keys_.size(); ++i) ASSERT_TRUE(Add(i).ok());
  Status s = writer_->Finish();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("missing"), std::string::npos) << s.ToString();
  ASSERT_TRUE(Add(keys_.size() - 1).ok());
  EXPECT_TRUE(writer_->Finish().ok());
}

TEST(ContainerWriterTest, WriteErrorsAreSticky) {
  const ContainerHeader h = SmallHeader();
  MemoryWritable out;
  out.fail_after = 100;  // the header block fails
  EXPECT_EQ(ContainerWriter::Create(&out, h).status().code(), StatusCode::kNoSpace);
  MemoryWritable out2;
  out2.fail_after = 3 * kContainerAlignment + 10;
  auto w = ContainerWriter::Create(&out2, h);
  ASSERT_TRUE(w.ok());
  const auto keys = ExpectedKeys(h);
  Status s;
  size_t i = 0;
  for (; i < keys.size() && s.ok(); ++i)
    s = (*w)->AddChunk(keys[i], Payload(ChunkBytes(h, keys[i]), i));
  EXPECT_EQ(s.code(), StatusCode::kNoSpace);
  out2.fail_after = UINT64_MAX;  // the writer stays failed even if the object recovers
  EXPECT_EQ((*w)->AddChunk(keys[i - 1], Payload(ChunkBytes(h, keys[i - 1]), 0)).code(),
            StatusCode::kNoSpace);
  EXPECT_EQ((*w)->Finish().code(), StatusCode::kNoSpace);
}

TEST(ContainerReaderTest, ApiMisuse) {
  WrittenContainer w = WriteContainer(SmallHeader());
  ASSERT_TRUE(w.status.ok());
  MemoryReadable in(w.file);
  auto r = ContainerReader::Open(&in, "api.tqkv");
  ASSERT_TRUE(r.ok());
  ChunkEntry e = (*r)->chunks()[2];
  std::vector<uint8_t> small(e.size - 1);
  EXPECT_EQ((*r)->ReadChunk(e, small).code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> buf(e.size);
  ChunkEntry forged = e;
  forged.offset += 1;
  EXPECT_EQ((*r)->ReadChunk(forged, buf).code(), StatusCode::kInvalidArgument);
  forged = e;
  forged.checksum ^= 1;
  EXPECT_EQ((*r)->ReadChunk(forged, buf).code(), StatusCode::kInvalidArgument);
  // VerifyChunk names the object and the offset on a bad payload.
  ASSERT_TRUE((*r)->ReadChunk(e, buf).ok());
  buf[3] ^= 0x10;
  Status s = (*r)->VerifyChunk(e, buf);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("api.tqkv"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("offset " + std::to_string(e.offset)), std::string::npos);
  EXPECT_TRUE((*r)->VerifyChunk(e, std::span<const uint8_t>(buf).first(e.size - 1)).IsCorruption());
  EXPECT_FALSE(ContainerReader::Open(nullptr, "x").ok());
}

// ReadChunks: one batch of extents, each verified for checksum and padding.
TEST(ContainerReaderTest, ReadChunksVerifiesExtents) {
  WrittenContainer w = WriteContainer(SmallHeader());
  ASSERT_TRUE(w.status.ok());
  MemoryReadable in(w.file);
  auto r = ContainerReader::Open(&in, "batch.tqkv");
  ASSERT_TRUE(r.ok());
  const auto& chunks = (*r)->chunks();
  ASSERT_GE(chunks.size(), 3u);
  uint64_t max_extent = 0;
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<ChunkRead> reads;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const uint64_t extent = (*r)->ChunkExtent(i);
    EXPECT_EQ(extent, i + 1 < chunks.size() ? chunks[i + 1].offset - chunks[i].offset
                                            : chunks[i].size);
    max_extent = std::max(max_extent, extent);
    bufs.emplace_back(extent);
  }
  for (size_t i = 0; i < chunks.size(); ++i) reads.push_back({i, bufs[i]});
  EXPECT_EQ((*r)->MaxChunkExtent(), max_extent);
  ASSERT_TRUE((*r)->ReadChunks(reads).ok());
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(std::memcmp(bufs[i].data(), w.file.data() + chunks[i].offset, bufs[i].size()), 0);
    EXPECT_TRUE((*r)->VerifyChunkExtent(i, bufs[i]).ok());
  }
  // A flipped padding byte, a flipped payload byte, a wrong size, an index out of range.
  ASSERT_GT(bufs[0].size(), chunks[0].size);
  bufs[0].back() = 1;
  EXPECT_NE((*r)->VerifyChunkExtent(0, bufs[0]).message().find("padding after chunk 0"),
            std::string::npos);
  bufs[0].back() = 0;
  bufs[1][0] ^= 1;
  EXPECT_NE((*r)->VerifyChunkExtent(1, bufs[1]).message().find("checksum"), std::string::npos);
  EXPECT_EQ((*r)->VerifyChunkExtent(0, std::span<const uint8_t>(bufs[0]).first(1)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*r)->VerifyChunkExtent(chunks.size(), bufs[0]).code(), StatusCode::kInvalidArgument);
  std::vector<ChunkRead> wrong{{0, std::span<uint8_t>(bufs[0]).first(10)}};
  EXPECT_EQ((*r)->ReadChunks(wrong).code(), StatusCode::kInvalidArgument);
  // Damage in the file itself is caught by ReadChunks.
  std::vector<uint8_t> damaged = w.file;
  damaged[chunks[0].offset + chunks[0].size] = 7;
  MemoryReadable din(damaged);
  auto dr = ContainerReader::Open(&din, "batch.tqkv");
  ASSERT_TRUE(dr.ok());
  std::vector<uint8_t> one((*dr)->ChunkExtent(0));
  std::vector<ChunkRead> first{{0, one}};
  EXPECT_TRUE((*dr)->ReadChunks(first).IsCorruption());
}

TEST(ContainerTest, ExactRowsAreVersion2WithOneChunkPerLayerAfterItsCodes) {
  RoundTrip(SmallExactHeader());
  ContainerHeader all = MakeHeader({2, 2, 32}, 5, 2, {TqParams(32, 3)}, {0, 0});
  all.exact_head = 2;
  all.exact_tail = 3;  // every token exact
  RoundTrip(all);
  ContainerHeader tail_only = MakeHeader({1, 3, 16}, 50, 16, {RawParams(16, DType::kF32)}, {0});
  tail_only.source_dtype = DType::kF32;
  tail_only.exact_tail = 17;
  RoundTrip(tail_only);

  WrittenContainer w = WriteContainer(SmallExactHeader());
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  const auto& f = w.file;
  EXPECT_EQ(format::LoadU32(f.data() + 8), 2u);
  EXPECT_EQ(format::LoadU32(f.data() + f.size() - 64 + 40), 2u);
  EXPECT_EQ(format::LoadU32(f.data() + 20), 191u + 8);  // the two counts follow layer_codec
  EXPECT_EQ(format::LoadU32(f.data() + 32 + 191), 2u);
  EXPECT_EQ(format::LoadU32(f.data() + 32 + 195), 3u);
  // Layer 0: 3 K + 3 V + exact; layer 1: meta + 3 K + 3 V + exact.
  ASSERT_EQ(w.keys.size(), 15u);
  EXPECT_EQ(w.keys[6].type, ChunkType::kExactRows);
  EXPECT_EQ(w.keys[6].layer, 0u);
  EXPECT_EQ(w.keys[14].type, ChunkType::kExactRows);
  EXPECT_EQ(w.keys[14].layer, 1u);
  // The worked example of docs/format.md §11 (version 2).
  const uint64_t fat = f.size() - 64;
  EXPECT_EQ(format::LoadU64(f.data() + fat), 61760u);
  EXPECT_EQ(f.size(), 62560u);
  // K and V, 5 rows each, 1 head of 16 bf16 values.
  EXPECT_EQ(*ExpectedChunkBytes(SmallExactHeader(), w.keys[6]), 2u * 5 * 16 * 2);
  ChunkEntry exact;
  exact.type = ChunkType::kExactRows;
  EXPECT_EQ(ExpectedChunkBytes(SmallHeader(), exact).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ContainerTest, ExactRowsBeyondTheSessionAreRefused) {
  ContainerHeader h = SmallExactHeader();
  h.exact_tail = 39;  // 2 + 39 > 40 tokens
  MemoryWritable out;
  auto writer = ContainerWriter::Create(&out, h);
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(writer.status().message().find("exceed"), std::string::npos);
  EXPECT_TRUE(out.bytes.empty());
  // The same counts forged into a valid version-2 file, checksums re-signed.
  WrittenContainer w = WriteContainer(SmallExactHeader());
  ASSERT_TRUE(w.status.ok());
  std::vector<uint8_t> f = w.file;
  format::StoreU32(f.data() + 32 + 195, 39);
  Resign(f);
  Status s = OpenAndReadAll(f);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_TRUE(format::ParseAndVerifyContainer(f, "x").status().IsCorruption());
}

TEST(ContainerReaderTest, VersionMustMatchTheHeader) {
  // A version-1 file relabelled 2: the exact-row counts are missing from the body.
  WrittenContainer v1 = WriteContainer(SmallHeader());
  ASSERT_TRUE(v1.status.ok());
  // A version-2 file relabelled 1: 8 trailing bytes in the body.
  WrittenContainer v2 = WriteContainer(SmallExactHeader());
  ASSERT_TRUE(v2.status.ok());
  for (auto [file, version] : {std::pair{&v1.file, 2u}, std::pair{&v2.file, 1u}}) {
    std::vector<uint8_t> f = *file;
    format::StoreU32(f.data() + 8, version);
    format::StoreU32(f.data() + f.size() - 64 + 40, version);
    Resign(f);
    Status s = OpenAndReadAll(f);
    EXPECT_TRUE(s.IsCorruption()) << version << ": " << s.ToString();
    EXPECT_TRUE(format::ParseAndVerifyContainer(f, "x").status().IsCorruption());
  }
}

// The version-2 (exact rows), version-4 (key means), version-5 (separate K/V codecs, with and
// without key means) and version-6 (the guard's figures, with and without a budget) twins of the
// small container.
TEST(ContainerReaderTest, ExactRowsKeyMeansAndKvFilesEveryInformativeBitFlipIsCaught) {
  for (const ContainerHeader& header : {SmallExactHeader(), SmallCenteredHeader(), SmallKvHeader(),
                                        SmallKvCenteredHeader(), SmallGuardHeader(),
                                        SmallGuardAllocatedHeader()}) {
  SCOPED_TRACE(ContainerVersionFor(header));
  WrittenContainer w = WriteContainer(header);
  ASSERT_TRUE(w.status.ok());
  auto parsed = format::ParseAndVerifyContainer(w.file, "t.tqkv");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  std::vector<bool> padding(w.file.size(), false);
  for (uint64_t i = format::kPreambleBytes + format::LoadU32(w.file.data() + 20);
       i < parsed->header_block_end; ++i) {
    padding[i] = true;
  }
  for (size_t c = 0; c < parsed->chunks.size(); ++c) {
    for (uint64_t i = format::PaddingBegin(*parsed, c); i < format::PaddingEnd(*parsed, c); ++i) {
      padding[i] = true;
    }
  }
  std::vector<uint8_t> f = w.file;
  for (size_t i = 0; i < f.size(); ++i) {
    if (padding[i]) continue;
    const uint8_t mask = static_cast<uint8_t>(1u << (i % 8));
    f[i] ^= mask;
    Status s = OpenAndReadAll(f);
    const uint32_t flipped = format::LoadU32(f.data() + 8);
    if (i >= 8 && i < 12 && (flipped < kContainerMinReadableVersion || flipped > kContainerVersion)) {
      EXPECT_EQ(s.code(), StatusCode::kUnsupported) << "byte " << i << ": " << s.ToString();
    } else {
      // Including 2 -> 3, a readable version: the footer's copy (and the header) disagree.
      EXPECT_TRUE(s.IsCorruption()) << "byte " << i << ": " << s.ToString();
    }
    f[i] ^= mask;
    if (HasFailure()) return;
  }
  }
}

// Version 3's header fields and key-means chunks: what the writer refuses and the reader flags.
TEST(ContainerReaderTest, KeyMeansHeaderAndChunks) {
  const ContainerHeader h = SmallCenteredHeader();
  ASSERT_EQ(ContainerVersionFor(h), 4u);
  WrittenContainer w = WriteContainer(h);
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  auto parsed = format::ParseAndVerifyContainer(w.file, "c.tqkv");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->header.key_mean_block, 16u);
  EXPECT_EQ(parsed->header.key_mean_dtype, DType::kF16);
  // Layer 0 is raw: no key means. Layer 1: meta, means (176 bytes), 3 K, 3 V, exact.
  std::vector<std::string> kinds;
  for (const ChunkEntry& e : parsed->chunks) {
    if (e.type == ChunkType::kKeyMeans) {
      EXPECT_EQ(e.layer, 1u);
      EXPECT_EQ(e.size, 176u);
    }
    kinds.push_back(format::DescribeChunk(e));
  }
  EXPECT_EQ(kinds.size(), 16u);
  EXPECT_EQ(kinds[7], "layer 1 group-meta");
  EXPECT_EQ(kinds[8], "layer 1 key-means");
  EXPECT_EQ(kinds[9], "layer 1 K tokens [0, +16)");
  // The writer refuses what a reader would call corrupt.
  for (auto bad : {+[](ContainerHeader& x) { x.key_mean_dtype = DType::kBF16; },
                   +[](ContainerHeader& x) { x.tokens = 0, x.exact_head = x.exact_tail = 0; }}) {
    ContainerHeader x = h;
    bad(x);
    EXPECT_EQ(WriteContainer(x).status.code(), StatusCode::kInvalidArgument);
  }
  // A version-3 body with key_mean_block 0 or an unknown mean dtype, re-signed: Corruption.
  const uint64_t body_end = format::kPreambleBytes + format::LoadU32(w.file.data() + 20);
  for (auto [at, value] : {std::pair<uint64_t, uint8_t>{body_end - 5, 0},  // block's low byte
                           std::pair<uint64_t, uint8_t>{body_end - 1, 2}}) {    // dtype bf16
    std::vector<uint8_t> f = w.file;
    if (at == body_end - 5) format::StoreU32(f.data() + at, 0);
    f[at] = value;
    Resign(f);
    Status s = OpenAndReadAll(f);
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    EXPECT_NE(s.message().find("key mean"), std::string::npos) << s.ToString();
  }
  // The key-means chunk is covered by its checksum.
  std::vector<uint8_t> f = w.file;
  f[parsed->chunks[8].offset + 3] ^= 0x10;
  EXPECT_TRUE(OpenAndReadAll(f).IsCorruption());
}

TEST(ContainerReaderTest, UnsupportedVersions) {
  WrittenContainer w = WriteContainer(SmallHeader());
  ASSERT_TRUE(w.status.ok());
  for (uint32_t v : {0u, kContainerVersion + 1, 0xFFFFFFFFu}) {
    std::vector<uint8_t> f = w.file;
    format::StoreU32(f.data() + 8, v);
    format::StoreU32(f.data() + f.size() - 64 + 40, v);
    Resign(f);
    Status s = OpenAndReadAll(f);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
    EXPECT_EQ(format::ParseAndVerifyContainer(f, "v").status().code(), StatusCode::kUnsupported);
  }
}

}  // namespace
}  // namespace tqkv

namespace tqkv {
namespace {

using namespace testing_format;  // NOLINT

ContainerHeader SmallEngineHeader() {
  ContainerHeader h = SmallHeader();
  h.engine_state = {1, 2, 3, 4, 5};
  return h;
}

TEST(ContainerTest, EngineStateIsVersion3AtTheEndOfTheHeader) {
  RoundTrip(SmallEngineHeader());
  ContainerHeader both = SmallExactHeader();
  both.engine_state.assign(10000, 0xAB);  // the header block grows past one page
  RoundTrip(both);

  WrittenContainer w = WriteContainer(SmallEngineHeader());
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  const auto& f = w.file;
  EXPECT_EQ(format::LoadU32(f.data() + 8), 3u);
  EXPECT_EQ(format::LoadU32(f.data() + f.size() - 64 + 40), 3u);
  // layer_codec ends at 191; then exact_head, exact_tail (0 here), the length and the bytes.
  EXPECT_EQ(format::LoadU32(f.data() + 20), 191u + 8 + 4 + 5);
  EXPECT_EQ(format::LoadU32(f.data() + 32 + 191), 0u);
  EXPECT_EQ(format::LoadU32(f.data() + 32 + 195), 0u);
  EXPECT_EQ(format::LoadU32(f.data() + 32 + 199), 5u);
  EXPECT_EQ(f[32 + 203], 1);
  EXPECT_EQ(f[32 + 207], 5);
  // No exact rows: the chunks are those of the version-1 file.
  WrittenContainer v1 = WriteContainer(SmallHeader());
  ASSERT_TRUE(v1.status.ok());
  EXPECT_EQ(w.keys.size(), v1.keys.size());
}

TEST(ContainerTest, OversizedEngineStateIsRefused) {
  ContainerHeader h = SmallHeader();
  h.engine_state.resize(kMaxEngineStateBytes + 1);
  MemoryWritable out;
  auto writer = ContainerWriter::Create(&out, h);
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(writer.status().message().find("engine state"), std::string::npos);
  // A length past the header's end, forged into a valid file: Corruption, no large allocation.
  WrittenContainer w = WriteContainer(SmallEngineHeader());
  ASSERT_TRUE(w.status.ok());
  for (uint32_t len : {6u, 0xFFFFFFFFu}) {
    std::vector<uint8_t> f = w.file;
    format::StoreU32(f.data() + 32 + 199, len);
    Resign(f);
    Status s = OpenAndReadAll(f);
    EXPECT_TRUE(s.IsCorruption()) << len << ": " << s.ToString();
  }
}

TEST(ContainerReaderTest, Version3MustCarryAnEngineState) {
  // A version-2 file relabelled 3: the engine state's length is missing from the body.
  WrittenContainer v2 = WriteContainer(SmallExactHeader());
  ASSERT_TRUE(v2.status.ok());
  // A version-2 file turned into version 3 with an empty engine state (a zero length appended to
  // the body): not the lowest version that holds it, refused.
  std::vector<uint8_t> empty = v2.file;
  format::StoreU32(empty.data() + 20, 199 + 4);  // the length field lies in the zero padding
  // A version-3 file relabelled 2: trailing bytes.
  WrittenContainer v3 = WriteContainer(SmallEngineHeader());
  ASSERT_TRUE(v3.status.ok());
  for (auto [file, version] : {std::pair{v2.file, 3u}, std::pair{empty, 3u},
                               std::pair{v3.file, 2u}}) {
    std::vector<uint8_t> f = file;
    format::StoreU32(f.data() + 8, version);
    format::StoreU32(f.data() + f.size() - 64 + 40, version);
    Resign(f);
    Status s = OpenAndReadAll(f);
    EXPECT_TRUE(s.IsCorruption()) << version << ": " << s.ToString();
  }
}

}  // namespace
}  // namespace tqkv

namespace tqkv {
namespace {

ContainerHeader Aligned64(ContainerHeader h) {
  h.payload_alignment = 64;  // format version 9
  return h;
}

// docs/format.md §11's worked examples name each header body's size: the writer's, in order
// (the version-4 example once said 204, forgetting engine_state_len: issue 34).
TEST(ContainerDocsTest, WorkedExampleHeaderSizesAreTheWriters) {
  std::ifstream in(tqkv::test::SourceDir() + "/docs/format.md");
  ASSERT_TRUE(in.good());
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t example = doc.find("## 11. Example");
  ASSERT_NE(example, std::string::npos);
  std::vector<uint64_t> said;
  for (size_t at = doc.find("Header body: ", example); at != std::string::npos && at < doc.find("## 12.", example);
       at = doc.find("Header body: ", at + 1)) {
    said.push_back(std::stoull(doc.substr(at + 13, 8)));
  }
  std::vector<uint64_t> written;
  for (const ContainerHeader& h :
       {SmallHeader(), SmallExactHeader(), SmallCenteredHeader(), SmallKvHeader(),
        SmallRaggedHeader(), Aligned64(SmallHeader())}) {
    WrittenContainer w = WriteContainer(h);
    ASSERT_TRUE(w.status.ok()) << w.status.ToString();
    written.push_back(format::LoadU32(w.file.data() + 20));
  }
  EXPECT_EQ(said, written);
}

}  // namespace
}  // namespace tqkv
