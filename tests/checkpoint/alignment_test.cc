// Payload alignment below 4 KiB (format version 9): checkpoints at 64, 512 and 4096 restore to
// the same bytes through every store and read path (memory, buffered, O_DIRECT, io_uring), verify,
// and a small session's object shrinks to what the format's formula says.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/session_util.h"
#include "format/container_layout.h"
#include "store/store_test_util.h"
#include "tqkv/checkpoint.h"
#include "tqkv/container.h"
#include "tqkv/kv_cache.h"
#include "tqkv/memory_store.h"
#include "tqkv/settings.h"
#include "tqkv/store.h"

namespace tqkv {
namespace {

struct Case {
  std::string spec;
  ModelGeometry geometry;
  std::vector<uint64_t> layer_tokens;  // empty: rectangular
  uint32_t exact_head = 0, exact_tail = 0;
};

std::vector<Case> Cases() {
  return {
      {"tq3", {3, 2, 64}, {}, 1, 4},           // key means, exact rows, the guard
      {"kl:2.5", {2, 2, 64}, {}, 0, 4},        // the transform codec (version 8 at 4096)
      {"k4v2", {3, 2, 32}, {45, 9, 45}, 2, 3},  // ragged, separate K and V codecs
      {"tq2.5", {2, 1, 128}, {}, 0, 0},         // split: group-meta chunks
      {"fp16", {2, 2, 64}, {}, 0, 0},           // raw, nothing but codes
  };
}

std::unique_ptr<KvCacheBuffer> SessionOf(const Case& c, uint64_t tokens) {
  if (c.layer_tokens.empty()) return testing_util::MakeSession(c.geometry, tokens, DType::kF16, 9);
  auto buf = KvCacheBuffer::Allocate("ragged", c.geometry, DType::kF16, tokens, c.layer_tokens);
  EXPECT_TRUE(buf.ok());
  KvCache& kv = (*buf)->cache();
  uint32_t x = 1;
  for (uint32_t l = 0; l < c.geometry.layers; ++l) {
    for (int t = 0; t < 2; ++t) {
      auto* p = static_cast<uint16_t*>(kv.tensor(l, t));
      for (size_t i = 0; i < kv.layer_tokens(l) * c.geometry.token_elems(); ++i) {
        x = x * 1664525u + 1013904223u;
        p[i] = FloatToHalf(static_cast<float>(static_cast<int32_t>(x >> 8)) / 4e6f);
      }
    }
  }
  return std::move(buf).value();
}

bool SameTensors(const KvCache& a, const KvCache& b) {
  if (a.geometry() != b.geometry() || a.layer_token_counts() != b.layer_token_counts()) return false;
  for (uint32_t l = 0; l < a.geometry().layers; ++l) {
    if (std::memcmp(a.k(l), b.k(l), a.tensor_bytes(l)) != 0) return false;
    if (std::memcmp(a.v(l), b.v(l), a.tensor_bytes(l)) != 0) return false;
  }
  return true;
}

// The object size docs/format.md §2 and §5 give for `h` (its own encoding of the header body).
uint64_t FormulaBytes(const ContainerHeader& h, const std::vector<ChunkEntry>& chunks) {
  const uint64_t a = h.payload_alignment;
  auto up = [a](uint64_t x) { return (x + a - 1) / a * a; };
  uint64_t pos = up(32 + format::EncodeHeaderBody(h).size());
  for (const ChunkEntry& e : chunks) pos = up(pos) + e.size;
  return pos + 16 + 48 * chunks.size() + 64;
}

class AlignmentRoundTrip : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") {
      store_ = std::make_unique<MemoryStore>();
      return;
    }
    ASSERT_TRUE(dir_.ok());
    store_ = OpenStore("file://" + dir_.path() + "?io=" + GetParam()).value();
  }
  testing_util::ScratchDir dir_;
  std::unique_ptr<Store> store_;
};

TEST_P(AlignmentRoundTrip, EveryAlignmentRestoresTheSameBytes) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.spec);
    auto session = SessionOf(c, 45);
    std::unique_ptr<KvCacheBuffer> want;
    RestoreStats want_stats;
    uint64_t last_size = 0;
    for (uint32_t align : {4096u, 512u, 64u}) {  // 4096 first: the reference
      SCOPED_TRACE(align);
      CheckpointOptions opts;
      SetCodec(opts, ParseKvCodecSpec(c.spec).value());
      opts.token_block = 16;  // several chunks per tensor, a short last one
      opts.exact_head = c.exact_head;
      opts.exact_tail = c.exact_tail;
      opts.alignment = align;
      const std::string key = "a" + std::to_string(align);
      auto st = Checkpoint(session->cache(), opts, *store_, key);
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      auto object = store_->Open(key);
      ASSERT_TRUE(object.ok());
      auto reader = ContainerReader::Open(object->get(), key);
      ASSERT_TRUE(reader.ok()) << reader.status().ToString();
      const ContainerHeader& h = (*reader)->header();
      EXPECT_EQ(h.payload_alignment, align);
      EXPECT_EQ(ContainerVersionFor(h) == 9, align != 4096);
      EXPECT_EQ((*object)->Size(), FormulaBytes(h, (*reader)->chunks()));
      EXPECT_EQ((*object)->Size(), st->bytes_written);
      if (last_size != 0) {
        EXPECT_LT((*object)->Size(), last_size);
      }
      last_size = (*object)->Size();
      ASSERT_TRUE(VerifyObject(*store_, key).ok());

      RestoreOptions ro;
      ro.inflight_bytes = 1;  // two slots: each reused
      RestoreStats rs;
      auto back = Restore(*store_, key, ro, &rs);
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      if (align == 4096) {
        want = std::move(back).value();
        want_stats = rs;
        continue;
      }
      EXPECT_TRUE(SameTensors(want->cache(), (*back)->cache()));
      // O_DIRECT stays on: extents are whole 4 KiB blocks, as at 4096.
      EXPECT_EQ(rs.read_path.page_cache == 0, want_stats.read_path.page_cache == 0);
      // Default read-ahead: batches of many chunks, whose shared blocks are read once.
      RestoreStats big;
      auto again = Restore(*store_, key, RestoreOptions{}, &big);
      ASSERT_TRUE(again.ok()) << again.status().ToString();
      EXPECT_TRUE(SameTensors(want->cache(), (*again)->cache()));
      if (GetParam() != "memory") {
        EXPECT_LE(big.bytes_read, (*object)->Size() + 8 * 4096) << big.bytes_read;
      }
      if (!c.layer_tokens.empty()) continue;
      // Into a caller's cache, and streamed layer by layer.
      auto dst = KvCacheBuffer::Allocate("d", c.geometry, DType::kF16, 45).value();
      ASSERT_TRUE(RestoreInto(*store_, key, dst->cache(), ro).ok());
      EXPECT_TRUE(SameTensors(want->cache(), dst->cache()));
      uint32_t same = 0;
      ASSERT_TRUE(RestoreStreaming(*store_, key, ro,
                                   [&](uint32_t l, const void* k, const void* v) {
                                     const size_t n = want->cache().tensor_bytes(l);
                                     same += std::memcmp(k, want->cache().k(l), n) == 0 &&
                                             std::memcmp(v, want->cache().v(l), n) == 0;
                                     return Status::Ok();
                                   })
                      .ok());
      EXPECT_EQ(same, c.geometry.layers);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, AlignmentRoundTrip,
                         ::testing::Values("memory", "buffered", "direct", "uring"));

// A vLLM-sized chunk: 16 tokens of 4 layers. At 64 the object is the formula's size, far below
// the 4096 one's, whose padding dominates.
TEST(AlignmentTest, ASmallSessionShrinksToTheFormula) {
  const ModelGeometry g{4, 2, 128};
  auto session = testing_util::MakeSession(g, 16, DType::kF16, 3);
  MemoryStore store;
  uint64_t sizes[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    CheckpointOptions opts;
    SetCodec(opts, ParseKvCodecSpec("tq3").value());
    opts.alignment = i == 0 ? 4096 : 64;
    auto st = Checkpoint(session->cache(), opts, store, "s");
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    auto object = store.Open("s").value();
    auto reader = ContainerReader::Open(object.get(), "s").value();
    sizes[i] = object->Size();
    EXPECT_EQ(sizes[i], FormulaBytes(reader->header(), reader->chunks()));
  }
  // 4 layers x (key means, K, V): 12 chunks of at most 2 heads x 16 x (4 + 48) bytes, each
  // padded to 4 KiB at 4096, by at most 63 bytes at 64.
  EXPECT_GT(sizes[0], 12u * 4096);
  EXPECT_LT(sizes[1], sizes[0] / 3);
}

TEST(AlignmentTest, TheSettingsResolverTakesPowersOfTwoFrom64To4096) {
  CheckpointSettings s;
  EXPECT_EQ(ResolveCheckpointOptions(s)->alignment, 4096u);
  for (uint64_t a : {64u, 128u, 1024u, 4096u}) {
    s.alignment = a;
    auto o = ResolveCheckpointOptions(s);
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o->alignment, a);
    EXPECT_EQ(DescribeSettings(s, *o).alignment, a);
  }
  for (uint64_t a : {0ull, 32ull, 100ull, 8192ull, 1ull << 33}) {
    s.alignment = a;
    auto o = ResolveCheckpointOptions(s);
    ASSERT_EQ(o.status().code(), StatusCode::kInvalidArgument) << a;
    EXPECT_NE(o.status().message().find("power of two from 64 to 4096"), std::string::npos)
        << o.status().message();
  }
  // The library refuses a bad alignment before the store sees the key.
  auto session = testing_util::MakeSession({1, 1, 64}, 4, DType::kF16, 1);
  MemoryStore store;
  CheckpointOptions opts;
  opts.alignment = 100;
  EXPECT_EQ(Checkpoint(session->cache(), opts, store, "bad").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(store.Open("bad").ok());
}

}  // namespace
}  // namespace tqkv
