// Sizes computed from user input (issue 13, defects 1 and 7): a session too large to size or to
// allocate is refused with ResourceExhausted (InvalidArgument for a geometry over the limits)
// before the store sees the key, so nothing is left in it.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "store/store_test_util.h"
#include "tqkv/checkpoint.h"
#include "tqkv/kv_cache.h"
#include "tqkv/store.h"
#include "tqkv/synthetic_source.h"

namespace tqkv {
namespace {

const ModelGeometry kSmol{30, 3, 64};

Status CheckpointInto(const std::string& dir, ModelGeometry g, uint64_t tokens) {
  auto store = OpenStore(dir);
  if (!store.ok()) return store.status();
  auto source = MakeSyntheticSource("hostile", g, DType::kF16, tokens, 1);
  CheckpointOptions opts;
  opts.codec = *ParseCodecSpec("tq3");
  return Checkpoint(*source, opts, **store, "s").status();
}

TEST(HostileSizes, CheckpointRefusesSessionsThatDoNotFit) {
  testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  const auto t0 = std::chrono::steady_clock::now();
  // tokens x 192 x 2 wraps 64 bits (it used to wrap into a small buffer and overflow it).
  for (uint64_t tokens : {48038396025285291ull, 18446744073709551615ull}) {
    Status s = CheckpointInto(dir.path(), kSmol, tokens);
    EXPECT_TRUE(s.IsResourceExhausted()) << s.ToString();
    EXPECT_NE(s.message().find("do not fit in memory"), std::string::npos) << s.message();
  }
  // Fits 64 bits, not memory (384 TB per layer): the allocation fails cleanly.
  Status big = CheckpointInto(dir.path(), kSmol, 1'000'000'000'000ull);
  EXPECT_TRUE(big.IsResourceExhausted()) << big.ToString();
  Status heads = CheckpointInto(dir.path(), {30, 1'000'000'000, 64}, 100);
  EXPECT_EQ(heads.code(), StatusCode::kInvalidArgument) << heads.ToString();
  Status layers = CheckpointInto(dir.path(), {1'000'000'000, 3, 64}, 100);
  EXPECT_EQ(layers.code(), StatusCode::kInvalidArgument) << layers.ToString();
  EXPECT_TRUE(dir.Files().empty()) << dir.Files().front();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  // And a sane session still goes through.
  EXPECT_TRUE(CheckpointInto(dir.path(), kSmol, 40).ok());
}

TEST(HostileSizes, KvCacheBufferRefusesWhatDoesNotFit) {
  auto wrap = KvCacheBuffer::Allocate("x", kSmol, DType::kF32, uint64_t{1} << 62);
  EXPECT_TRUE(wrap.status().IsResourceExhausted()) << wrap.status().ToString();
  auto huge = KvCacheBuffer::Allocate("x", kSmol, DType::kF32, uint64_t{1} << 40);
  EXPECT_TRUE(huge.status().IsResourceExhausted()) << huge.status().ToString();
  auto empty = KvCacheBuffer::Allocate("x", {0, 3, 64}, DType::kF32, 10);
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tqkv
