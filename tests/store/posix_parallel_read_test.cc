// io=direct with several reads in flight (store/posix/parallel_reads.h): the same bytes as
// buffered reads, errors propagate, nothing new starts after an error, BytesRead stays exact.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "store/posix/parallel_reads.h"
#include "store/posix/posix_store.h"
#include "store/store_test_util.h"
#include "tqkv/aligned_buffer.h"
#include "tqkv/store.h"
#include "tqkv/thread_pool.h"

namespace tqkv {
namespace {

using posix_internal::ReadPieces;
using posix_internal::SplitReads;
using testing_util::Pattern;
using testing_util::ScratchDir;
using testing_util::WriteObject;

// io=direct in 64 KiB pieces with `qd` threads (engine=threads: not io_uring).
PosixStoreOptions Direct(const std::string& dir, uint32_t qd) {
  PosixStoreOptions o;
  o.dir = dir;
  o.io = IoMode::kDirect;
  o.direct_threads = true;
  o.queue_depth = qd;
  o.chunk_bytes = 64u << 10;
  return o;
}

std::unique_ptr<Store> OpenPosix(PosixStoreOptions o) {
  auto s = OpenPosixStore(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

TEST(SplitReadsTest, PiecesCoverEachRequestInOrder) {
  std::vector<uint8_t> a(10000), b(3);
  const ReadRequest reqs[] = {{4000, {a.data(), a.size()}}, {0, {b.data(), b.size()}}};
  const auto p = SplitReads(reqs, 4096, 4096);
  ASSERT_EQ(p.size(), 5u);
  // 4000 is unaligned: the first piece stops at 4096, then whole 4096-byte pieces.
  EXPECT_EQ(p[0].offset, 4000u);
  EXPECT_EQ(p[0].dst.size(), 96u);
  EXPECT_EQ(p[1].offset, 4096u);
  EXPECT_EQ(p[1].dst.size(), 4096u);
  EXPECT_EQ(p[2].dst.size(), 4096u);
  EXPECT_EQ(p[3].offset, 12288u);
  EXPECT_EQ(p[3].dst.size(), 10000u - 96 - 8192);
  EXPECT_EQ(p[3].dst.data() + p[3].dst.size(), a.data() + a.size());
  EXPECT_EQ(p[4].offset, 0u);
  EXPECT_EQ(p[4].dst.data(), b.data());
  EXPECT_TRUE(SplitReads({}, 4096, 4096).empty());
}

TEST(ReadPiecesTest, KeepsSeveralInFlight) {
  ThreadPool pool(4);
  std::vector<uint8_t> buf(64);
  std::vector<ReadRequest> pieces;
  for (size_t i = 0; i < 64; ++i) pieces.push_back({i, {buf.data() + i, 1}});
  std::atomic<int> now{0}, most{0}, calls{0};
  Status s = ReadPieces(pool, pieces, [&](const ReadRequest& p) {
    const int n = ++now;
    for (int m = most.load(); n > m && !most.compare_exchange_weak(m, n);) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    p.dst[0] = static_cast<uint8_t>(p.offset);
    --now;
    ++calls;
    return Status::Ok();
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(calls.load(), 64);
  EXPECT_GE(most.load(), 2) << "pieces ran one at a time";
  EXPECT_LE(most.load(), 4);
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(buf[i], i);
}

TEST(ReadPiecesTest, StopsStartingPiecesAfterTheFirstError) {
  ThreadPool pool(4);
  std::vector<uint8_t> buf(1000);
  std::vector<ReadRequest> pieces;
  for (size_t i = 0; i < buf.size(); ++i) pieces.push_back({i, {buf.data() + i, 1}});
  std::atomic<int> running{0}, calls{0};
  std::atomic<bool> returned{false}, late{false};
  Status s = ReadPieces(pool, pieces, [&](const ReadRequest& p) -> Status {
    ++running;
    ++calls;
    if (returned) late = true;
    Status st = Status::Ok();
    if (p.offset == 5) {
      st = Status::IoError("piece 5 failed");
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    --running;
    return st;
  });
  returned = true;
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("piece 5"), std::string::npos) << s.ToString();
  EXPECT_EQ(running.load(), 0) << "returned while a piece was still running";
  EXPECT_LT(calls.load(), 500) << "pieces kept starting after the error";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(late.load()) << "a piece started after ReadPieces returned";
}

struct ParallelCase {
  const char* name;
  bool short_io, no_direct;
};

class PosixParallelReadTest : public ::testing::TestWithParam<ParallelCase> {};

// Direct reads with qd=4 and 64 KiB pieces return the bytes buffered reads return, for aligned,
// unaligned, tiny and EOF-touching requests, one by one and in batches.
TEST_P(PosixParallelReadTest, SameBytesAsBufferedReads) {
  ScratchDir dir;
  PosixStoreOptions o;
  o.dir = dir.path();
  auto plain = OpenPosix(o);
  ASSERT_NE(plain, nullptr);
  const auto data = Pattern(11, (3u << 20) + 4097);
  ASSERT_TRUE(WriteObject(plain.get(), "p", data).ok());
  o = Direct(dir.path(), 4);
  o.simulate_short_io = GetParam().short_io;
  o.simulate_no_direct = GetParam().no_direct;
  auto direct = OpenPosix(o);
  ASSERT_NE(direct, nullptr);
  auto rp = plain->Open("p");
  auto rd = direct->Open("p");
  ASSERT_TRUE(rp.ok() && rd.ok());
  const uint64_t n = data.size();
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, n}, {1, n - 1}, {4096, 1u << 20}, {4095, 300001}, {n - 5000, 5000}, {n - 1, 1},
      {0, 0}, {12345, 7}, {65536 * 3, 65536 * 5 + 3}};
  AlignedBuffer a(n + 8192), b(n + 8192);
  for (auto [off, len] : ranges) {
    for (size_t shift : {0, 1, 64}) {
      SCOPED_TRACE(std::to_string(off) + "+" + std::to_string(len) + " shift " +
                   std::to_string(shift));
      ASSERT_TRUE((*rp)->ReadAt(off, {a.data() + shift, len}).ok());
      Status s = (*rd)->ReadAt(off, {b.data() + shift, len});
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(0, std::memcmp(a.data() + shift, b.data() + shift, len));
    }
  }
  // One batch of 300 odd requests spread over the file, each into its own (odd) buffer.
  std::vector<ReadRequest> ra, rb;
  std::vector<std::vector<uint8_t>> bufs_a(300), bufs_b(300);
  for (uint64_t i = 0; i < 300; ++i) {
    const uint64_t off = (i * 104729) % (n - 40000);
    const uint64_t len = 1 + (i * 7919) % 40000;
    bufs_a[i].resize(len + 3);
    bufs_b[i].resize(len + 3);
    ra.push_back({off, {bufs_a[i].data() + i % 3, len}});
    rb.push_back({off, {bufs_b[i].data() + i % 3, len}});
  }
  ASSERT_TRUE((*rp)->ReadBatch(ra).ok());
  Status s = (*rd)->ReadBatch(rb);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < rb.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(rb[i].dst.data(), ra[i].dst.data(), rb[i].dst.size())) << i;
    ASSERT_EQ(0, std::memcmp(rb[i].dst.data(), data.data() + rb[i].offset, rb[i].dst.size())) << i;
  }
  EXPECT_EQ(direct->Caps().io_mode, GetParam().no_direct ? IoMode::kBuffered : IoMode::kDirect);
}

INSTANTIATE_TEST_SUITE_P(Cases, PosixParallelReadTest,
                         ::testing::Values(ParallelCase{"plain", false, false},
                                           ParallelCase{"short_io", true, false},
                                           ParallelCase{"no_direct", false, true}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(PosixParallelReadTest, ReadErrorsPropagateAndStopTheBatch) {
  ScratchDir dir;
  PosixStoreOptions o = Direct(dir.path(), 4);
  o.simulate_read_error_at = (1u << 20) + 10;  // inside piece 16 of 64
  auto store = OpenPosix(o);
  ASSERT_NE(store, nullptr);
  const auto data = Pattern(3, 4u << 20);
  ASSERT_TRUE(WriteObject(store.get(), "e", data).ok());
  auto r = store->Open("e");
  ASSERT_TRUE(r.ok());
  AlignedBuffer buf(data.size());
  Status s = (*r)->ReadAt(0, buf.span());
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("e ("), std::string::npos) << "names the object: " << s.ToString();
  EXPECT_NE(s.message().find("offset 1048576"), std::string::npos) << s.ToString();
  const uint64_t after = (*r)->BytesRead();
  EXPECT_LT(after, data.size()) << "the whole object was read despite the error";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ((*r)->BytesRead(), after) << "reads went on after ReadAt returned";
  // A batch that avoids the bad block still works.
  std::vector<ReadRequest> ok = {{0, {buf.data(), 1u << 20}}, {2u << 20, {buf.data() + (2u << 20), 1u << 20}}};
  ASSERT_TRUE((*r)->ReadBatch(ok).ok());
  EXPECT_EQ(0, std::memcmp(buf.data(), data.data(), 1u << 20));
  EXPECT_EQ(0, std::memcmp(buf.data() + (2u << 20), data.data() + (2u << 20), 1u << 20));
}

TEST(PosixParallelReadTest, BytesReadCountsEveryPieceOnce) {
  ScratchDir dir;
  auto store = OpenPosix(Direct(dir.path(), 8));
  ASSERT_NE(store, nullptr);
  if (store->Caps().io_mode != IoMode::kDirect) GTEST_SKIP() << "O_DIRECT unavailable here";
  const auto data = Pattern(5, 3u << 20);
  ASSERT_TRUE(WriteObject(store.get(), "b", data).ok());
  auto r = store->Open("b");
  ASSERT_TRUE(r.ok());
  AlignedBuffer buf(data.size());
  ASSERT_TRUE((*r)->ReadAt(0, buf.span()).ok());
  EXPECT_EQ((*r)->BytesRead(), data.size());
  // Two unaligned requests of 100 bytes in different blocks: one block each.
  std::vector<uint8_t> x(100), y(100);
  const ReadRequest two[] = {{5000, {x.data(), 100}}, {900000, {y.data(), 100}}};
  ASSERT_TRUE((*r)->ReadBatch(two).ok());
  EXPECT_EQ((*r)->BytesRead(), data.size() + 2 * 4096);
  EXPECT_EQ(0, std::memcmp(y.data(), data.data() + 900000, 100));
  EXPECT_NE((*store).Uri().find("qd=8"), std::string::npos) << store->Uri();
}

}  // namespace
}  // namespace tqkv
