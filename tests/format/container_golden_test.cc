// Golden files: the fuzz seeds under fuzz/corpus/container/ are version-1 to -9 containers
// written by an earlier build. They must still parse, and today's writer must still produce them byte for byte
// (a layout change without a format_version bump fails here). TQKV_WRITE_GOLDEN=1 rewrites them.
// Every one verifies and restores (issue 34: five had outlier masks that decoders refuse, which
// `tqkv verify` passed); a mask a decoder refuses is refused by verify and restore alike.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "format/container_parse.h"
#include "format/container_test_util.h"
#include "tqkv/checkpoint.h"
#include "tqkv/memory_store.h"
#include "test_paths.h"

namespace tqkv {
namespace {

using namespace testing_format;  // NOLINT

struct Golden {
  const char* file;
  ContainerHeader header;
};

std::vector<Golden> Goldens() {
  std::vector<Golden> g;
  g.push_back({"v1_raw_empty.tqkv", MakeHeader({1, 1, 16}, 0, 4, {RawParams(16)}, {0})});
  g.push_back({"v1_raw.tqkv", MakeHeader({1, 1, 16}, 3, 2, {RawParams(16, DType::kBF16)}, {0})});
  g.push_back({"v1_split.tqkv", MakeHeader({1, 1, 16}, 1, 8, {SplitParams(16)}, {0})});
  g.push_back({"v1_mixed.tqkv",
               MakeHeader({2, 1, 16}, 1, 1, {TqParams(16, 3, true), RawParams(16)}, {0, 1})});
  ContainerHeader exact = MakeHeader({2, 1, 16}, 3, 2, {TqParams(16, 3), RawParams(16)}, {0, 1});
  exact.exact_head = 1;
  exact.exact_tail = 1;
  g.push_back({"v2_exact.tqkv", exact});
  // Version 3: an engine state in the header, with and without exact rows.
  ContainerHeader engine = MakeHeader({1, 1, 16}, 2, 2, {RawParams(16)}, {0});
  engine.engine_state = {'t', 'e', 's', 't', 0x00, 0x01, 0xFE, 0xFF};
  g.push_back({"v3_engine_state.tqkv", engine});
  ContainerHeader engine_exact = exact;
  engine_exact.engine_state = {0x42};
  g.push_back({"v3_engine_state_exact.tqkv", engine_exact});
  // Version 4: key means over 2-token blocks in f16 (layer 0, TurboQuant), none for layer 1 (raw),
  // no exact rows; and with an engine state too.
  ContainerHeader means = MakeHeader({2, 1, 16}, 3, 2, {TqParams(16, 3), RawParams(16)}, {0, 1});
  means.key_mean_block = 2;
  means.key_mean_dtype = DType::kF16;
  g.push_back({"v4_key_means.tqkv", means});
  ContainerHeader means_engine = means;
  means_engine.engine_state = {0x07};
  g.push_back({"v4_key_means_engine_state.tqkv", means_engine});
  // Version 5: separate K and V codecs. Layer 0: K tq3, V split (a group-meta chunk of V's mask
  // only); layer 1: K raw, V tq3. Without key means (key_mean_block 0), and with key means
  // (layer 0's K), exact rows and an engine state.
  ContainerHeader kv =
      MakeHeader({2, 1, 16}, 3, 2, {TqParams(16, 3), RawParams(16), SplitParams(16)}, {0, 1});
  kv.layer_codec_v = {2, 0};
  g.push_back({"v5_kv_codecs.tqkv", kv});
  ContainerHeader kv_all = kv;
  kv_all.key_mean_block = 2;
  kv_all.key_mean_dtype = DType::kF16;
  kv_all.exact_head = 1;
  kv_all.exact_tail = 1;
  kv_all.engine_state = {0x05};
  g.push_back({"v5_kv_codecs_key_means_exact.tqkv", kv_all});
  // Version 6: the guard's codec errors (layer 0 K, V, layer 1 K, V) with one codec per layer
  // and no key means; and with everything of version 5 and an allocator's budget.
  ContainerHeader guard =
      MakeHeader({2, 1, 16}, 3, 2, {TqParams(16, 3), RawParams(16)}, {0, 1});
  guard.guard_stride = 1;
  guard.codec_error = {{0.5, 16.0, 20.0}, {0.25, 15.0, 15.5}, {0.0, 14.0, 14.0}, {0.0, 13.0, 80.0}};
  g.push_back({"v6_guard.tqkv", guard});
  ContainerHeader guard_all = kv_all;
  guard_all.guard_stride = 2;
  guard_all.codec_error = guard.codec_error;
  guard_all.allocated_bits = 3.25f;
  g.push_back({"v6_guard_allocated_kv_key_means.tqkv", guard_all});
  // Version 7: ragged layers. Version 4's key means with layer 1 (raw) holding 1 of the 3 tokens
  // and an engine state, no guard figures (stride 0, no codec_error bytes); and everything of
  // version 6 with layer 1 holding 2 of 3 (its exact rows [0, 1) and [1, 2)).
  ContainerHeader ragged = means;
  ragged.engine_state = {0x11};
  ragged.layer_tokens = {3, 1};
  g.push_back({"v7_ragged.tqkv", ragged});
  ContainerHeader ragged_all = guard_all;
  ragged_all.layer_tokens = {3, 2};
  g.push_back({"v7_ragged_guard_kv_key_means.tqkv", ragged_all});
  // Version 8: the transform codec kl (layer 0, with key means and guard figures; layer 1 raw),
  // and the same session ragged, kl on V of layer 1.
  ContainerHeader kl =
      MakeHeader({2, 1, 16}, 3, 2, {KlParams(16, 40), RawParams(16)}, {0, 1});
  kl.key_mean_block = 2;
  kl.key_mean_dtype = DType::kF16;
  kl.guard_stride = 1;
  kl.codec_error = guard.codec_error;
  kl.exact_tail = 1;
  g.push_back({"v8_kl.tqkv", kl});
  ContainerHeader kl_ragged = kl;
  kl_ragged.layer_codec_v = {0, 0};
  kl_ragged.layer_tokens = {3, 2};
  g.push_back({"v8_kl_ragged_kv.tqkv", kl_ragged});
  // Version 9: payloads 64-aligned, everything of version 6 (separate K/V codecs, key means, exact
  // rows, an engine state, guard figures, a budget); and 512-aligned with nothing else (every
  // optional field of versions 2 to 8 zero or empty).
  ContainerHeader align64 = guard_all;
  align64.payload_alignment = 64;
  g.push_back({"v9_align64.tqkv", align64});
  ContainerHeader align512 =
      MakeHeader({2, 1, 16}, 1, 1, {TqParams(16, 3, true), RawParams(16)}, {0, 1});
  align512.payload_alignment = 512;
  g.push_back({"v9_align512_plain.tqkv", align512});
  return g;
}

std::string Path(const char* file) {
  return tqkv::test::SourceDir() + "/fuzz/corpus/container/" + file;
}

TEST(ContainerGoldenTest, SeedsParseAndAreReproducedByTheWriter) {
  const bool write = std::getenv("TQKV_WRITE_GOLDEN") != nullptr;
  for (const Golden& g : Goldens()) {
    SCOPED_TRACE(g.file);
    WrittenContainer w = WriteContainer(g.header, 3);
    ASSERT_TRUE(w.status.ok()) << w.status.ToString();
    if (write) {
      std::ofstream(Path(g.file), std::ios::binary)
          .write(reinterpret_cast<const char*>(w.file.data()), w.file.size());
    }
    std::ifstream in(Path(g.file), std::ios::binary);
    ASSERT_TRUE(in.good()) << Path(g.file);
    const std::vector<uint8_t> golden((std::istreambuf_iterator<char>(in)),
                                      std::istreambuf_iterator<char>());
    auto parsed = format::ParseAndVerifyContainer(golden, g.file);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(parsed->header.tokens, g.header.tokens);
    EXPECT_TRUE(OpenAndReadAll(golden).ok());
    EXPECT_EQ(golden, w.file) << "the writer no longer reproduces a golden file";
  }
}

std::vector<uint8_t> ReadGolden(const std::string& file) {
  std::ifstream in(Path(file.c_str()), std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// `bytes` stored as key "g" of a fresh memory store; then VerifyObject's and Restore's verdicts.
std::pair<Status, Status> VerifyAndRestore(const std::vector<uint8_t>& bytes) {
  MemoryStore store;
  auto out = store.Create("g");
  if (!out.ok()) return {out.status(), out.status()};
  Status s = (*out)->Append(bytes);
  if (s.ok()) s = (*out)->Commit();
  if (!s.ok()) return {s, s};
  auto restored = Restore(store, "g", RestoreOptions{});
  return {VerifyObject(store, "g"), restored.status()};
}

TEST(ContainerGoldenTest, EveryGoldenFileVerifiesAndRestores) {
  std::vector<std::string> files;
  for (const Golden& g : Goldens()) files.push_back(g.file);
  files.push_back("limit_split_haar96.tqkv");
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    const std::vector<uint8_t> bytes = ReadGolden(f);
    ASSERT_FALSE(bytes.empty());
    const auto [verified, restored] = VerifyAndRestore(bytes);
    EXPECT_TRUE(verified.ok()) << verified.ToString();
    EXPECT_TRUE(restored.ok()) << restored.ToString();
  }
}

// v1_split's container with its K mask (4 of 16 channels) marking 7 channels: corruption for
// verify and restore alike, naming the mask.
TEST(ContainerGoldenTest, AnInvalidMaskFailsVerifyAsItFailsRestore) {
  const ContainerHeader h = MakeHeader({1, 1, 16}, 1, 8, {SplitParams(16)}, {0});
  MemoryWritable out;
  auto writer = ContainerWriter::Create(&out, h);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  const std::vector<ChunkEntry> keys = ExpectedKeys(h);
  ASSERT_EQ(keys.front().type, ChunkType::kGroupMeta);
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::vector<uint8_t> payload =
        i == 0 ? std::vector<uint8_t>{0x7F, 0x00, 0x0F, 0x00}  // K: 7 channels, V: 4
               : Payload(ChunkBytes(h, keys[i]), 3 + i);
    const Status added = (*writer)->AddChunk(keys[i], payload);
    ASSERT_TRUE(added.ok()) << i << ": " << added.ToString();
  }
  ASSERT_TRUE((*writer)->Finish().ok());
  const std::vector<uint8_t> bytes = out.bytes;
  const auto [verified, restored] = VerifyAndRestore(bytes);
  EXPECT_TRUE(verified.IsCorruption()) << verified.ToString();
  EXPECT_TRUE(restored.IsCorruption()) << restored.ToString();
  EXPECT_NE(verified.message().find("outlier mask"), std::string::npos) << verified.ToString();
  EXPECT_EQ(verified.message(), restored.message());
}

// A kl codec's metadata whose bits do not sum to the codec's code bits (docs/codec.md §11):
// corruption for verify and restore alike, naming why.
TEST(ContainerGoldenTest, AnInvalidKlMetadataFailsVerifyAsItFailsRestore) {
  const ContainerHeader h = MakeHeader({1, 1, 16}, 2, 2, {KlParams(16, 40)}, {0});
  const std::vector<ChunkEntry> keys = ExpectedKeys(h);
  ASSERT_EQ(keys.front().type, ChunkType::kGroupMeta);
  for (int fault = 0; fault < 3; ++fault) {
    SCOPED_TRACE(fault);
    MemoryWritable out;
    auto writer = ContainerWriter::Create(&out, h);
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    for (size_t i = 0; i < keys.size(); ++i) {
      std::vector<uint8_t> payload =
          i == 0 ? ValidMasks(h, keys[i], 5) : Payload(ChunkBytes(h, keys[i]), 3 + i);
      if (i == 0 && fault == 0) payload[84 + 3] ^= 1;  // V (after K's 84 bytes): a bit more or fewer
      if (i == 0 && fault == 1) payload[3] = 9;           // K: a channel of 9 bits
      if (i == 0 && fault == 2) payload[16 + 2 * 3 + 1] = 0xFC;  // K: a NaN mean
      const Status added = (*writer)->AddChunk(keys[i], payload);
      ASSERT_TRUE(added.ok()) << i << ": " << added.ToString();
    }
    ASSERT_TRUE((*writer)->Finish().ok());
    const auto [verified, restored] = VerifyAndRestore(out.bytes);
    EXPECT_TRUE(verified.IsCorruption()) << verified.ToString();
    EXPECT_TRUE(restored.IsCorruption()) << restored.ToString();
    EXPECT_NE(verified.message().find("kl group metadata"), std::string::npos)
        << verified.ToString();
  }
}

// A kl codec record is version 8's: the same header written as version 7 is refused.
TEST(ContainerGoldenTest, AKlCodecInAnOlderVersionIsRefused) {
  std::vector<uint8_t> bytes = ReadGolden("v8_kl.tqkv");
  ASSERT_GT(bytes.size(), 12u);
  bytes[8] = 7;  // format version
  const auto [verified, restored] = VerifyAndRestore(bytes);
  EXPECT_FALSE(verified.ok());
  EXPECT_TRUE(verified.IsCorruption()) << verified.ToString();
  EXPECT_FALSE(restored.ok());
}

}  // namespace
}  // namespace tqkv
