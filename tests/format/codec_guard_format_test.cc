// Format version 6: the guard's codec errors and the allocator's budget in the header
// (docs/format.md §4): layout, round trip, and what the writer refuses and the reader flags.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "format/container_layout.h"
#include "format/container_parse.h"
#include "format/container_test_util.h"

namespace tqkv {
namespace {

using namespace testing_format;  // NOLINT

// Where the guard fields start: the end of the body minus stride, budget and 24 bytes per tensor.
uint64_t GuardAt(const std::vector<uint8_t>& f, uint32_t layers) {
  return format::kPreambleBytes + format::LoadU32(f.data() + 20) - 8 - 48ull * layers;
}

TEST(CodecGuardFormat, Version6LayoutAndRoundTrip) {
  const ContainerHeader h = SmallGuardHeader();
  EXPECT_EQ(ContainerVersionFor(h), 6u);
  WrittenContainer w = WriteContainer(h);
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  EXPECT_EQ(format::LoadU32(w.file.data() + 8), 6u);
  // SmallHeader's 191 bytes + exact rows (8) + engine state length (4) + key means (5) + V
  // indices (4, equal to K's) + stride (4) + budget (4) + 2 layers x 2 tensors x 24.
  EXPECT_EQ(format::LoadU32(w.file.data() + 20), 191u + 8 + 4 + 5 + 4 + 4 + 4 + 96);
  const uint64_t at = GuardAt(w.file, 2);
  EXPECT_EQ(format::LoadU16(w.file.data() + at - 4), 0u);  // V indices = layer_codec {0, 1}
  EXPECT_EQ(format::LoadU16(w.file.data() + at - 2), 1u);
  EXPECT_EQ(format::LoadU32(w.file.data() + at), 2u);      // stride
  EXPECT_EQ(format::LoadU32(w.file.data() + at + 4), 0u);  // no budget
  EXPECT_EQ(format::LoadU64(w.file.data() + at + 8), std::bit_cast<uint64_t>(1.5));
  EXPECT_EQ(format::LoadU64(w.file.data() + at + 8 + 3 * 24 + 16), std::bit_cast<uint64_t>(400.0));
  auto parsed = format::ParseAndVerifyContainer(w.file, "g.tqkv");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->header.guard_stride, 2u);
  EXPECT_EQ(parsed->header.codec_error, h.codec_error);
  EXPECT_EQ(parsed->header.allocated_bits, 0.0f);
  EXPECT_FALSE(HasSeparateKvCodecs(parsed->header));
  // The same chunks as version 1: the guard lives in the header only.
  EXPECT_EQ(parsed->chunks.size(), format::ParseAndVerifyContainer(
                                       WriteContainer(SmallHeader()).file, "s")->chunks.size());

  const ContainerHeader a = SmallGuardAllocatedHeader();
  WrittenContainer wa = WriteContainer(a);
  ASSERT_TRUE(wa.status.ok()) << wa.status.ToString();
  auto pa = format::ParseAndVerifyContainer(wa.file, "a.tqkv");
  ASSERT_TRUE(pa.ok()) << pa.status().ToString();
  EXPECT_EQ(pa->header.allocated_bits, 3.5f);
  EXPECT_EQ(pa->header.layer_codec_v, (std::vector<uint16_t>{1, 0}));
  EXPECT_EQ(pa->header.key_mean_block, a.key_mean_block);
  EXPECT_EQ(pa->header.codec_error, a.codec_error);
}

TEST(CodecGuardFormat, Figures) {
  EXPECT_DOUBLE_EQ(RelativeError({1.5, 3.0, 12.0}), 0.5);
  EXPECT_DOUBLE_EQ(SharedFraction({1.5, 3.0, 12.0}), 0.75);
  EXPECT_EQ(RelativeError({0, 0, 0}), 0.0);
  EXPECT_DOUBLE_EQ(RelativeError({1, 0, 5}), 0.2);  // nothing varies: err / energy
  EXPECT_EQ(SharedFraction({0, 0, 0}), 0.0);
}

// Re-signed headers (valid checksums) with bad guard fields: Corruption naming them.
TEST(CodecGuardFormat, ForgedGuardFieldsAreCorruption) {
  WrittenContainer w = WriteContainer(SmallGuardHeader());
  ASSERT_TRUE(w.status.ok());
  const uint64_t at = GuardAt(w.file, 2);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    const char* what;
    uint64_t offset;
    uint64_t value;  // stored as u32 when `u32`
    bool u32;
    const char* says;
  } cases[] = {
      {"stride 0", at, 0, true, "guard stride"},
      {"negative error", at + 8, std::bit_cast<uint64_t>(-1.0), false, "layer 0 K"},
      {"NaN varying energy", at + 8 + 24 + 8, std::bit_cast<uint64_t>(nan), false, "layer 0 V"},
      {"inf energy", at + 8 + 72 + 16, std::bit_cast<uint64_t>(HUGE_VAL), false, "layer 1 V"},
      {"negative budget", at + 4, std::bit_cast<uint32_t>(-3.0f), true, "allocated bits"},
      {"budget over 64", at + 4, std::bit_cast<uint32_t>(65.0f), true, "allocated bits"},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> f = w.file;
    if (c.u32) {
      format::StoreU32(f.data() + c.offset, static_cast<uint32_t>(c.value));
    } else {
      format::StoreU64(f.data() + c.offset, c.value);
    }
    Resign(f);
    Status s = OpenAndReadAll(f);
    EXPECT_TRUE(s.IsCorruption()) << c.what << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << c.what << ": " << s.ToString();
  }
  {  // A version-5 file relabelled 6: the guard fields are missing.
    WrittenContainer v5 = WriteContainer(SmallKvHeader());
    ASSERT_TRUE(v5.status.ok());
    std::vector<uint8_t> f = v5.file;
    format::StoreU32(f.data() + 8, 6);
    format::StoreU32(f.data() + f.size() - 64 + 40, 6);
    Resign(f);
    Status s = OpenAndReadAll(f);
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    EXPECT_NE(s.message().find("guard stride"), std::string::npos) << s.ToString();
  }
  {  // A version-6 file relabelled 5: trailing bytes after the V indices.
    std::vector<uint8_t> f = w.file;
    format::StoreU32(f.data() + 8, 5);
    format::StoreU32(f.data() + f.size() - 64 + 40, 5);
    Resign(f);
    EXPECT_TRUE(OpenAndReadAll(f).IsCorruption());
  }
}

TEST(CodecGuardFormat, WriterRefusesBadGuardFields) {
  std::vector<ContainerHeader> bad;
  ContainerHeader h = SmallGuardHeader();
  h.codec_error.pop_back();  // 3 entries for 2 layers
  bad.push_back(h);
  h = SmallGuardHeader();
  h.codec_error[2].var = -1;
  bad.push_back(h);
  h = SmallHeader();
  h.codec_error = SmallGuardHeader().codec_error;  // figures without a stride
  bad.push_back(h);
  h = SmallHeader();
  h.allocated_bits = 3;  // a budget without figures
  bad.push_back(h);
  h = SmallGuardHeader();
  h.allocated_bits = std::numeric_limits<float>::infinity();
  bad.push_back(h);
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_EQ(WriteContainer(bad[i]).status.code(), StatusCode::kInvalidArgument) << i;
  }
}

}  // namespace
}  // namespace tqkv

namespace tqkv {
namespace {

// docs/format.md §4's reader rules that were unstated (issue 34 defect 10): a key_mean_block past
// the session's length is one block; a guard_stride past it sampled token 0 only; -0.0 sums are
// zeros; a negative or non-finite sum is Corruption.
TEST(CodecGuardFormat, EdgeValuesReadersAccept) {
  ContainerHeader h = SmallGuardAllocatedHeader();
  ASSERT_GT(h.key_mean_block, 0u);
  h.key_mean_block = static_cast<uint32_t>(h.tokens * 10);
  h.guard_stride = 0xFFFFFFFFu;
  h.codec_error[0] = {-0.0, -0.0, -0.0};
  WrittenContainer w = WriteContainer(h);
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  EXPECT_TRUE(OpenAndReadAll(w.file).ok());
  auto parsed = format::ParseAndVerifyContainer(w.file, "e.tqkv");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->header.key_mean_block, h.key_mean_block);
  EXPECT_EQ(RelativeError(parsed->header.codec_error[0]), 0.0);
  for (const ChunkEntry& e : parsed->chunks) {
    if (e.type == ChunkType::kKeyMeans) {  // one block: (head_dim + tokens) values per head
      EXPECT_EQ(e.size, (h.geometry.head_dim + h.tokens) * h.geometry.kv_heads *
                            DTypeSize(h.key_mean_dtype));
    }
  }
  h.codec_error[0] = {-1.0, 1.0, 1.0};
  EXPECT_FALSE(WriteContainer(h).status.ok());
}

// Nothing varies: the error is weighed against the energy (a lossless tensor is 0, never inf).
TEST(CodecGuardFormat, ZeroVarianceIsWeighedAgainstTheEnergy) {
  EXPECT_EQ(RelativeError({0, 0, 5}), 0.0);
  EXPECT_DOUBLE_EQ(RelativeError({1, 0, 5}), 0.2);
  EXPECT_TRUE(std::isinf(RelativeError({1, 0, 0})));
}

}  // namespace
}  // namespace tqkv
