// Format version 5: separate K and V codecs (docs/format.md §4, §5): layout, sizes, and what the
// writer refuses and the reader flags.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "format/container_layout.h"
#include "format/container_parse.h"
#include "format/container_test_util.h"

namespace tqkv {
namespace {

using namespace testing_format;  // NOLINT

// Where the V indices start: the end of the body minus 2 bytes per layer.
uint64_t VIndicesAt(const std::vector<uint8_t>& f, uint32_t layers) {
  return format::kPreambleBytes + format::LoadU32(f.data() + 20) - 2ull * layers;
}

TEST(KvCodecsFormat, Version5OnlyWhenKAndVDiffer) {
  ContainerHeader h = SmallHeader();
  EXPECT_EQ(ContainerVersionFor(h), 1u);
  h.layer_codec_v = h.layer_codec;  // the same codecs: no version 5, no V indices on disk
  EXPECT_EQ(ContainerVersionFor(h), 1u);
  WrittenContainer same = WriteContainer(h);
  ASSERT_TRUE(same.status.ok());
  EXPECT_EQ(same.file, WriteContainer(SmallHeader()).file);
  EXPECT_EQ(ContainerVersionFor(SmallKvHeader()), 5u);
  EXPECT_EQ(ContainerVersionFor(SmallKvCenteredHeader()), 5u);
}

TEST(KvCodecsFormat, LayoutAndChunkSizes) {
  const ContainerHeader h = SmallKvHeader();
  WrittenContainer w = WriteContainer(h);
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  // Header body: SmallHeader's 191 bytes + exact rows (8) + engine state length (4) + key mean
  // block and dtype (5) + 2 V indices (4).
  EXPECT_EQ(format::LoadU32(w.file.data() + 8), 5u);
  EXPECT_EQ(format::LoadU32(w.file.data() + 20), 191u + 8 + 4 + 5 + 4);
  const uint64_t v_at = VIndicesAt(w.file, 2);
  EXPECT_EQ(format::LoadU32(w.file.data() + v_at - 5), 0u);  // key_mean_block 0
  EXPECT_EQ(w.file[v_at - 1], 0u);                            // key_mean_dtype 0
  EXPECT_EQ(format::LoadU16(w.file.data() + v_at), 1u);
  EXPECT_EQ(format::LoadU16(w.file.data() + v_at + 2), 0u);
  auto parsed = format::ParseAndVerifyContainer(w.file, "kv.tqkv");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->header.layer_codec_v, (std::vector<uint16_t>{1, 0}));
  EXPECT_EQ(parsed->header.key_mean_block, 0u);
  // Layer 0: meta (V's 2-byte mask), K raw (32 bytes a token), V split (16); layer 1 the other
  // way round, its meta K's mask. 14 chunks.
  ASSERT_EQ(parsed->chunks.size(), 14u);
  for (const ChunkEntry& e : parsed->chunks) {
    if (e.type == ChunkType::kGroupMeta) {
      EXPECT_EQ(e.size, 2u);
      continue;
    }
    const bool raw = (e.layer == 0) == (e.kv == 0);
    EXPECT_EQ(e.size, e.token_count * (raw ? 32u : 16u)) << format::DescribeChunk(e);
    EXPECT_EQ(*ExpectedChunkBytes(h, e), e.size);
  }
}

// Every informative bit flip of the version-5 files: container_test.cc's
// ExactRowsKeyMeansAndKvFilesEveryInformativeBitFlipIsCaught.

// Re-signed headers (valid checksums) with a bad V field: Corruption naming it.
TEST(KvCodecsFormat, ForgedVFieldsAreCorruption) {
  WrittenContainer w = WriteContainer(SmallKvHeader());
  ASSERT_TRUE(w.status.ok());
  const uint64_t v_at = VIndicesAt(w.file, 2);
  struct Case {
    const char* what;
    uint64_t at;
    uint16_t value;
    const char* says;
  } cases[] = {
      {"V index out of range", v_at, 2, "V uses codec 2 of 2"},
      {"V index huge", v_at + 2, 0xFFFF, "V uses codec 65535"},
      {"V equals K everywhere (not canonical)", v_at, 0, "format version"},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> f = w.file;
    format::StoreU16(f.data() + c.at, c.value);
    if (c.value == 0) format::StoreU16(f.data() + c.at + 2, 1);  // {0, 1} = layer_codec
    Resign(f);
    Status s = OpenAndReadAll(f);
    EXPECT_TRUE(s.IsCorruption()) << c.what << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << c.what << ": " << s.ToString();
  }
  {  // A key-mean dtype without key means.
    std::vector<uint8_t> f = w.file;
    f[v_at - 1] = 1;
    Resign(f);
    Status s = OpenAndReadAll(f);
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    EXPECT_NE(s.message().find("key mean dtype"), std::string::npos) << s.ToString();
  }
  {  // A version-4 file relabelled 5: the V indices are missing.
    WrittenContainer v4 = WriteContainer(SmallCenteredHeader());
    ASSERT_TRUE(v4.status.ok());
    std::vector<uint8_t> f = v4.file;
    format::StoreU32(f.data() + 8, 5);
    format::StoreU32(f.data() + f.size() - 64 + 40, 5);
    Resign(f);
    Status s = OpenAndReadAll(f);
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    EXPECT_NE(s.message().find("V codec indices"), std::string::npos) << s.ToString();
  }
  {  // A version-5 file relabelled 4: key_mean_block 0 and trailing bytes.
    std::vector<uint8_t> f = w.file;
    format::StoreU32(f.data() + 8, 4);
    format::StoreU32(f.data() + f.size() - 64 + 40, 4);
    Resign(f);
    EXPECT_TRUE(OpenAndReadAll(f).IsCorruption());
  }
}

TEST(KvCodecsFormat, WriterRefusesBadVIndices) {
  for (const std::vector<uint16_t>& v : {std::vector<uint16_t>{1}, std::vector<uint16_t>{1, 0, 0},
                                         std::vector<uint16_t>{2, 0}}) {
    ContainerHeader h = SmallHeader();
    h.layer_codec_v = v;
    EXPECT_EQ(WriteContainer(h).status.code(), StatusCode::kInvalidArgument) << v.size();
  }
}

}  // namespace
}  // namespace tqkv
