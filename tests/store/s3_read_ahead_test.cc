// The s3:// reader's block read-ahead (src/store/s3/s3_read_ahead.h) against a fake fetch: the
// bytes, the GETs it makes (aligned blocks, each once for a sequential reader, at most `lanes` at
// once), bytes handed out before a block's GET ends, failed fetches, and stopping mid-fetch.
#include "store/s3/s3_read_ahead.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace tqkv::s3 {
namespace {

std::vector<uint8_t> Bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Serves `object` in pieces of `piece` bytes, reporting progress after each; records the GETs.
struct FakeObject {
  std::vector<uint8_t> object;
  size_t piece = 4096;
  std::mutex mu;
  std::vector<std::pair<uint64_t, uint64_t>> gets;  // offset, length
  std::atomic<int> inflight{0}, max_inflight{0};
  std::set<uint64_t> fail_once;  // offsets whose first GET fails after half its bytes

  ReadAhead::FetchFn Fn() {
    return [this](uint64_t off, std::span<uint8_t> dst,
                  const std::function<bool(uint64_t)>& progress) -> Status {
      bool fail = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        gets.emplace_back(off, dst.size());
        fail = fail_once.erase(off) > 0;
      }
      const int now = ++inflight;
      int seen = max_inflight.load();
      while (now > seen && !max_inflight.compare_exchange_weak(seen, now)) {
      }
      Status st;
      for (size_t done = 0; done < dst.size();) {
        if (fail && done >= dst.size() / 2) {
          st = Status::IoError("fake: connection reset");
          break;
        }
        const size_t n = std::min(piece, dst.size() - done);
        std::memcpy(dst.data() + done, object.data() + off + done, n);
        done += n;
        if (!progress(done)) {
          st = Status::IoError("fake: aborted");
          break;
        }
        std::this_thread::yield();
      }
      --inflight;
      return st;
    };
  }
};

TEST(S3ReadAheadTest, SequentialReaderGetsEachAlignedBlockOnce) {
  FakeObject f;
  const uint64_t block = 64 << 10;
  f.object = Bytes(block * 37 + 1234, 1);  // a short last block
  const uint64_t blocks = (f.object.size() + block - 1) / block;
  {
    ReadAhead ra(f.object.size(), block, 4, f.Fn(), /*min_held=*/0);
    std::vector<uint8_t> got(f.object.size());
    std::mt19937 rng(7);
    for (uint64_t at = 0; at < got.size();) {
      const uint64_t n = std::min<uint64_t>(1 + rng() % (3 * block), got.size() - at);
      ASSERT_TRUE(ra.Read(at, {got.data() + at, n}).ok());
      at += n;
    }
    EXPECT_EQ(got, f.object);
    EXPECT_EQ(ra.BytesFetched(), f.object.size());
  }
  ASSERT_EQ(f.gets.size(), blocks) << "one GET per block, none again";
  std::set<uint64_t> offsets;
  for (const auto& [off, len] : f.gets) {
    EXPECT_EQ(off % block, 0u);
    EXPECT_EQ(len, std::min<uint64_t>(block, f.object.size() - off));
    offsets.insert(off);
  }
  EXPECT_EQ(offsets.size(), blocks);
  EXPECT_LE(f.max_inflight.load(), 4);
}

TEST(S3ReadAheadTest, ConcurrentReadersInOrderAndRandomRereadsGetTheRightBytes) {
  FakeObject f;
  const uint64_t block = 32 << 10;
  f.object = Bytes(block * 50 + 77, 2);
  // 6 blocks held at most: readers far apart make it give up blocks others still want.
  ReadAhead ra(f.object.size(), block, 3, f.Fn(), /*min_held=*/0);
  std::vector<uint8_t> got(f.object.size());
  // Like the restore's read lanes: ranges handed out in order, read by 4 threads at once.
  std::atomic<uint64_t> next{0};
  std::atomic<bool> ok{true};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      for (;;) {
        const uint64_t at = next.fetch_add(20000);
        if (at >= got.size()) return;
        const uint64_t n = std::min<uint64_t>(20000, got.size() - at);
        if (!ra.Read(at, {got.data() + at, n}).ok()) ok = false;
      }
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_TRUE(ok);
  EXPECT_EQ(got, f.object);
  EXPECT_LE(f.max_inflight.load(), 3);
  // Backwards and overlapping reads of blocks long consumed fetch them again.
  std::mt19937 rng(3);
  for (int i = 0; i < 40; ++i) {
    const uint64_t at = rng() % f.object.size();
    const uint64_t n = std::min<uint64_t>(1 + rng() % (2 * block), f.object.size() - at);
    std::vector<uint8_t> part(n);
    ASSERT_TRUE(ra.Read(at, part).ok());
    ASSERT_EQ(0, std::memcmp(part.data(), f.object.data() + at, n)) << "at " << at;
  }
}

TEST(S3ReadAheadTest, BytesArriveBeforeTheBlocksGetEnds) {
  const uint64_t block = 1 << 20;
  const std::vector<uint8_t> object = Bytes(block, 4);
  std::atomic<bool> first_half_read{false}, waited_out{false};
  ReadAhead ra(object.size(), block, 1,
               [&](uint64_t off, std::span<uint8_t> dst,
                   const std::function<bool(uint64_t)>& progress) -> Status {
                 std::memcpy(dst.data(), object.data(), dst.size() / 2);
                 progress(dst.size() / 2);
                 // The second half only once the reader has had the first.
                 const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
                 while (!first_half_read && std::chrono::steady_clock::now() < until) {
                   std::this_thread::sleep_for(std::chrono::milliseconds(1));
                 }
                 if (!first_half_read) waited_out = true;
                 std::memcpy(dst.data() + dst.size() / 2, object.data() + dst.size() / 2,
                             dst.size() - dst.size() / 2);
                 progress(dst.size());
                 return Status::Ok();
               });
  std::vector<uint8_t> half(block / 2);
  ASSERT_TRUE(ra.Read(0, half).ok());
  first_half_read = true;
  EXPECT_FALSE(waited_out) << "the reader waited for the whole block";
  EXPECT_EQ(0, std::memcmp(half.data(), object.data(), half.size()));
  std::vector<uint8_t> rest(block / 2);
  ASSERT_TRUE(ra.Read(block / 2, rest).ok());
  EXPECT_EQ(0, std::memcmp(rest.data(), object.data() + block / 2, rest.size()));
}

TEST(S3ReadAheadTest, FailedFetchIsTheReadsErrorAndTheNextReadFetchesAgain) {
  FakeObject f;
  const uint64_t block = 16 << 10;
  f.object = Bytes(block * 8, 5);
  f.fail_once = {2 * block};
  ReadAhead ra(f.object.size(), block, 2, f.Fn());
  std::vector<uint8_t> got(f.object.size());
  const Status s = ra.Read(0, got);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("connection reset"), std::string::npos) << s.ToString();
  ASSERT_TRUE(ra.Read(0, got).ok());
  EXPECT_EQ(got, f.object);
  int block2 = 0;
  for (const auto& g : f.gets) block2 += g.first == 2 * block;
  EXPECT_EQ(block2, 2);
}

TEST(S3ReadAheadTest, DestroyedWhileFetchingStopsTheFetches) {
  const uint64_t block = 1 << 20;
  std::atomic<int> aborted{0};
  const auto t0 = std::chrono::steady_clock::now();
  {
    ReadAhead ra(64 * block, block, 4,
                 [&](uint64_t, std::span<uint8_t> dst,
                     const std::function<bool(uint64_t)>& progress) -> Status {
                   // A slow server: 1 KiB per millisecond (a block would take a second).
                   for (uint64_t done = 1024; done <= dst.size(); done += 1024) {
                     if (!progress(done)) {
                       ++aborted;
                       return Status::IoError("aborted");
                     }
                     std::this_thread::sleep_for(std::chrono::milliseconds(1));
                   }
                   return Status::Ok();
                 });
    std::vector<uint8_t> a(4096);
    ASSERT_TRUE(ra.Read(0, a).ok());  // starts block 0 and the read-ahead
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(900));
  EXPECT_GE(aborted.load(), 1);
}

}  // namespace
}  // namespace tqkv::s3
