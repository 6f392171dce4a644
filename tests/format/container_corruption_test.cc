// Hostile files: every byte flipped, every truncation, garbage, forged fields with valid
// checksums, huge size fields. The reader must answer Corruption (Unsupported for the version),
// never crash, and never allocate more than the file's size.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <random>

#include "format/container_layout.h"
#include "format/container_parse.h"
#include "format/container_test_util.h"
#include "tqkv/container.h"

// Tracks the largest single allocation while g_track is set (replaces the global operator new for
// this test binary; every form maps to malloc/free so sanitizers still see matched pairs).
namespace {
std::atomic<bool> g_track{false};
std::atomic<size_t> g_max_alloc{0};
void* TrackedAlloc(size_t n) {
  if (g_track.load(std::memory_order_relaxed)) {
    size_t cur = g_max_alloc.load(std::memory_order_relaxed);
    while (n > cur && !g_max_alloc.compare_exchange_weak(cur, n)) {
    }
  }
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) std::abort();  // tests never expect allocation failure
  return p;
}
}  // namespace

void* operator new(size_t n) { return TrackedAlloc(n); }
void* operator new[](size_t n) { return TrackedAlloc(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return TrackedAlloc(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return TrackedAlloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace tqkv {
namespace {

using namespace testing_format;  // NOLINT
using format::LoadU16;
using format::LoadU32;
using format::LoadU64;
using format::StoreU16;
using format::StoreU32;
using format::StoreU64;

// Header body field offsets of SmallHeader() (model "test-model"), checked in SetUp.
constexpr size_t kLayersAt = 44;
constexpr size_t kTokensAt = 57;
constexpr size_t kTokenBlockAt = 65;
constexpr size_t kCodecCountAt = 69;
constexpr size_t kCodec0QjlAt = 75;
constexpr size_t kCentroidCountAt = 123;  // codec 1, subset 0
constexpr size_t kLayerCodecAt = 219;

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WrittenContainer w = WriteContainer(SmallHeader());
    ASSERT_TRUE(w.status.ok()) << w.status.ToString();
    file_ = std::move(w.file);
    ASSERT_TRUE(OpenAndReadAll(file_).ok());
    ASSERT_EQ(LoadU32(file_.data() + 20), 191u);  // header body size
    ASSERT_EQ(LoadU32(file_.data() + kLayersAt), 2u);
    ASSERT_EQ(LoadU64(file_.data() + kTokensAt), 40u);
    ASSERT_EQ(LoadU32(file_.data() + kTokenBlockAt), 16u);
    ASSERT_EQ(LoadU16(file_.data() + kCodecCountAt), 2u);
    ASSERT_EQ(LoadU16(file_.data() + kCentroidCountAt), 16u);
    ASSERT_EQ(LoadU16(file_.data() + kLayerCodecAt + 2), 1u);
    fat_ = file_.size() - 64;
    index_at_ = LoadU64(file_.data() + fat_);
  }

  // Opens and reads all chunks, and runs the in-memory parser; both must fail with `code`.
  void ExpectFails(const std::vector<uint8_t>& f, StatusCode code, const std::string& what) {
    Status s = OpenAndReadAll(f);
    EXPECT_EQ(s.code(), code) << what << ": " << s.ToString();
    EXPECT_EQ(s.message().rfind("t.tqkv: ", 0), 0u) << what << ": " << s.ToString();
    auto p = format::ParseAndVerifyContainer(f, "t.tqkv");
    EXPECT_EQ(p.status().code(), code) << what << ": " << p.status().ToString();
  }

  // Runs `edit` on a copy, re-signs the checksums, expects Corruption without a large allocation.
  void ExpectForgeryFails(const std::string& what,
                          const std::function<void(std::vector<uint8_t>&)>& edit) {
    std::vector<uint8_t> f = file_;
    edit(f);
    Resign(f);
    g_max_alloc = 0;
    g_track = true;
    Status s = OpenAndReadAll(f);
    g_track = false;
    EXPECT_TRUE(s.IsCorruption()) << what << ": " << s.ToString();
    EXPECT_LE(g_max_alloc.load(), f.size()) << what;
    auto p = format::ParseAndVerifyContainer(f, "t.tqkv");
    EXPECT_TRUE(p.status().IsCorruption()) << what << ": " << p.status().ToString();
  }

  std::vector<uint8_t> file_;
  uint64_t fat_ = 0;
  uint64_t index_at_ = 0;
};

TEST_F(CorruptionTest, FlipEveryByte) {
  // Most of the file is zero padding, all caught by the same check: it gets one flip per byte;
  // every byte that carries information also gets a single-bit flip, and the in-memory parser
  // must agree with the reader on it (this keeps the test fast under sanitizers).
  auto parsed = format::ParseAndVerifyContainer(file_, "t.tqkv");
  ASSERT_TRUE(parsed.ok());
  std::vector<bool> padding(file_.size(), false);
  for (uint64_t i = format::kPreambleBytes + LoadU32(file_.data() + 20);
       i < parsed->header_block_end; ++i) {
    padding[i] = true;
  }
  for (size_t c = 0; c < parsed->chunks.size(); ++c) {
    for (uint64_t i = format::PaddingBegin(*parsed, c); i < format::PaddingEnd(*parsed, c); ++i) {
      padding[i] = true;
    }
  }
  size_t informative = 0;
  std::vector<uint8_t> f = file_;
  for (size_t i = 0; i < f.size(); ++i) {
    informative += padding[i] ? 0 : 1;
    for (uint8_t mask : {uint8_t{0xFF}, static_cast<uint8_t>(1u << (i % 8))}) {
      if (mask != 0xFF && padding[i]) continue;
      f[i] ^= mask;
      const bool version = i >= 8 && i < 12;
      Status s = OpenAndReadAll(f);
      if (version) {
        EXPECT_EQ(s.code(), StatusCode::kUnsupported) << "byte " << i << ": " << s.ToString();
      } else {
        EXPECT_TRUE(s.IsCorruption()) << "byte " << i << " ^ " << int(mask) << ": " << s.ToString();
      }
      if (!padding[i] || i % 64 == 0) {
        EXPECT_EQ(format::ParseAndVerifyContainer(f, "t.tqkv").status().code(), s.code())
            << "byte " << i;
      }
      f[i] ^= mask;
      if (HasFailure()) return;  // one report is enough
    }
  }
  EXPECT_GT(informative, 1000u);
  EXPECT_GT(f.size() - informative, 40000u);
}

TEST_F(CorruptionTest, TruncateAtEveryLength) {
  for (size_t n = 0; n < file_.size(); ++n) {
    const std::span<const uint8_t> cut(file_.data(), n);
    Status s = OpenAndReadAll(cut);
    ASSERT_TRUE(s.IsCorruption()) << "length " << n << ": " << s.ToString();
    ASSERT_TRUE(format::ParseAndVerifyContainer(cut, "t.tqkv").status().IsCorruption()) << n;
  }
  std::vector<uint8_t> longer = file_;
  longer.push_back(0);
  ExpectFails(longer, StatusCode::kCorruption, "one byte appended");
}

TEST_F(CorruptionTest, RandomGarbage) {
  std::mt19937_64 rng(42);
  for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{64}, size_t{4175}, size_t{4176},
                   size_t{8192}, size_t{20000}, file_.size()}) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<uint8_t> f(n);
      for (auto& b : f) b = static_cast<uint8_t>(rng());
      ExpectFails(f, StatusCode::kCorruption, "garbage of " + std::to_string(n));
      if (n >= 12) {  // a valid magic and version, garbage after
        std::memcpy(f.data(), file_.data(), 12);
        ExpectFails(f, StatusCode::kCorruption, "garbage with preamble, " + std::to_string(n));
      }
      if (n >= format::kMinFileBytes) {  // and a valid-looking footer magic
        std::memcpy(f.data() + n - 8, file_.data(), 8);
        ExpectFails(f, StatusCode::kCorruption, "garbage with magics, " + std::to_string(n));
      }
    }
  }
  // The real file with one random 4 KiB page replaced by garbage.
  for (size_t page = 0; page * 4096 < file_.size(); ++page) {
    std::vector<uint8_t> f = file_;
    for (size_t i = page * 4096; i < std::min(f.size(), (page + 1) * 4096); ++i) {
      f[i] = static_cast<uint8_t>(rng());
    }
    ExpectFails(f, StatusCode::kCorruption, "garbage page " + std::to_string(page));
  }
}

TEST_F(CorruptionTest, HugeSizeFieldsWithValidChecksums) {
  ExpectForgeryFails("header size", [](auto& f) { StoreU32(f.data() + 20, 0xFFFFFFFFu); });
  ExpectForgeryFails("header size +1", [](auto& f) { StoreU32(f.data() + 20, 192); });
  ExpectForgeryFails("header size -1", [](auto& f) { StoreU32(f.data() + 20, 190); });
  ExpectForgeryFails("model length", [](auto& f) { StoreU16(f.data() + 32, 0xFFFF); });
  ExpectForgeryFails("layers", [](auto& f) { StoreU32(f.data() + kLayersAt, 0xFFFFFFFFu); });
  ExpectForgeryFails("layers 3", [](auto& f) { StoreU32(f.data() + kLayersAt, 3); });
  ExpectForgeryFails("kv_heads", [](auto& f) { StoreU32(f.data() + kLayersAt + 4, 0xFFFFFFFFu); });
  ExpectForgeryFails("tokens", [](auto& f) { StoreU64(f.data() + kTokensAt, UINT64_MAX); });
  ExpectForgeryFails("tokens + block 1", [](auto& f) {
    StoreU64(f.data() + kTokensAt, UINT64_MAX);
    StoreU32(f.data() + kTokenBlockAt, 1);
  });
  ExpectForgeryFails("token block 0", [](auto& f) { StoreU32(f.data() + kTokenBlockAt, 0); });
  ExpectForgeryFails("codec count", [](auto& f) { StoreU16(f.data() + kCodecCountAt, 0xFFFF); });
  ExpectForgeryFails("centroid count",
                     [](auto& f) { StoreU16(f.data() + kCentroidCountAt, 0xFFFF); });
  ExpectForgeryFails("index size", [this](auto& f) {
    StoreU64(f.data() + fat_ + 8, UINT64_MAX - 7);
    StoreU64(f.data() + fat_, fat_ - (UINT64_MAX - 7));
  });
  ExpectForgeryFails("index size 2^40", [this](auto& f) {
    StoreU64(f.data() + fat_ + 8, uint64_t{1} << 40);
    StoreU64(f.data() + fat_, fat_ - (uint64_t{1} << 40));
  });
  ExpectForgeryFails("index count",
                     [this](auto& f) { StoreU64(f.data() + index_at_, uint64_t{1} << 60); });
  ExpectForgeryFails("index offset", [this](auto& f) { StoreU64(f.data() + fat_, UINT64_MAX); });
  ExpectForgeryFails("file size", [this](auto& f) { StoreU64(f.data() + fat_ + 24, UINT64_MAX); });
  ExpectForgeryFails("chunk size",
                     [this](auto& f) { StoreU64(f.data() + index_at_ + 8 + 32, UINT64_MAX); });
  ExpectForgeryFails("chunk offset", [this](auto& f) {
    StoreU64(f.data() + index_at_ + 8 + 24, UINT64_MAX - 100);
  });
  ExpectForgeryFails("token count",
                     [this](auto& f) { StoreU64(f.data() + index_at_ + 8 + 16, UINT64_MAX); });
}

TEST_F(CorruptionTest, ForgedStructureWithValidChecksums) {
  const uint64_t rec = index_at_ + 8;  // first index record
  ExpectForgeryFails("flags", [](auto& f) { f[12] = 1; });
  ExpectForgeryFails("checksum type", [](auto& f) { f[16] = 2; });
  ExpectForgeryFails("preamble reserved", [](auto& f) { f[18] = 1; });
  ExpectForgeryFails("bool not 0/1", [](auto& f) { f[kCodec0QjlAt] = 2; });
  ExpectForgeryFails("layer codec out of range",
                     [](auto& f) { StoreU16(f.data() + kLayerCodecAt, 2); });
  ExpectForgeryFails("header padding", [](auto& f) { f[300] = 1; });
  ExpectForgeryFails("swap records", [rec](auto& f) {
    std::vector<uint8_t> tmp(f.begin() + rec, f.begin() + rec + 48);
    std::copy(f.begin() + rec + 48, f.begin() + rec + 96, f.begin() + rec);
    std::copy(tmp.begin(), tmp.end(), f.begin() + rec + 48);
  });
  ExpectForgeryFails("misaligned chunk",
                     [rec](auto& f) { StoreU64(f.data() + rec + 24, 4096 + 8); });
  ExpectForgeryFails("chunk moved a page", [rec](auto& f) { StoreU64(f.data() + rec + 24, 8192); });
  ExpectForgeryFails("overlapping chunk",
                     [rec](auto& f) { StoreU64(f.data() + rec + 48 + 24, 4096); });
  ExpectForgeryFails("chunk size +1",
                     [rec](auto& f) { StoreU64(f.data() + rec + 32, 16 * 32 + 1); });
  ExpectForgeryFails("record reserved", [rec](auto& f) { f[rec + 2] = 1; });
  ExpectForgeryFails("record type", [rec](auto& f) { f[rec] = 3; });
  ExpectForgeryFails("record kv", [rec](auto& f) { f[rec + 1] = 1; });
  ExpectForgeryFails("record layer", [rec](auto& f) { StoreU32(f.data() + rec + 4, 1); });
  ExpectForgeryFails("record token_begin", [rec](auto& f) { StoreU64(f.data() + rec + 8, 16); });
  ExpectForgeryFails("chunk checksum", [rec](auto& f) { f[rec + 40] ^= 1; });
  ExpectForgeryFails("footer version", [this](auto& f) { StoreU32(f.data() + fat_ + 40, 2); });
  ExpectForgeryFails("footer reserved", [this](auto& f) { StoreU32(f.data() + fat_ + 44, 1); });
  // Drop the last record: the index claims one chunk fewer than the header implies.
  ExpectForgeryFails("missing chunk", [this](auto& f) {
    const uint64_t count = LoadU64(f.data() + index_at_);
    const uint64_t new_size = 16 + 48 * (count - 1);
    std::vector<uint8_t> g(f.begin(), f.begin() + index_at_ + 8 + 48 * (count - 1));
    g.resize(g.size() + 8);  // index checksum, re-signed
    StoreU64(g.data() + index_at_, count - 1);
    std::vector<uint8_t> footer(f.end() - 64, f.end());
    g.insert(g.end(), footer.begin(), footer.end());
    const uint64_t gfat = g.size() - 64;
    StoreU64(g.data() + gfat, index_at_);
    StoreU64(g.data() + gfat + 8, new_size);
    StoreU64(g.data() + gfat + 24, g.size());
    f = std::move(g);
  });
}

TEST(CorruptionIndexTest, MoreRecordsThanDataPages) {
  // A genuine 80-chunk index with the data region cut out: the count matches the header but
  // cannot fit, and the reader says so before reserving anything for the records.
  WrittenContainer w = WriteContainer(MakeHeader({1, 1, 16}, 40, 1, {RawParams(16)}, {0}));
  ASSERT_TRUE(w.status.ok());
  const std::vector<uint8_t>& f = w.file;
  const uint64_t fat = f.size() - 64, index_at = LoadU64(f.data() + fat);
  ASSERT_EQ(LoadU64(f.data() + index_at), 80u);
  std::vector<uint8_t> g(f.begin(), f.begin() + kContainerAlignment);
  g.insert(g.end(), f.begin() + index_at, f.end());
  const uint64_t gfat = g.size() - 64;
  StoreU64(g.data() + gfat, kContainerAlignment);
  StoreU64(g.data() + gfat + 24, g.size());
  Resign(g);
  Status s = OpenAndReadAll(g);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("index record count at offset 4096: expected at most 0 chunks"),
            std::string::npos)
      << s.message();
}

TEST_F(CorruptionTest, MessagesNameObjectOffsetExpectedAndGot) {
  std::vector<uint8_t> f = file_;
  f[fat_ + 56] ^= 1;  // footer magic
  Status s = OpenAndReadAll(f);
  ASSERT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("t.tqkv: footer magic at offset " + std::to_string(fat_ + 56) +
                             ": expected 8954514b560d0a1a, got 8854514b560d0a1a"),
            std::string::npos)
      << s.message();
  f = file_;
  f[4096 + 100] ^= 1;  // inside the first chunk payload (512 bytes)
  s = OpenAndReadAll(f);
  ASSERT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("at offset 4096: expected 0x"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.message();
  f = file_;
  f[5000] ^= 1;  // the zero padding after it
  s = OpenAndReadAll(f);
  EXPECT_EQ(s.message(), "t.tqkv: padding after chunk 0 at offset 5000: expected 0x0, got 0x1");
}

TEST_F(CorruptionTest, OpenReadsNoMoreThanTheFile) {
  MemoryReadable in(file_);
  g_max_alloc = 0;
  g_track = true;
  auto r = ContainerReader::Open(&in, "t.tqkv");
  g_track = false;
  ASSERT_TRUE(r.ok());
  EXPECT_LE(g_max_alloc.load(), file_.size());
  EXPECT_LE(in.max_read, kContainerAlignment);
}

}  // namespace
}  // namespace tqkv
