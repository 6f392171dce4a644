// RestoreInto of LayoutTensors (checkpoint.h): a session restored into a transposed or paged
// layout holds, element for element, what the canonical restore gives — codes, exact rows and
// mean-removed keys alike — decoded in place where the channels are contiguous, through staging
// where they are not; blocks outside the block table are untouched; bad destinations refused.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "checkpoint/session_util.h"
#include "tqkv/checkpoint.h"
#include "tqkv/kv_layout.h"
#include "tqkv/memory_store.h"
#include "tqkv/thread_pool.h"

namespace tqkv::layout_restore_test {
namespace {

constexpr ModelGeometry kGeo{3, 2, 64};
constexpr uint64_t kTokens = 50;
constexpr uint16_t kUntouched = 0x7E7E;

// A session checkpointed with every decode path at once: `spec`, per-16-token key means, exact
// first and last rows, chunks (24 tokens) that straddle the paged blocks.
class LayoutRestore : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    session_ = testing_util::MakeSession(kGeo, kTokens, DType::kF16, 11);
    CheckpointOptions opts;
    opts.codec = ParseCodecSpec(GetParam()).value();
    opts.key_mean_block = 16;
    opts.exact_head = 3;
    opts.exact_tail = 5;
    opts.token_block = 24;
    ASSERT_TRUE(Checkpoint(session_->cache(), opts, store_, "s").ok());
    auto want = Restore(store_, "s", {});
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    want_ = std::move(want).value();
  }

  // Restores into tensors of `layout` (each `elems` elements, prefilled with kUntouched) and
  // checks every layer against the canonical restore.
  void CheckRestore(const KvLayout& layout, size_t elems, ThreadPool* pool) {
    ASSERT_TRUE(ValidateKvLayout(layout, kGeo, kTokens, elems).ok());
    std::vector<std::vector<uint16_t>> k(kGeo.layers, std::vector<uint16_t>(elems, kUntouched));
    std::vector<std::vector<uint16_t>> v = k;
    LayoutTensors dst{kGeo, DType::kF16, kTokens, layout, elems, {}, {}, {}};
    for (uint32_t l = 0; l < kGeo.layers; ++l) {
      dst.k.push_back(k[l].data());
      dst.v.push_back(v[l].data());
    }
    RestoreOptions opts;
    opts.pool = pool;
    std::vector<uint32_t> ready;
    opts.layer_ready = [&](uint32_t layer) {
      ready.push_back(layer);
      return Status::Ok();
    };
    Status s = RestoreInto(store_, "s", dst, opts);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(ready, (std::vector<uint32_t>{0, 1, 2}));
    std::vector<uint16_t> back(kTokens * kGeo.token_elems());
    const size_t bytes = back.size() * 2;
    for (uint32_t l = 0; l < kGeo.layers; ++l) {
      GatherLayer(k[l].data(), layout, kGeo, kTokens, DType::kF16, back.data());
      EXPECT_EQ(0, std::memcmp(back.data(), want_->cache().k(l), bytes)) << "K layer " << l;
      GatherLayer(v[l].data(), layout, kGeo, kTokens, DType::kF16, back.data());
      EXPECT_EQ(0, std::memcmp(back.data(), want_->cache().v(l), bytes)) << "V layer " << l;
    }
    k_ = std::move(k);
  }

  MemoryStore store_;
  std::unique_ptr<KvCacheBuffer> session_, want_;
  std::vector<std::vector<uint16_t>> k_;  // the last CheckRestore's K tensors
};

TEST_P(LayoutRestore, TransposedDecodesInPlace) {
  KvLayout hnd;  // [kv_heads][tokens][head_dim], as transformers keeps a layer
  hnd.token_stride = kGeo.head_dim;
  hnd.head_stride = kTokens * kGeo.head_dim;
  EXPECT_TRUE(DecodesInPlace(hnd, kGeo, kTokens));
  ThreadPool pool(3);
  CheckRestore(hnd, kTokens * kGeo.token_elems(), nullptr);
  CheckRestore(hnd, kTokens * kGeo.token_elems(), &pool);
}

TEST_P(LayoutRestore, PagedShuffledBlocksDecodeInPlace) {
  KvLayout paged;  // 50 tokens in blocks of 7: 8 blocks, the last holding 1 token
  paged.block_tokens = 7;
  paged.token_stride = kGeo.token_elems();
  paged.head_stride = kGeo.head_dim;
  paged.block_stride = 7 * kGeo.token_elems();
  paged.block_ids = {9, 2, 0, 7, 4, 1, 10, 5};  // of an 11-block pool; 3, 6 and 8 unused
  EXPECT_TRUE(DecodesInPlace(paged, kGeo, kTokens));
  const size_t block_elems = 7 * kGeo.token_elems();
  ThreadPool pool(3);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    CheckRestore(paged, 11 * block_elems, p);
    for (size_t unused : {3, 6, 8}) {
      for (size_t i = 0; i < block_elems; ++i) {
        ASSERT_EQ(k_[0][unused * block_elems + i], kUntouched) << "block " << unused;
      }
    }
    // The last block's rows past the session's end are untouched too.
    EXPECT_EQ(k_[1][5 * block_elems + kGeo.token_elems()], kUntouched);
  }
}

TEST_P(LayoutRestore, StridedChannelsGoThroughStaging) {
  KvLayout l;  // [head_dim][tokens][kv_heads]
  l.head_stride = 1;
  l.token_stride = kGeo.kv_heads;
  l.dim_stride = kTokens * kGeo.kv_heads;
  EXPECT_FALSE(DecodesInPlace(l, kGeo, kTokens));
  CheckRestore(l, kTokens * kGeo.token_elems(), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Codecs, LayoutRestore,
                         ::testing::Values("tq3", "tq2.5", "fp16", "kl:2.5"));

TEST(LayoutRestoreRefuses, BadDestinations) {
  auto session = testing_util::MakeSession(kGeo, kTokens, DType::kF16, 12);
  MemoryStore store;
  CheckpointOptions copts;
  copts.codec = ParseCodecSpec("tq3").value();
  ASSERT_TRUE(Checkpoint(session->cache(), copts, store, "s").ok());
  const size_t elems = kTokens * kGeo.token_elems();
  std::vector<uint16_t> t(elems);
  KvLayout hnd;
  hnd.token_stride = kGeo.head_dim;
  hnd.head_stride = kTokens * kGeo.head_dim;
  LayoutTensors dst{kGeo, DType::kF16, kTokens, hnd, elems, {}, {}, {}};
  for (uint32_t l = 0; l < kGeo.layers; ++l) {
    dst.k.push_back(t.data());
    dst.v.push_back(t.data());
  }
  ASSERT_TRUE(RestoreInto(store, "s", dst, {}).ok());
  LayoutTensors bad = dst;
  bad.tensor_elems = elems - 1;  // the layout reaches past the tensor
  EXPECT_EQ(RestoreInto(store, "s", bad, {}).code(), StatusCode::kInvalidArgument);
  bad = dst;
  bad.tokens = kTokens - 1;
  Status s = RestoreInto(store, "s", bad, {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("holds 50 tokens"), std::string::npos) << s.ToString();
  bad = dst;
  bad.k.pop_back();
  EXPECT_EQ(RestoreInto(store, "s", bad, {}).code(), StatusCode::kInvalidArgument);
  bad = dst;
  bad.geometry.kv_heads = 1;
  bad.layout.head_stride = 0;
  EXPECT_EQ(RestoreInto(store, "s", bad, {}).code(), StatusCode::kInvalidArgument);
  bad = dst;
  bad.k[1] = nullptr;
  EXPECT_EQ(RestoreInto(store, "s", bad, {}).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tqkv::layout_restore_test
