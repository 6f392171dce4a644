// The restore's slot memory pool: regions come back for the next restore, aligned for huge
// pages, and the pool keeps no more than its cap.
#include "checkpoint/slot_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace tqkv {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Empties the pool so each test starts from nothing (other tests in the binary restore too).
void Drain() {
  while (SlotMemoryKeptBytes() > 0) {
    auto r = TakeSlotMemory(1);
    ASSERT_TRUE(r.ok());
  }
}

TEST(SlotMemoryTest, ARegionComesBackForTheNextRestore) {
  Drain();
  auto a = TakeSlotMemory(6 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % (2 * kMiB), 0u) << "2 MiB boundaries";
  EXPECT_GE(a->size(), 6 * kMiB);
  const uint8_t* p = a->data();
  ReturnSlotMemory(std::move(a).value());
  EXPECT_EQ(SlotMemoryKeptBytes(), 6 * kMiB);
  auto b = TakeSlotMemory(4 * kMiB);  // smaller: the kept region serves it
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), p);
  EXPECT_EQ(SlotMemoryKeptBytes(), 0u);
  auto c = TakeSlotMemory(8 * kMiB);  // larger than anything kept: a new one
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->data(), p);
  EXPECT_GE(c->size(), 8 * kMiB);
  ReturnSlotMemory(std::move(b).value());
  ReturnSlotMemory(std::move(c).value());
  auto d = TakeSlotMemory(5 * kMiB);  // the smallest that fits: the 6 MiB one, not the 8 MiB
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->data(), p);
  Drain();
}

TEST(SlotMemoryTest, KeepsNoMoreThanTheCap) {
  Drain();
  std::vector<AlignedBuffer> held;
  const size_t each = 64 * kMiB;
  const size_t n = kSlotMemoryKept / each + 2;
  for (size_t i = 0; i < n; ++i) {
    auto r = TakeSlotMemory(each);  // virtual memory only: nothing is touched
    ASSERT_TRUE(r.ok());
    held.push_back(std::move(r).value());
  }
  for (auto& r : held) ReturnSlotMemory(std::move(r));
  EXPECT_LE(SlotMemoryKeptBytes(), kSlotMemoryKept);
  EXPECT_EQ(SlotMemoryKeptBytes(), kSlotMemoryKept / each * each);
  Drain();
  EXPECT_EQ(SlotMemoryKeptBytes(), 0u);
}

}  // namespace
}  // namespace tqkv
