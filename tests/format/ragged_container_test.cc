// Format version 7: a token count per layer (ragged sessions, docs/format.md §4). Written only
// when some layer holds fewer tokens than the session; every size follows the layer's count; the
// parser refuses a bad table and a table where its version has none.
#include <gtest/gtest.h>

#include "container_test_util.h"

namespace tqkv::testing_format {
namespace {

TEST(RaggedContainerTest, EachLayerHasChunksForItsOwnTokens) {
  const ContainerHeader h = SmallRaggedHeader();
  ASSERT_EQ(ContainerVersionFor(h), 7u);
  // SmallCenteredHeader's 208 bytes + layer_codec_v (4) + guard_stride and allocated_bits (8,
  // no codec_error without a stride) + the table (2 x 8).
  EXPECT_EQ(format::EncodeHeaderBody(h).size(), 208u + 4 + 8 + 16);
  WrittenContainer w = WriteContainer(h);
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  EXPECT_EQ(format::LoadU32(w.file.data() + 8), 7u);
  auto parsed = format::ParseAndVerifyContainer(w.file, "r.tqkv");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->header.layer_tokens, (std::vector<uint64_t>{40, 21}));
  EXPECT_EQ(parsed->header.guard_stride, 0u);
  EXPECT_TRUE(parsed->header.codec_error.empty());
  // Layer 1 (split TurboQuant): meta, key means of (2 blocks x 16 + 21) x 2 bytes, K [0,16)
  // [16,21), V likewise, exact rows; layer 0 as in SmallCenteredHeader.
  std::vector<ChunkEntry> layer1;
  for (const ChunkEntry& e : parsed->chunks) {
    if (e.layer == 1) layer1.push_back(e);
  }
  ASSERT_EQ(layer1.size(), 7u);
  EXPECT_EQ(layer1[1].type, ChunkType::kKeyMeans);
  EXPECT_EQ(layer1[1].size, (2u * 16 + 21) * 2);
  EXPECT_EQ(layer1[3].token_begin, 16u);
  EXPECT_EQ(layer1[3].token_count, 5u);
  EXPECT_EQ(HeldTokens(parsed->header), 61u);
  EXPECT_TRUE(OpenAndReadAll(w.file).ok());
}

TEST(RaggedContainerTest, RectangularSessionsKeepTheirVersionAndATableOfFullLayersIsRefused) {
  ContainerHeader h = SmallCenteredHeader();
  EXPECT_EQ(ContainerVersionFor(h), 4u);
  h.layer_tokens = {40, 40};  // every layer full: no version 7
  EXPECT_EQ(WriteContainer(h).status.code(), StatusCode::kInvalidArgument);
  h.layer_tokens = {40, 41};
  EXPECT_EQ(WriteContainer(h).status.code(), StatusCode::kInvalidArgument);
  h.layer_tokens = {0, 40};
  EXPECT_EQ(WriteContainer(h).status.code(), StatusCode::kInvalidArgument);
  h.layer_tokens = {40};
  EXPECT_EQ(WriteContainer(h).status.code(), StatusCode::kInvalidArgument);
  h.layer_tokens = {39, 30};  // no layer holds the 40 tokens the header names
  EXPECT_EQ(WriteContainer(h).status.code(), StatusCode::kInvalidArgument);
  // Exact rows must fit the shortest layer: 2 + 3 > 4.
  h.layer_tokens = {40, 4};
  EXPECT_EQ(WriteContainer(h).status.code(), StatusCode::kInvalidArgument);
  h.layer_tokens = {40, 5};
  EXPECT_TRUE(WriteContainer(h).status.ok());
}

// The table is the last 16 bytes of the header body: layer 0's count, then layer 1's.
void SetLayerTokens(std::vector<uint8_t>& f, uint32_t layer, uint64_t n) {
  const uint64_t body_end = format::kPreambleBytes + format::LoadU32(f.data() + 20);
  format::StoreU64(f.data() + body_end - 16 + 8 * layer, n);
  Resign(f);
}

TEST(RaggedContainerTest, TheParserRefusesBadTables) {
  const WrittenContainer w = WriteContainer(SmallRaggedHeader());
  ASSERT_TRUE(w.status.ok());
  for (const auto& [n, what] : std::vector<std::pair<uint64_t, std::string>>{
           {41, "layer 1 holds 41 tokens"},  // more than the session's 40
           {0, "layer 1 holds 0 tokens"},
           {40, "every layer holds all tokens"},  // all full: a version 7 without a reason
           {uint64_t{1} << 63, "layer 1 holds"}}) {
    SCOPED_TRACE(n);
    std::vector<uint8_t> f = w.file;
    SetLayerTokens(f, 1, n);
    auto parsed = format::ParseAndVerifyContainer(f, "r.tqkv");
    ASSERT_FALSE(parsed.ok());
    EXPECT_TRUE(parsed.status().IsCorruption()) << parsed.status().ToString();
    EXPECT_NE(parsed.status().message().find(what), std::string::npos)
        << parsed.status().ToString();
    EXPECT_TRUE(OpenAndReadAll(f).IsCorruption());
  }
  // No layer holding the session's tokens: the header would name tokens without codes.
  {
    std::vector<uint8_t> f = w.file;
    SetLayerTokens(f, 0, 39);
    auto parsed = format::ParseAndVerifyContainer(f, "r.tqkv");
    EXPECT_TRUE(parsed.status().IsCorruption()) << parsed.status().ToString();
    EXPECT_NE(parsed.status().message().find("no layer holds the session's 40 tokens"),
              std::string::npos)
        << parsed.status().ToString();
  }
  // A count that parses but disagrees with the chunks: the index no longer matches.
  std::vector<uint8_t> f = w.file;
  SetLayerTokens(f, 1, 22);
  EXPECT_TRUE(format::ParseAndVerifyContainer(f, "r.tqkv").status().IsCorruption());
}

TEST(RaggedContainerTest, ATableInAVersion6HeaderIsTrailingBytes) {
  // A version 6 file whose header body gains a (valid-looking) table: the reader of version 6
  // expects the body to end after codec_error.
  const WrittenContainer w = WriteContainer(SmallGuardHeader());
  ASSERT_TRUE(w.status.ok());
  std::vector<uint8_t> f = w.file;
  ASSERT_EQ(format::LoadU32(f.data() + 8), 6u);
  const uint32_t size = format::LoadU32(f.data() + 20);
  ASSERT_LE(format::kPreambleBytes + size + 16, kContainerAlignment);  // fits the padding
  format::StoreU64(f.data() + format::kPreambleBytes + size, 40);
  format::StoreU64(f.data() + format::kPreambleBytes + size + 8, 21);
  format::StoreU32(f.data() + 20, size + 16);
  Resign(f);
  auto parsed = format::ParseAndVerifyContainer(f, "g.tqkv");
  ASSERT_FALSE(parsed.ok());
  EXPECT_TRUE(parsed.status().IsCorruption()) << parsed.status().ToString();
  EXPECT_NE(parsed.status().message().find("header body end"), std::string::npos)
      << parsed.status().ToString();
  // And a version 7 relabelled 6 (preamble and footer): no figures, so no version 6.
  std::vector<uint8_t> r = WriteContainer(SmallRaggedHeader()).file;
  format::StoreU32(r.data() + 8, 6);
  format::StoreU32(r.data() + r.size() - 64 + 40, 6);
  Resign(r);
  EXPECT_TRUE(format::ParseAndVerifyContainer(r, "r.tqkv").status().IsCorruption());
}

}  // namespace
}  // namespace tqkv::testing_format
