// SlotReader: reads on one or more lanes, verification on another thread, chunks handed out in
// order, and an error (of a read or of a check) only after every chunk before it.
#include "checkpoint/slot_reader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <mutex>
#include <vector>

namespace tqkv {
namespace {

// Each slot holds the index of the chunk last read into it.
struct Fake {
  std::vector<size_t> slot_chunk;
  std::mutex mu;
  size_t fail_read_at = SIZE_MAX, fail_verify_at = SIZE_MAX;
  std::atomic<int> verify_calls{0};
  // Lanes: reads sleep a pseudo-random 0-2 ms, so later batches often finish first.
  bool jitter = false;
  std::atomic<int> reading{0}, max_reading{0};
  explicit Fake(size_t slots) : slot_chunk(slots, SIZE_MAX) {}
  SlotReader::ReadFn Read() {
    return [this](const std::vector<size_t>& slots, size_t first) -> Status {
      const int now = ++reading;
      for (int m = max_reading.load(); now > m && !max_reading.compare_exchange_weak(m, now);) {
      }
      if (jitter) {
        std::this_thread::sleep_for(std::chrono::microseconds((first * 7919) % 2000));
      }
      struct Done {
        std::atomic<int>& r;
        ~Done() { --r; }
      } done{reading};
      for (size_t i = 0; i < slots.size(); ++i) {
        if (first + i == fail_read_at) return Status::IoError("read of chunk " + std::to_string(first + i));
        std::lock_guard<std::mutex> lock(mu);
        slot_chunk[slots[i]] = first + i;
      }
      return Status::Ok();
    };
  }
  SlotReader::ReadFn Verify() {
    return [this](const std::vector<size_t>& slots, size_t first) -> Status {
      ++verify_calls;
      for (size_t i = 0; i < slots.size(); ++i) {
        std::lock_guard<std::mutex> lock(mu);
        if (slot_chunk[slots[i]] != first + i) return Status::Internal("slot overwritten");
        if (first + i == fail_verify_at) return Status::Corruption("checksum of chunk " + std::to_string(first + i));
      }
      return Status::Ok();
    };
  }
};

// Consumes everything: the chunk indices seen in order, then the error (or OK at the end).
Status Drain(SlotReader& r, Fake& f, size_t chunks, std::vector<size_t>* seen) {
  for (size_t i = 0; i < chunks; ++i) {
    Result<size_t> s = r.Next();
    if (!s.ok()) return s.status();
    {
      std::lock_guard<std::mutex> lock(f.mu);
      seen->push_back(f.slot_chunk[*s]);
    }
    r.Release(*s);
  }
  return Status::Ok();
}

TEST(SlotReader, VerifiedChunksInOrder) {
  for (size_t slots : {1u, 2u, 5u}) {
    Fake f(slots);
    SlotReader r(slots, 40, f.Read(), f.Verify());
    std::vector<size_t> seen;
    ASSERT_TRUE(Drain(r, f, 40, &seen).ok());
    ASSERT_EQ(seen.size(), 40u);
    for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i);
    EXPECT_GT(f.verify_calls.load(), 0);
  }
}

TEST(SlotReader, WithoutVerifierTheReadIsTheCheck) {
  Fake f(3);
  SlotReader r(3, 10, f.Read());
  std::vector<size_t> seen;
  ASSERT_TRUE(Drain(r, f, 10, &seen).ok());
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_EQ(f.verify_calls.load(), 0);
}

TEST(SlotReader, ACheckFailureComesAfterTheChunksBeforeIt) {
  Fake f(4);
  f.fail_verify_at = 13;
  SlotReader r(4, 30, f.Read(), f.Verify());
  std::vector<size_t> seen;
  Status s = Drain(r, f, 30, &seen);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  // Chunks of the failed batch are never handed out; none after it either.
  ASSERT_LE(seen.size(), 13u);
  EXPECT_GE(seen.size(), 10u);  // at most the failed batch's 3 chunks before 13 are withheld
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i);
}

TEST(SlotReader, AReadFailureComesAfterEveryVerifiedChunkBeforeIt) {
  Fake f(2);
  f.fail_read_at = 7;
  SlotReader r(2, 20, f.Read(), f.Verify());
  std::vector<size_t> seen;
  Status s = Drain(r, f, 20, &seen);
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  ASSERT_LE(seen.size(), 7u);
  EXPECT_GE(seen.size(), 6u);
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i);
}

TEST(SlotReader, StopsCleanlyWhenTheConsumerLeavesEarly) {
  Fake f(3);
  {
    SlotReader r(3, 1000, f.Read(), f.Verify());
    ASSERT_TRUE(r.Next().ok());
  }  // the destructor joins both threads with slots still held
  SUCCEED();
}

TEST(SlotReader, LanesReadAtOnceAndHandOutInOrder) {
  for (bool verify : {true, false}) {
    for (size_t lanes : {2u, 3u, 8u}) {
      Fake f(6);
      f.jitter = true;
      SlotReader r(6, 60, f.Read(), verify ? f.Verify() : SlotReader::ReadFn{}, {}, lanes);
      std::vector<size_t> seen;
      ASSERT_TRUE(Drain(r, f, 60, &seen).ok()) << lanes;
      ASSERT_EQ(seen.size(), 60u);
      for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i) << lanes;
      EXPECT_GE(f.max_reading.load(), 2) << "lanes=" << lanes << ": batches never overlapped";
    }
  }
}

TEST(SlotReader, LanesPassAReadErrorOnAfterEveryChunkBeforeIt) {
  for (bool verify : {true, false}) {
    Fake f(6);
    f.jitter = true;
    f.fail_read_at = 23;
    SlotReader r(6, 60, f.Read(), verify ? f.Verify() : SlotReader::ReadFn{}, {}, 3);
    std::vector<size_t> seen;
    Status s = Drain(r, f, 60, &seen);
    EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
    ASSERT_LE(seen.size(), 23u);
    EXPECT_GE(seen.size(), 22u);  // batches are at most 6 / 3 = 2 chunks
    for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i);
  }
}

TEST(SlotReader, LanesPassACheckFailureOnInOrder) {
  Fake f(6);
  f.jitter = true;
  f.fail_verify_at = 31;
  SlotReader r(6, 60, f.Read(), f.Verify(), {}, 2);
  std::vector<size_t> seen;
  Status s = Drain(r, f, 60, &seen);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  ASSERT_LE(seen.size(), 31u);
  EXPECT_GE(seen.size(), 29u);  // batches of at most 3
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i);
}

TEST(SlotReader, LanesStopCleanlyWhenTheConsumerLeavesEarly) {
  Fake f(4);
  f.jitter = true;
  {
    SlotReader r(4, 1000, f.Read(), f.Verify(), {}, 4);
    ASSERT_TRUE(r.Next().ok());
  }
  SUCCEED();
}

TEST(SlotReader, NoChunks) {
  Fake f(2);
  SlotReader r(2, 0, f.Read(), f.Verify());
  EXPECT_EQ(f.verify_calls.load(), 0);
}

}  // namespace
}  // namespace tqkv
