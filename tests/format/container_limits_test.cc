// Resource limits of the container (docs/format.md "Resource limits"): a checksum-valid file
// cannot make the reader build rotations or matrices larger than the limits, and the writer
// refuses to write what the reader would refuse.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "format/container_test_util.h"
#include "test_paths.h"

namespace tqkv::testing_format {
namespace {

// Writes `valid`, then replaces its header body with `forged`'s (same length) and re-signs: a
// file whose every checksum is right but whose header says `forged`.
std::vector<uint8_t> Forge(const ContainerHeader& valid, const ContainerHeader& forged) {
  WrittenContainer w = WriteContainer(valid);
  EXPECT_TRUE(w.status.ok()) << w.status.ToString();
  const std::vector<uint8_t> body = format::EncodeHeaderBody(forged);
  EXPECT_EQ(body.size(), format::EncodeHeaderBody(valid).size());
  std::copy(body.begin(), body.end(), w.file.begin() + format::kPreambleBytes);
  Resign(w.file);
  return w.file;
}

void ExpectRefused(std::span<const uint8_t> file, const std::string& why) {
  const auto t0 = std::chrono::steady_clock::now();
  Status s = OpenAndReadAll(file);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find(why), std::string::npos) << s.message();
  auto parsed = format::ParseAndVerifyContainer(file, "t.tqkv");
  EXPECT_TRUE(parsed.status().IsCorruption()) << parsed.status().ToString();
  // Refused from the header alone: nothing is built, so this is instant.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
}

// Issue 13, defect 2: a 9 KB (head_dim 8192) and a 16.5 KB (32768) Hadamard file rewritten to
// Haar used to verify OK and then cost O(d^2) memory and O(d^3) time to decode.
TEST(ContainerLimits, LargeHaarRotationIsRefused) {
  for (uint32_t d : {8192u, 32768u}) {
    const ContainerHeader h = MakeHeader({1, 1, d}, 1, 16, {TqParams(d, 1)}, {0});
    ContainerHeader haar = h;
    haar.codecs[0].subsets[0].rotation = RotationKind::kHaar;
    const std::vector<uint8_t> file = Forge(h, haar);
    EXPECT_LT(file.size(), 20000u);
    ExpectRefused(file, "haar rotation on " + std::to_string(d) + " channels (at most 256)");
    // The writer refuses it too: nothing writes what no reader opens.
    MemoryWritable out;
    EXPECT_EQ(ContainerWriter::Create(&out, haar).status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(ContainerLimits, HaarUpToTheLimitIsAccepted) {
  ContainerHeader h = MakeHeader({1, 1, 256}, 3, 16, {TqParams(256, 2)}, {0});
  h.codecs[0].subsets[0].rotation = RotationKind::kHaar;
  WrittenContainer w = WriteContainer(h);
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  EXPECT_TRUE(OpenAndReadAll(w.file).ok());
  h.codecs[0].subsets[0].channels = 257;  // one over (and head_dim with it)
  h.codecs[0].head_dim = h.geometry.head_dim = 257;
  MemoryWritable out;
  Status over = ContainerWriter::Create(&out, h).status();
  EXPECT_NE(over.message().find("haar rotation on 257 channels (at most 256)"), std::string::npos)
      << over.ToString();
  EXPECT_EQ(MaxRotationChannels(RotationKind::kHaar), 256u);
  EXPECT_EQ(MaxRotationChannels(RotationKind::kHadamard), 32768u);
}

// A Kronecker rotation builds a Haar matrix of the odd part q of its m = q * B channels only.
TEST(ContainerLimits, KroneckerHaarFactorIsBounded) {
  ContainerHeader h = MakeHeader({1, 1, 96}, 3, 16, {TqParams(96, 2)}, {0});
  h.codecs[0].subsets[0].rotation = RotationKind::kKronecker;  // q = 3, B = 32
  WrittenContainer w = WriteContainer(h);
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  EXPECT_TRUE(OpenAndReadAll(w.file).ok());
  CodecParams haar = h.codecs[0];
  haar.subsets[0].rotation = RotationKind::kHaar;
  EXPECT_LT(SetupCostOf(h.codecs[0]).ops * 100, SetupCostOf(haar).ops);  // a 3 x 3 Haar factor

  // 514 = 257 * 2: the Haar factor is one over the Haar limit, though 514 < 32768.
  h.codecs[0].head_dim = h.geometry.head_dim = h.codecs[0].subsets[0].channels = 514;
  MemoryWritable out;
  const Status over = ContainerWriter::Create(&out, h).status();
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(over.message().find("kron rotation on 514 channels: Haar factor 257 (at most 256)"),
            std::string::npos)
      << over.ToString();
  // 255 * 64 = 16320: a Haar factor within the limit and a long Hadamard block is fine.
  h.codecs[0].head_dim = h.geometry.head_dim = h.codecs[0].subsets[0].channels = 16320;
  EXPECT_TRUE(ValidateCodecParams(h.codecs[0]).ok());
  EXPECT_EQ(MaxRotationChannels(RotationKind::kKronecker), 32768u);
}

TEST(ContainerLimits, DenseQjlMatrixIsBounded) {
  const ContainerHeader h = MakeHeader({1, 1, 1024}, 1, 16, {TqParams(1024, 2)}, {0});
  ContainerHeader qjl = h;
  qjl.codecs[0].qjl = true;
  ExpectRefused(Forge(h, qjl), "qjl on head_dim 1024");
  EXPECT_TRUE(ValidateCodecParams(TqParams(kMaxQjlHeadDim, 2, true)).ok());
}

// Many codecs, each within its own limit, together over the per-container build budget.
TEST(ContainerLimits, CodecsTogetherStayWithinTheBuildBudget) {
  const uint32_t d = 256;
  std::vector<CodecParams> codecs;
  std::vector<uint16_t> layer_codec;
  for (uint16_t i = 0; i < 300; ++i) {
    codecs.push_back(TqParams(d, 1));
    codecs.back().subsets[0].seed = i;
    layer_codec.push_back(i);
  }
  const ContainerHeader h = MakeHeader({300, 1, d}, 1, 16, codecs, layer_codec);
  ContainerHeader haar = h;
  for (auto& c : haar.codecs) c.subsets[0].rotation = RotationKind::kHaar;
  const CodecSetupCost one = SetupCostOf(haar.codecs[0]);
  ASSERT_LT(one.ops, kMaxSetupOps);
  ASSERT_GT(300 * one.ops, kMaxSetupOps);
  ExpectRefused(Forge(h, haar), "to build (at most");
  WrittenContainer hadamard = WriteContainer(h);  // 300 Hadamard codecs: small, accepted
  ASSERT_TRUE(hadamard.status.ok()) << hadamard.status.ToString();
  EXPECT_TRUE(OpenAndReadAll(hadamard.file).ok());
}

TEST(ContainerLimits, GeometryLimits) {
  MemoryWritable out;
  ContainerHeader h = MakeHeader({kMaxLayers + 1, 1, 16}, 1, 16, {RawParams(16)},
                                 std::vector<uint16_t>(kMaxLayers + 1, 0));
  Status s = ContainerWriter::Create(&out, h).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("at most 65536 layers"), std::string::npos) << s.message();
  h = MakeHeader({1, kMaxKvHeads + 1, 16}, 1, 16, {RawParams(16)}, {0});
  EXPECT_EQ(ContainerWriter::Create(&out, h).status().code(), StatusCode::kInvalidArgument);
}

// Seeds of the fuzz corpus at and over the limits (fuzz/container_fuzz.cc decodes what it
// accepts): a dense Haar rotation at its largest size, a split codec with a Haar subset, the
// largest Hadamard head_dim, and the forged Haar file of defect 2. TQKV_WRITE_LIMIT_SEEDS=1
// rewrites them; otherwise they must be there, byte for byte, with the reader's verdict.
TEST(ContainerLimits, LimitSeedsInTheFuzzCorpus) {
  struct Seed {
    const char* file;
    std::vector<uint8_t> bytes;
    bool accepted;
  };
  std::vector<Seed> seeds;
  ContainerHeader haar = MakeHeader({1, 1, 256}, 2, 16, {TqParams(256, 1)}, {0});
  haar.codecs[0].subsets[0].rotation = RotationKind::kHaar;
  seeds.push_back({"limit_haar256.tqkv", WriteContainer(haar, 5).file, true});
  seeds.push_back({"limit_split_haar96.tqkv",
                   WriteContainer(MakeHeader({1, 2, 128}, 3, 2, {SplitParams(128)}, {0}), 6).file,
                   true});
  const ContainerHeader hd = MakeHeader({1, 1, 32768}, 1, 16, {TqParams(32768, 1)}, {0});
  seeds.push_back({"limit_hd32768.tqkv", WriteContainer(hd, 7).file, true});
  const ContainerHeader hd8k = MakeHeader({1, 1, 8192}, 1, 16, {TqParams(8192, 1)}, {0});
  ContainerHeader forged = hd8k;
  forged.codecs[0].subsets[0].rotation = RotationKind::kHaar;
  seeds.push_back({"over_haar8192.tqkv", Forge(hd8k, forged), false});

  const bool write = std::getenv("TQKV_WRITE_LIMIT_SEEDS") != nullptr;
  for (const Seed& seed : seeds) {
    SCOPED_TRACE(seed.file);
    ASSERT_FALSE(seed.bytes.empty());
    EXPECT_LE(seed.bytes.size(), 65536u);  // the fuzz run's -max_len
    EXPECT_EQ(OpenAndReadAll(seed.bytes).ok(), seed.accepted);
    const std::string path = tqkv::test::SourceDir() + "/fuzz/corpus/container/" + seed.file;
    if (write) {
      std::ofstream(path, std::ios::binary)
          .write(reinterpret_cast<const char*>(seed.bytes.data()),
                 static_cast<std::streamsize>(seed.bytes.size()));
    }
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(in.good()) << path;
    const std::vector<uint8_t> stored((std::istreambuf_iterator<char>(in)),
                                      std::istreambuf_iterator<char>());
    EXPECT_EQ(stored, seed.bytes);
  }
}

}  // namespace
}  // namespace tqkv::testing_format
