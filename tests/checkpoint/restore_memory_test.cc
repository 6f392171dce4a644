// The restore's slot memory pool: regions come back for the next restore, aligned for huge
// pages, and the pool keeps no more than its cap.
#include "checkpoint/restore_memory.h"

#include "tqkv/checkpoint.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace tqkv {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Empties the pool so each test starts from nothing (other tests in the binary restore too).
void Drain() {
  while (RestoreMemoryKeptBytes() > 0) {
    auto r = TakeRestoreMemory(1);
    ASSERT_TRUE(r.ok());
  }
}

TEST(RestoreMemoryTest, ARegionComesBackForTheNextRestore) {
  Drain();
  auto a = TakeRestoreMemory(6 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % (2 * kMiB), 0u) << "2 MiB boundaries";
  EXPECT_GE(a->size(), 6 * kMiB);
  const uint8_t* p = a->data();
  ReturnRestoreMemory(std::move(a).value());
  EXPECT_EQ(RestoreMemoryKeptBytes(), 6 * kMiB);
  auto b = TakeRestoreMemory(4 * kMiB);  // smaller: the kept region serves it
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), p);
  EXPECT_EQ(RestoreMemoryKeptBytes(), 0u);
  auto c = TakeRestoreMemory(8 * kMiB);  // larger than anything kept: a new one
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->data(), p);
  EXPECT_GE(c->size(), 8 * kMiB);
  ReturnRestoreMemory(std::move(b).value());
  ReturnRestoreMemory(std::move(c).value());
  auto d = TakeRestoreMemory(5 * kMiB);  // the smallest that fits: the 6 MiB one, not the 8 MiB
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->data(), p);
  Drain();
}

TEST(RestoreMemoryTest, KeepsNoMoreThanTheCap) {
  Drain();
  std::vector<AlignedBuffer> held;
  const size_t each = 64 * kMiB;
  const size_t n = kRestoreMemoryKept / each + 2;
  for (size_t i = 0; i < n; ++i) {
    auto r = TakeRestoreMemory(each);  // virtual memory only: nothing is touched
    ASSERT_TRUE(r.ok());
    held.push_back(std::move(r).value());
  }
  for (auto& r : held) ReturnRestoreMemory(std::move(r));
  EXPECT_LE(RestoreMemoryKeptBytes(), kRestoreMemoryKept);
  EXPECT_EQ(RestoreMemoryKeptBytes(), kRestoreMemoryKept / each * each);
  Drain();
  EXPECT_EQ(RestoreMemoryKeptBytes(), 0u);
}

// A server warms the memory of its concurrent restores once: each of them then finds a region of
// its own, already touched, in the pool.
TEST(RestoreMemoryTest, WarmingKeepsARegionPerConcurrentRestore) {
  Drain();
  RestoreOptions o;
  o.inflight_bytes = 3 * kMiB;  // rounded up to 2 MiB boundaries: 4 MiB each
  auto kept = WarmRestoreMemory(3, o);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(*kept, 12 * kMiB);
  EXPECT_EQ(RestoreMemoryKeptBytes(), 12 * kMiB);
  std::vector<AlignedBuffer> taken;
  for (int i = 0; i < 3; ++i) {
    auto r = TakeRestoreMemory(3 * kMiB);
    ASSERT_TRUE(r.ok());
    for (const AlignedBuffer& t : taken) EXPECT_NE(t.data(), r->data());
    taken.push_back(std::move(r).value());
  }
  EXPECT_EQ(RestoreMemoryKeptBytes(), 0u) << "all three came from the warmed pool";
  for (AlignedBuffer& t : taken) ReturnRestoreMemory(std::move(t));
  // More than the pool keeps: refused, nothing allocated.
  o.inflight_bytes = 1ull << 30;
  EXPECT_EQ(WarmRestoreMemory(3, o).status().code(), StatusCode::kInvalidArgument);
  Drain();
}

}  // namespace
}  // namespace tqkv
