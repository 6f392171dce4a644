// Allocation and thread limits of src/common: failures are Status values, never abort() or an
// exception out of a constructor.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <limits>

#include "tqkv/aligned_buffer.h"
#include "tqkv/checked.h"
#include "tqkv/thread_pool.h"

namespace tqkv {
namespace {

TEST(AlignedBuffer, TryReserveRefusesWhatCannotBeHad) {
  AlignedBuffer b;
  // Rounding SIZE_MAX - 100 up to 4096 used to wrap to a tiny allocation.
  for (size_t size : {std::numeric_limits<size_t>::max(), std::numeric_limits<size_t>::max() - 100,
                      size_t{1} << 62}) {
    Status s = b.TryReserve(size);
    EXPECT_TRUE(s.IsResourceExhausted()) << size << ": " << s.ToString();
    EXPECT_EQ(b.size(), 0u);
  }
  ASSERT_TRUE(b.TryReserve(10000).ok());
  EXPECT_EQ(b.size(), 10000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 4096, 0u);
}

TEST(CheckedMath, SizeProduct) {
  EXPECT_EQ(*SizeProduct("x", {3, 64, 2}), 384u);
  auto wrap = SizeProduct("layer", {48038396025285291ull, 192, 2});
  ASSERT_FALSE(wrap.ok());
  EXPECT_TRUE(wrap.status().IsResourceExhausted());
  EXPECT_EQ(wrap.status().message(),
            "layer: 48038396025285291 x 192 x 2 bytes do not fit in memory");
  EXPECT_FALSE(SizeProduct("x", {uint64_t{1} << 63}).ok());  // above PTRDIFF_MAX
}

TEST(ThreadPool, HugeThreadCountsAreCapped) {
  ThreadPool pool(100000);
  EXPECT_LE(pool.size(), ThreadPool::kMaxThreads);
  EXPECT_GE(pool.size(), 1u);
  std::atomic<size_t> sum{0};
  pool.ParallelFor(1000, 1, [&](size_t b, size_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 1000u);
}

}  // namespace
}  // namespace tqkv
