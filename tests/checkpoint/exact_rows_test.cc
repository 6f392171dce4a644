// Exact rows (CheckpointOptions::exact_head / exact_tail): the first and last tokens come back
// exactly as the source had them, every other token exactly as the plain codec decodes it.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/session_util.h"
#include "store/store_test_util.h"
#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"
#include "tqkv/container.h"
#include "store/testing/store_testing.h"
#include "tqkv/synthetic.h"
#include "tqkv/thread_pool.h"

namespace tqkv::exact_rows_test {
namespace {

using testing_util::MakeSession;

std::unique_ptr<KvCacheBuffer> CheckpointAndRestore(Store& store, const KvCache& session,
                                                    CheckpointOptions opts, DType out,
                                                    const std::string& key) {
  auto st = Checkpoint(session, opts, store, key);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  RestoreOptions ro;
  ro.dtype = out;
  ro.pool = opts.pool;
  ro.inflight_bytes = 1;  // smallest read-ahead ring: slots are reused across chunk types
  auto r = Restore(store, key, ro);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Row `t` of layer `l`, tensor `kv`: all heads of one token.
std::span<const uint8_t> Row(const KvCache& c, uint32_t l, int kv, uint64_t t) {
  const size_t bytes = c.geometry().token_elems() * DTypeSize(c.dtype());
  return {static_cast<const uint8_t*>(c.tensor(l, kv)) + t * bytes, bytes};
}

bool SameRow(const KvCache& a, const KvCache& b, uint32_t l, int kv, uint64_t t) {
  auto x = Row(a, l, kv, t), y = Row(b, l, kv, t);
  return std::memcmp(x.data(), y.data(), x.size()) == 0;
}

struct Case {
  uint64_t tokens;
  uint32_t first, last;
  uint64_t want_head, want_tail;  // after clamping to the session
};

class ExactRows
    : public ::testing::TestWithParam<std::tuple<std::string, DType, DType, std::string>> {};

TEST_P(ExactRows, ExactRangesEqualTheSourceTheRestEqualThePlainCodec) {
  const auto& [spec, src_dtype, out_dtype, store_kind] = GetParam();
  testing_util::ScratchDir dir;
  std::unique_ptr<Store> store;
  if (store_kind == "memory") {
    store = std::make_unique<MemoryStore>();
  } else {
    ASSERT_TRUE(dir.ok());
    store = OpenStore("file://" + dir.path() + "?io=" + store_kind).value();
  }
  ThreadPool pool(2);
  const ModelGeometry g{3, 2, 64};
  for (const Case& c : {Case{77, 4, 20, 4, 20}, Case{77, 0, 33, 0, 33}, Case{77, 5, 0, 5, 0},
                        Case{10, 4, 128, 4, 6}, Case{3, 8, 8, 3, 0}, Case{0, 4, 4, 0, 0}}) {
    SCOPED_TRACE(spec + " tokens=" + std::to_string(c.tokens) + " first=" +
                 std::to_string(c.first) + " last=" + std::to_string(c.last));
    auto session = MakeSession(g, c.tokens, src_dtype, 3);
    CheckpointOptions plain;
    plain.codec = ParseCodecSpec(spec).value();
    plain.token_block = 16;  // the tail spans chunks
    plain.pool = &pool;
    plain.layer_overrides.push_back(ParseLayerCodec("1:tq2.5").value());  // a split layer too
    plain.key_mean_block = 0;  // version 1 and 2 files (key means: checkpoint_test.cc)
    plain.guard = false;       // (the guard's figures: codec_guard_test.cc)
    CheckpointOptions exact = plain;
    exact.exact_head = c.first;
    exact.exact_tail = c.last;
    CheckpointOptions lossless;
    lossless.codec.raw_dtype = src_dtype;  // the source converted to out_dtype, exactly
    auto a = CheckpointAndRestore(*store, session->cache(), plain, out_dtype, "plain");
    auto b = CheckpointAndRestore(*store, session->cache(), lossless, out_dtype, "lossless");
    auto x = CheckpointAndRestore(*store, session->cache(), exact, out_dtype, "exact");
    ASSERT_TRUE(a && b && x);

    auto object = store->Open("exact").value();
    auto reader = ContainerReader::Open(object.get(), "exact").value();
    EXPECT_EQ(reader->header().exact_head, c.want_head);
    EXPECT_EQ(reader->header().exact_tail, c.want_tail);
    const bool any = c.want_head + c.want_tail > 0;
    std::vector<uint8_t> version(4);
    ASSERT_TRUE(object->ReadAt(8, version).ok());
    EXPECT_EQ(version[0], any ? 2 : 1);
    const uint64_t plain_bytes = store->Open("plain").value()->Size();
    const uint64_t exact_rows_bytes = 2 * g.layers * (c.want_head + c.want_tail) *
                                      g.token_elems() * DTypeSize(src_dtype);
    EXPECT_GE(object->Size(), plain_bytes + exact_rows_bytes);
    EXPECT_LE(object->Size(), plain_bytes + exact_rows_bytes + (any ? 8 + g.layers * 4096 : 0));

    size_t exact_rows = 0, decoded_rows = 0;
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        for (uint64_t t = 0; t < c.tokens; ++t) {
          const bool in_exact = t < c.want_head || t >= c.tokens - c.want_tail;
          const KvCache& want = in_exact ? b->cache() : a->cache();
          EXPECT_TRUE(SameRow(want, x->cache(), l, kv, t))
              << "layer " << l << " kv " << kv << " token " << t;
          (in_exact ? exact_rows : decoded_rows) += 1;
          if (HasFailure()) return;
        }
      }
    }
    EXPECT_EQ(exact_rows, 2 * g.layers * (c.want_head + c.want_tail));

    // Streaming restore hands out the same layers.
    RestoreOptions ro;
    ro.dtype = out_dtype;
    uint32_t layers_seen = 0;
    ASSERT_TRUE(RestoreStreaming(*store, "exact", ro,
                                 [&](uint32_t l, const void* k, const void* v) {
                                   const size_t n = x->cache().tensor_bytes();
                                   EXPECT_EQ(std::memcmp(k, x->cache().k(l), n), 0) << l;
                                   EXPECT_EQ(std::memcmp(v, x->cache().v(l), n), 0) << l;
                                   ++layers_seen;
                                   return Status::Ok();
                                 })
                    .ok());
    EXPECT_EQ(layers_seen, g.layers);
    EXPECT_TRUE(VerifyObject(*store, "exact").ok());
  }
}

INSTANTIATE_TEST_SUITE_P(
    CodecsDtypesStores, ExactRows,
    ::testing::Values(std::make_tuple("tq3", DType::kF16, DType::kF16, "memory"),
                      std::make_tuple("tq4,nc=1,norm=f16", DType::kF16, DType::kF16, "direct"),
                      std::make_tuple("tq2", DType::kBF16, DType::kF32, "uring"),
                      std::make_tuple("tq3", DType::kF32, DType::kF16, "buffered"),
                      std::make_tuple("fp16", DType::kF16, DType::kBF16, "memory")),
    [](const auto& info) {
      std::string s = std::get<0>(info.param) + "_" +
                      std::string(DTypeName(std::get<1>(info.param))) + "_" +
                      std::string(DTypeName(std::get<2>(info.param))) + "_" +
                      std::get<3>(info.param);
      for (char& ch : s) {
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return s;
    });

TEST(ExactRows, ParseExactTokens) {
  auto ok = ParseExactTokens("4,128");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->head, 4u);
  EXPECT_EQ(ok->tail, 128u);
  EXPECT_EQ(ParseExactTokens("0,0")->tail, 0u);
  for (const char* bad : {"", "4", "4,", ",4", "a,4", "4,1x", "-1,4", "4,99999999999", "4;4"}) {
    auto r = ParseExactTokens(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("FIRST,LAST"), std::string::npos) << bad;
    }
  }
}

}  // namespace
}  // namespace tqkv::exact_rows_test
