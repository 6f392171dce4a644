// A synthetic session in memory for the checkpoint tests.
#ifndef TQKV_TESTS_CHECKPOINT_SESSION_UTIL_H_
#define TQKV_TESTS_CHECKPOINT_SESSION_UTIL_H_

#include <gtest/gtest.h>

#include <memory>

#include "tqkv/kv_cache.h"
#include "tqkv/synthetic.h"

namespace tqkv::testing_util {

inline std::unique_ptr<KvCacheBuffer> MakeSession(const ModelGeometry& g, uint64_t tokens,
                                                  DType dtype, uint64_t seed) {
  auto buf = KvCacheBuffer::Allocate("test-model", g, dtype, tokens);
  EXPECT_TRUE(buf.ok());
  SyntheticKv gen(SyntheticKind::kKv, g, seed);
  EXPECT_TRUE(gen.FillCache(buf.value()->cache()).ok());
  return std::move(buf).value();
}

}  // namespace tqkv::testing_util

#endif  // TQKV_TESTS_CHECKPOINT_SESSION_UTIL_H_
