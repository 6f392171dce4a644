// Format version 9: a container-wide payload alignment P (64 to 4096) for small sessions. The
// header block ends at align_P(32 + header_size) and each payload starts at align_P(end of the
// previous one); reads still fetch whole 4 KiB blocks (a chunk's extent), with the payload inside.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "container_test_util.h"
#include "format/container_parse.h"

namespace tqkv::testing_format {
namespace {

uint64_t Up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

ContainerHeader Aligned(ContainerHeader h, uint32_t a) {
  h.payload_alignment = a;
  return h;
}

// The log2 byte is the last of the header body.
uint64_t AlignmentFieldAt(const std::vector<uint8_t>& f) {
  return format::kPreambleBytes + format::LoadU32(f.data() + 20) - 1;
}

TEST(AlignmentContainerTest, SmallHeaderAt64HasTheDocumentedLayout) {
  const ContainerHeader h = Aligned(SmallHeader(), 64);
  ASSERT_EQ(ContainerVersionFor(h), 9u);
  // docs/format.md §11: the 191 bytes of version 1 + exact rows (8) + engine state length (4) +
  // key-mean fields (5) + layer_codec_v (4) + guard fields (8) + layer_tokens (16) + log2 (1).
  const std::vector<uint8_t> body = format::EncodeHeaderBody(h);
  ASSERT_EQ(body.size(), 237u);
  EXPECT_EQ(body.back(), 6);
  WrittenContainer w = WriteContainer(h);
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  EXPECT_EQ(format::LoadU32(w.file.data() + 8), 9u);
  auto parsed = format::ParseAndVerifyContainer(w.file, "a.tqkv");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->header.payload_alignment, 64u);
  EXPECT_EQ(parsed->header_block_end, 320u);  // align_64(32 + 237)
  const std::vector<uint64_t> want = {320,  832,  1344, 1600, 2112, 2624, 2880,
                                      2944, 3200, 3456, 3584, 3840, 4096};
  ASSERT_EQ(parsed->chunks.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(parsed->chunks[i].offset, want[i]) << i;
  EXPECT_EQ(parsed->index_offset, 4224u);
  EXPECT_EQ(w.file.size(), 4224u + 16 + 13 * 48 + 64);  // 4928, against 54080 at 4096
  EXPECT_EQ(WriteContainer(SmallHeader()).file.size(), 54080u);
  // The smallest version 9 file (docs/format.md §2): one raw layer, no model name, no tokens.
  ContainerHeader tiny = Aligned(MakeHeader({1, 1, 16}, 0, 4, {RawParams(16)}, {0}), 64);
  tiny.model.clear();
  WrittenContainer t = WriteContainer(tiny);
  ASSERT_TRUE(t.status.ok()) << t.status.ToString();
  EXPECT_EQ(format::EncodeHeaderBody(tiny).size(), 87u);
  EXPECT_EQ(t.file.size(), 208u);
  EXPECT_TRUE(format::ParseAndVerifyContainer(t.file, "tiny").ok());
}

TEST(AlignmentContainerTest, EveryAlignmentIsCanonicalAndZeroPadded) {
  for (const ContainerHeader& base : {SmallCenteredHeader(), SmallRaggedHeader(),
                                      SmallGuardAllocatedHeader(), SmallKvHeader()}) {
    for (uint32_t a : {64u, 128u, 512u, 2048u, 4096u}) {
      SCOPED_TRACE(a);
      const ContainerHeader h = Aligned(base, a);
      EXPECT_EQ(ContainerVersionFor(h) == 9, a != 4096);
      WrittenContainer w = WriteContainer(h);
      ASSERT_TRUE(w.status.ok()) << w.status.ToString();
      auto parsed = format::ParseAndVerifyContainer(w.file, "a.tqkv");
      ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
      EXPECT_EQ(parsed->header.payload_alignment, a);
      uint64_t pos = format::kPreambleBytes + format::EncodeHeaderBody(h).size();
      for (size_t i = 0; i < parsed->chunks.size(); ++i) {
        const ChunkEntry& e = parsed->chunks[i];
        EXPECT_EQ(e.offset, Up(pos, a));
        for (uint64_t b = pos; b < e.offset; ++b) ASSERT_EQ(w.file[b], 0) << b;
        EXPECT_EQ(std::memcmp(w.file.data() + e.offset, w.payloads[i].data(), e.size), 0);
        pos = e.offset + e.size;
      }
      EXPECT_EQ(parsed->index_offset, pos);
      EXPECT_TRUE(OpenAndReadAll(w.file).ok());
      // Rewriting the parsed header gives the same bytes (canonical).
      EXPECT_EQ(format::EncodeHeaderBody(parsed->header), format::EncodeHeaderBody(h));
    }
  }
}

TEST(AlignmentContainerTest, ExtentsAreWhole4KiBBlocksAroundThePayload) {
  WrittenContainer w = WriteContainer(Aligned(SmallCenteredHeader(), 64));
  ASSERT_TRUE(w.status.ok());
  MemoryReadable in(w.file);
  auto r = ContainerReader::Open(&in, "x.tqkv");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& chunks = (*r)->chunks();
  const uint64_t index_offset = w.file.size() - 64 - (16 + 48 * chunks.size());
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<ChunkRead> reads;
  uint64_t max_extent = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const uint64_t begin = (*r)->ChunkExtentOffset(i);
    EXPECT_EQ(begin, chunks[i].offset / 4096 * 4096);
    EXPECT_EQ((*r)->PayloadOffsetInExtent(i), chunks[i].offset - begin);
    EXPECT_EQ(begin + (*r)->ChunkExtent(i),
              std::min(Up(chunks[i].offset + chunks[i].size, 4096), index_offset));
    max_extent = std::max(max_extent, (*r)->ChunkExtent(i));
    bufs.emplace_back((*r)->ChunkExtent(i));
  }
  for (size_t i = 0; i < chunks.size(); ++i) reads.push_back({i, bufs[i]});
  EXPECT_EQ((*r)->MaxChunkExtent(), max_extent);
  const uint64_t before = in.bytes_read;
  ASSERT_TRUE((*r)->ReadChunks(reads).ok());
  // One batch: blocks shared by neighbouring extents are read once, [0, index offset) in all.
  EXPECT_EQ(in.bytes_read - before, index_offset);
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(std::memcmp(bufs[i].data() + (*r)->PayloadOffsetInExtent(i), w.payloads[i].data(),
                          chunks[i].size),
              0);
  }
  // Several chunks share a block: the bytes of a neighbour are not this chunk's to check, the
  // padding after its payload is. Chunk i: its payload inside the extent, padding after it.
  size_t i = 0;
  while (i + 1 < chunks.size() && ((*r)->PayloadOffsetInExtent(i) == 0 ||
                                   chunks[i + 1].offset == chunks[i].offset + chunks[i].size)) {
    ++i;
  }
  ASSERT_LT(i + 1, chunks.size());
  std::vector<uint8_t> ext = bufs[i];
  ext[(*r)->PayloadOffsetInExtent(i) - 1] ^= 0xFF;  // the previous chunk's byte or padding
  EXPECT_TRUE((*r)->VerifyChunkExtent(i, ext).ok());
  ext = bufs[i];
  ext[(*r)->PayloadOffsetInExtent(i) + chunks[i].size] = 1;
  Status s = (*r)->VerifyChunkExtent(i, ext);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("padding after chunk " + std::to_string(i)), std::string::npos)
      << s.message();
}

TEST(AlignmentContainerTest, TheWriterRefusesAnAlignmentOutOfRange) {
  for (uint32_t a : {0u, 1u, 32u, 100u, 96u, 8192u, 65536u}) {
    EXPECT_EQ(WriteContainer(Aligned(SmallHeader(), a)).status.code(),
              StatusCode::kInvalidArgument)
        << a;
  }
}

// The log2 byte: out of [6, 12] is Corruption; 12 (4096) needs no version 9; another valid value
// moves every offset, which the index no longer matches.
TEST(AlignmentContainerTest, ABadAlignmentFieldIsCorruption) {
  const WrittenContainer w = WriteContainer(Aligned(SmallHeader(), 64));
  ASSERT_TRUE(w.status.ok());
  for (uint8_t v : {0, 5, 13, 31, 255, 12, 7, 8}) {
    std::vector<uint8_t> f = w.file;
    f[AlignmentFieldAt(f)] = v;
    Resign(f);
    auto parsed = format::ParseAndVerifyContainer(f, "a.tqkv");
    ASSERT_FALSE(parsed.ok()) << int{v};
    EXPECT_TRUE(parsed.status().IsCorruption()) << parsed.status().ToString();
    EXPECT_FALSE(OpenAndReadAll(f).ok());
  }
  // Without the resign the header checksum catches it first.
  std::vector<uint8_t> f = w.file;
  f[AlignmentFieldAt(f)] = 7;
  EXPECT_TRUE(format::ParseAndVerifyContainer(f, "a.tqkv").status().IsCorruption());
  // A version 9 header in a version 8 file is a trailing byte.
  f = w.file;
  format::StoreU32(f.data() + 8, 8);
  format::StoreU32(f.data() + f.size() - 64 + 40, 8);
  Resign(f);
  EXPECT_TRUE(format::ParseAndVerifyContainer(f, "a.tqkv").status().IsCorruption());
}

TEST(AlignmentContainerTest, NonZeroPaddingIsRefused) {
  const WrittenContainer w = WriteContainer(Aligned(SmallHeader(), 64));
  ASSERT_TRUE(w.status.ok());
  auto parsed = format::ParseAndVerifyContainer(w.file, "a.tqkv");
  ASSERT_TRUE(parsed.ok());
  const uint64_t header_end = format::kPreambleBytes + format::LoadU32(w.file.data() + 20);
  ASSERT_LT(header_end, parsed->header_block_end);
  const ChunkEntry& c6 = parsed->chunks[6];  // the 4-byte group-meta chunk: 60 bytes of padding
  for (uint64_t at : {header_end, parsed->header_block_end - 1, c6.offset + c6.size,
                      parsed->chunks[7].offset - 1}) {
    std::vector<uint8_t> f = w.file;
    f[at] = 0x80;
    auto s = format::ParseAndVerifyContainer(f, "a.tqkv").status();
    EXPECT_TRUE(s.IsCorruption()) << at;
    EXPECT_NE(s.message().find("padding"), std::string::npos) << s.message();
    EXPECT_TRUE(OpenAndReadAll(f).IsCorruption()) << at;
  }
}

TEST(AlignmentContainerTest, EveryTruncationAndFlippedByteIsRefused) {
  const WrittenContainer w = WriteContainer(Aligned(SmallExactHeader(), 128));
  ASSERT_TRUE(w.status.ok());
  for (size_t n = 0; n < w.file.size(); ++n) {
    auto s = format::ParseAndVerifyContainer(std::span<const uint8_t>(w.file).first(n), "t");
    ASSERT_TRUE(s.status().IsCorruption()) << n << ": " << s.status().ToString();
  }
  std::vector<uint8_t> f = w.file;
  for (size_t i = 0; i < f.size(); ++i) {
    f[i] ^= 0x01;
    auto s = format::ParseAndVerifyContainer(f, "t").status();
    ASSERT_TRUE(s.IsCorruption() || s.code() == StatusCode::kUnsupported) << i << ": " << s.ToString();
    f[i] ^= 0x01;
  }
}

}  // namespace
}  // namespace tqkv::testing_format
