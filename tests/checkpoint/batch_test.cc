// RestoreBatch and CheckpointBatch (batch.h) and vLLM's CPU cache layouts (vllm_layout.h): a batch
// of chunks restored into paged tensors holds, block for block, what each chunk's own restore
// gives, in every layout (vLLM's CUDA NHD/HND, its CPU vec and AMX orders); each layer is reported
// once for the whole batch; a failed object fails itself and the later ones, and a chunk of
// another model is refused before a byte of its blocks is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/session_util.h"
#include "tqkv/batch.h"
#include "tqkv/checkpoint.h"
#include "tqkv/container.h"
#include "tqkv/kv_layout.h"
#include "tqkv/memory_store.h"
#include "tqkv/synthetic.h"
#include "tqkv/thread_pool.h"
#include "tqkv/vllm_layout.h"

namespace tqkv {
namespace {

constexpr ModelGeometry kGeo{3, 2, 32};
constexpr uint64_t kBlock = 32, kChunk = 64, kBlocks = 12;
constexpr uint16_t kUntouched = 0x7E7E;

// vLLM's caches as KvLayouts over one tensor per layer: CUDA [2, blocks, block, heads, dim] (NHD)
// and [2, blocks, heads, block, dim] (HND) with V on the leading axis; CPU [blocks, heads, block,
// 2 * dim] in the vec and AMX orders.
struct Cache {
  std::string name;
  LayoutTensors t;
  size_t elems = 0;
};

Cache MakeBatchCache(const std::string& name) {
  Cache c{name, {}, kBlocks * kGeo.kv_heads * kBlock * 2 * kGeo.head_dim};
  LayoutTensors& t = c.t;
  t.geometry = kGeo;
  t.dtype = DType::kBF16;
  t.tokens = kChunk;
  t.tensor_elems = c.elems;
  const int64_t d = kGeo.head_dim, h = kGeo.kv_heads, n = kBlock, half = c.elems / 2;
  if (name == "vec" || name == "amx") {
    auto l = VllmCpuCacheLayouts(name, kGeo, kBlock, DType::kBF16);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    t.layout = l->k;
    t.v_layout = l->v;
    return c;
  }
  KvLayout k;
  k.block_tokens = n;
  k.dim_stride = 1;
  k.block_stride = n * h * d;
  if (name == "nhd") {
    k.token_stride = h * d;
    k.head_stride = d;
  } else {  // hnd
    k.token_stride = d;
    k.head_stride = n * d;
  }
  KvLayout v = k;
  v.base = half;  // V's half of the [2, ...] tensor
  t.layout = k;
  t.v_layout = v;
  return c;
}

class Batch : public ::testing::TestWithParam<const char*> {
 protected:
  // Three chunks of a 192-token prompt as three sessions (bf16 source, `codec`).
  void Store(const char* codec) {
    CheckpointOptions opts;
    opts.codec = ParseCodecSpec(codec).value();
    for (int i = 0; i < 3; ++i) {
      auto buf = KvCacheBuffer::Allocate("m" + std::to_string(i), kGeo, DType::kBF16, kChunk);
      ASSERT_TRUE(buf.ok());
      SyntheticKv gen(SyntheticKind::kKv, kGeo, 40 + i);
      ASSERT_TRUE(gen.FillCache(buf.value()->cache()).ok());
      sessions_.push_back(std::move(buf).value());
      ASSERT_TRUE(Checkpoint(sessions_.back()->cache(), opts, store_, Key(i)).ok());
      RestoreOptions bf16;
      bf16.dtype = DType::kBF16;
      auto want = Restore(store_, Key(i), bf16);
      ASSERT_TRUE(want.ok());
      want_.push_back(std::move(want).value());
    }
  }
  static std::string Key(int i) { return "chunk/" + std::to_string(i); }

  // Per-layer tensors of `c` filled with kUntouched.
  void Allocate(Cache& c) {
    mem_.assign(kGeo.layers, std::vector<uint16_t>(c.elems, kUntouched));
    for (auto& m : mem_) {
      c.t.k.push_back(m.data());
      c.t.v.push_back(m.data());
    }
  }

  // Object i's blocks of `c` hold what its own restore gives.
  void ExpectHolds(const Cache& c, int i, const std::vector<int64_t>& ids) {
    LayoutTensors mine = c.t;
    mine.SetBlockIds(ids);
    std::vector<uint16_t> back(kChunk * kGeo.token_elems());
    for (uint32_t l = 0; l < kGeo.layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        GatherLayer(mem_[l].data(), mine.layout_of(kv), kGeo, kChunk, DType::kBF16, back.data());
        const void* want = kv ? want_[i]->cache().v(l) : want_[i]->cache().k(l);
        EXPECT_EQ(0, std::memcmp(back.data(), want, back.size() * 2))
            << c.name << " object " << i << " layer " << l << " kv " << kv;
      }
    }
  }

  MemoryStore store_;
  std::vector<std::unique_ptr<KvCacheBuffer>> sessions_, want_;
  std::vector<std::vector<uint16_t>> mem_;
};

const std::vector<std::vector<int64_t>> kIds = {{5, 0}, {7, 2}, {11, 3}};

TEST_P(Batch, RestoresEveryLayoutLikeEachObjectsOwnRestore) {
  Store(GetParam());
  ThreadPool pool(2);
  for (const char* layout : {"nhd", "hnd", "vec", "amx"}) {
    for (size_t in_flight : {1, 4}) {
      Cache c = MakeBatchCache(layout);
      Allocate(c);
      std::vector<BatchObject> objs;
      for (int i = 0; i < 3; ++i) objs.push_back({Key(i), kIds[i], "m" + std::to_string(i)});
      std::vector<uint32_t> ready;
      RestoreOptions opts;
      opts.pool = &pool;
      opts.layer_ready = [&](uint32_t l) {
        ready.push_back(l);
        return Status::Ok();
      };
      BatchStats st;
      Status s = RestoreBatch(store_, objs, c.t, opts, {.objects_in_flight = in_flight}, &st);
      ASSERT_TRUE(s.ok()) << layout << ": " << s.ToString();
      EXPECT_EQ(st.done, 3u);
      EXPECT_EQ(st.tokens, 3 * kChunk);
      EXPECT_EQ(ready, (std::vector<uint32_t>{0, 1, 2})) << layout;
      for (int i = 0; i < 3; ++i) ExpectHolds(c, i, kIds[i]);
      for (int64_t b : {1, 4, 6, 8, 9, 10}) {  // blocks of no object: untouched
        for (const auto& m : mem_) {
          const size_t per = c.elems / kBlocks;
          // CPU caches keep a block's K and V together; CUDA ones in two halves.
          const bool cpu = c.t.layout.base == 0 && c.t.v_layout->base != int64_t(c.elems / 2);
          const size_t at = cpu ? b * per : b * per / 2;
          EXPECT_EQ(m[at], kUntouched) << layout << " block " << b;
        }
      }
    }
  }
}

TEST_P(Batch, AFailedObjectFailsTheLaterOnesAndAnotherModelIsNeverWritten) {
  Store(GetParam());
  Cache c = MakeBatchCache("vec");
  Allocate(c);
  std::vector<BatchObject> objs = {{Key(0), kIds[0], "m0"},
                                   {Key(1), kIds[1], "another model"},
                                   {Key(2), kIds[2], "m2"}};
  int calls = 0;
  RestoreOptions opts;
  opts.layer_ready = [&](uint32_t) {
    ++calls;
    return Status::Ok();
  };
  BatchStats st;
  Status s = RestoreBatch(store_, objs, c.t, opts, {.objects_in_flight = 1}, &st);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("object 2 of 3"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("another model"), std::string::npos) << s.ToString();
  EXPECT_EQ(st.done, 1u);
  EXPECT_EQ(calls, 3);  // every layer reported once, for the object that was restored
  ExpectHolds(c, 0, kIds[0]);
  for (const auto& m : mem_) {  // object 1's blocks: checked before written, so untouched
    for (int64_t b : kIds[1]) {
      const size_t per = c.elems / kBlocks;
      for (size_t e = 0; e < per; ++e) ASSERT_EQ(m[b * per + e], kUntouched);
    }
  }
  // A missing object: NotFound for it, the ones before it restored.
  objs[1].model = "m1";
  objs[2].key = "chunk/absent";
  s = RestoreBatch(store_, objs, c.t, {}, {}, &st);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_EQ(st.done, 2u);
  // Another geometry or token count: refused as well.
  LayoutTensors small = c.t;
  small.tokens = kChunk / 2;
  s = RestoreBatch(store_, objs, small, {}, {}, &st);
  EXPECT_EQ(st.done, 0u);
  EXPECT_NE(s.message().find("holds 64 tokens"), std::string::npos) << s.ToString();
}

TEST_P(Batch, CheckpointBatchStoresWhatEachObjectsOwnCheckpointStores) {
  // A 192-token prompt in a vec CPU cache, saved in 3 chunks, then restored.
  Cache c = MakeBatchCache("vec");
  Allocate(c);
  auto prompt = testing_util::MakeSession(kGeo, 3 * kChunk, DType::kBF16, 9);
  std::vector<int64_t> all;
  for (const auto& ids : kIds) all.insert(all.end(), ids.begin(), ids.end());
  LayoutTensors whole = c.t;
  whole.tokens = 3 * kChunk;
  whole.SetBlockIds(all);
  for (uint32_t l = 0; l < kGeo.layers; ++l) {
    ScatterLayer(prompt->cache().k(l), whole.layout_of(0), kGeo, whole.tokens, DType::kBF16,
                 mem_[l].data());
    ScatterLayer(prompt->cache().v(l), whole.layout_of(1), kGeo, whole.tokens, DType::kBF16,
                 mem_[l].data());
  }
  std::vector<BatchObject> objs;
  for (int i = 0; i < 3; ++i) {
    objs.push_back({Key(i), kIds[i], "m" + std::to_string(i), uint64_t(i) * kChunk});
  }
  CheckpointOptions opts;
  opts.codec = ParseCodecSpec(GetParam()).value();
  opts.exact_head = 4;
  opts.exact_tail = 4;
  BatchStats st;
  EXPECT_EQ(CheckpointBatch(store_, objs, c.t, opts, {}, &st).code(),
            StatusCode::kInvalidArgument);  // no exact tail in a chunk
  opts.exact_tail = 0;
  ThreadPool pool(2);
  opts.pool = &pool;
  Status s = CheckpointBatch(store_, objs, c.t, opts, {}, &st);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(st.done, 3u);
  EXPECT_EQ(st.skipped, 0u);
  EXPECT_EQ(st.tokens, 3 * kChunk);
  for (int i = 0; i < 3; ++i) {
    auto obj = store_.Open(Key(i)).value();
    auto reader = ContainerReader::Open(obj.get(), Key(i)).value();
    EXPECT_EQ(reader->header().model, "m" + std::to_string(i));
    EXPECT_EQ(reader->header().exact_head, i == 0 ? 4u : 0u);  // the prompt's first tokens only
    EXPECT_EQ(reader->header().exact_tail, 0u);
    // The same bytes as a checkpoint of the chunk's tokens from a plain cache.
    auto part = KvCacheBuffer::Allocate("m" + std::to_string(i), kGeo, DType::kBF16, kChunk);
    for (uint32_t l = 0; l < kGeo.layers; ++l) {
      const size_t bytes = kChunk * kGeo.token_elems() * 2;
      std::memcpy(part.value()->cache().k(l),
                  static_cast<const uint8_t*>(prompt->cache().k(l)) + i * bytes, bytes);
      std::memcpy(part.value()->cache().v(l),
                  static_cast<const uint8_t*>(prompt->cache().v(l)) + i * bytes, bytes);
    }
    CheckpointOptions one = opts;
    one.exact_head = i == 0 ? 4 : 0;
    ASSERT_TRUE(Checkpoint(part.value()->cache(), one, store_, "plain").ok());
    EXPECT_EQ(store_.Open("plain").value()->Size(), obj->Size()) << i;
  }
  // Stored already: skipped, not written again.
  s = CheckpointBatch(store_, objs, c.t, opts, {}, &st);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(st.done, 3u);
  EXPECT_EQ(st.skipped, 3u);
  EXPECT_EQ(st.bytes, 0u);
}

TEST_P(Batch, AShorterLastObjectMovesItsOwnTokens) {
  // A 160-token prompt: two 64-token chunks and a last one of 32 tokens in block 11.
  Cache c = MakeBatchCache("vec");
  Allocate(c);
  const uint64_t total = 2 * kChunk + kBlock;
  auto prompt = testing_util::MakeSession(kGeo, total, DType::kBF16, 11);
  const std::vector<std::vector<int64_t>> ids = {kIds[0], kIds[1], {11}};
  std::vector<int64_t> all;
  for (const auto& b : ids) all.insert(all.end(), b.begin(), b.end());
  LayoutTensors whole = c.t;
  whole.tokens = total;
  whole.SetBlockIds(all);
  for (uint32_t l = 0; l < kGeo.layers; ++l) {
    ScatterLayer(prompt->cache().k(l), whole.layout_of(0), kGeo, total, DType::kBF16,
                 mem_[l].data());
    ScatterLayer(prompt->cache().v(l), whole.layout_of(1), kGeo, total, DType::kBF16,
                 mem_[l].data());
  }
  std::vector<BatchObject> objs;
  for (int i = 0; i < 3; ++i) {
    objs.push_back({Key(i), ids[i], "m" + std::to_string(i), uint64_t(i) * kChunk});
  }
  objs[2].tokens = kBlock;
  CheckpointOptions opts;
  opts.codec = ParseCodecSpec(GetParam()).value();
  BatchStats st;
  Status s = CheckpointBatch(store_, objs, c.t, opts, {}, &st);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(st.tokens, total);
  auto obj = store_.Open(Key(2)).value();
  EXPECT_EQ(ContainerReader::Open(obj.get(), Key(2)).value()->header().tokens, kBlock);
  RestoreOptions bf16;
  bf16.dtype = DType::kBF16;
  auto own = Restore(store_, Key(2), bf16);
  ASSERT_TRUE(own.ok()) << own.status().ToString();

  // Restored into a fresh cache: block 11 holds what the object's own restore gives, block 3
  // (a chunk's second block elsewhere) stays untouched.
  for (auto& m : mem_) std::fill(m.begin(), m.end(), kUntouched);
  s = RestoreBatch(store_, objs, c.t, {}, {}, &st);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(st.done, 3u);
  EXPECT_EQ(st.tokens, total);
  LayoutTensors last = c.t;
  last.SetBlockIds({11});
  std::vector<uint16_t> back(kBlock * kGeo.token_elems());
  const size_t per = c.elems / kBlocks;
  for (uint32_t l = 0; l < kGeo.layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      GatherLayer(mem_[l].data(), last.layout_of(kv), kGeo, kBlock, DType::kBF16, back.data());
      const void* want = kv ? own.value()->cache().v(l) : own.value()->cache().k(l);
      EXPECT_EQ(0, std::memcmp(back.data(), want, back.size() * 2)) << "layer " << l;
    }
    EXPECT_EQ(mem_[l][3 * per], kUntouched);
  }
  // Restored as a whole chunk (blocks for 64 tokens) it is refused, the objects before it
  // restored.
  objs[2].tokens = 0;
  objs[2].block_ids = {11, 3};
  s = RestoreBatch(store_, objs, c.t, {}, {}, &st);
  EXPECT_EQ(st.done, 2u);
  EXPECT_NE(s.message().find("holds 32 tokens"), std::string::npos) << s.ToString();
}

INSTANTIATE_TEST_SUITE_P(Codecs, Batch, ::testing::Values("bf16", "tq3", "kl:2.5"));

// vLLM 0.32's CPU kernels' write order, element by element (csrc/cpu/cpu_attn_vec.hpp,
// cpu_attn_amx.hpp), against the layouts.
TEST(VllmCpuLayout, MatchesTheKernelsWriteOrder) {
  const ModelGeometry g{1, 2, 64};
  const uint64_t n = 64, blocks = 3;
  for (const char* isa : {"vec", "vec16", "amx"}) {
    auto l = VllmCpuCacheLayouts(isa, g, n, DType::kBF16);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    std::vector<uint16_t> cache(blocks * g.kv_heads * n * 2 * g.head_dim);
    std::vector<uint16_t> k(blocks * n * g.token_elems()), v(k.size());  // canonical per block
    const size_t d = g.head_dim;
    for (uint64_t b = 0; b < blocks; ++b) {
      for (size_t h = 0; h < g.kv_heads; ++h) {
        uint16_t* region = cache.data() + (b * g.kv_heads + h) * 2 * n * d;
        for (uint64_t t = 0; t < n; ++t) {
          for (size_t c = 0; c < d; ++c) {
            size_t ko, vo;
            if (std::string(isa) == "amx") {
              ko = (t / 16) * 16 * d + (c / 2) * 32 + (t % 16) * 2 + c % 2;
              vo = (c / 16) * n * 16 + (t / 2) * 32 + (c % 16) * 2 + t % 2;
            } else {
              ko = c * n + t;
              vo = t * d + c;
            }
            const size_t canon = ((b * n + t) * g.kv_heads + h) * d + c;
            k[canon] = static_cast<uint16_t>(canon * 3 + 1);
            v[canon] = static_cast<uint16_t>(canon * 5 + 2);
            region[ko] = k[canon];
            region[n * d + vo] = v[canon];
          }
        }
      }
    }
    const std::vector<int64_t> ids = {2, 0, 1};  // tokens 0..63 in block 2, ...
    for (KvLayout* lay : {&l->k, &l->v}) lay->block_ids = ids;
    ASSERT_TRUE(ValidateKvLayout(l->k, g, blocks * n, cache.size()).ok());
    ASSERT_TRUE(ValidateKvLayout(l->v, g, blocks * n, cache.size()).ok());
    EXPECT_FALSE(ValidateKvLayout(l->v, g, blocks * n, cache.size() - 1).ok()) << isa;
    std::vector<uint16_t> got(k.size());
    for (int kv = 0; kv < 2; ++kv) {
      GatherLayer(cache.data(), kv ? l->v : l->k, g, blocks * n, DType::kBF16, got.data());
      const auto& want = kv ? v : k;
      for (uint64_t t = 0; t < blocks * n; ++t) {  // token t is in block ids[t / n]
        const uint64_t src = ids[t / n] * n + t % n;
        ASSERT_EQ(0, std::memcmp(&got[t * g.token_elems()], &want[src * g.token_elems()],
                                 g.token_elems() * 2))
            << isa << " kv " << kv << " token " << t;
      }
      // Scattered back into an empty cache: the kernels' order again.
      std::vector<uint16_t> back(cache.size(), 0);
      ScatterLayer(got.data(), kv ? l->v : l->k, g, blocks * n, DType::kBF16, back.data());
      for (size_t i = 0; i < cache.size(); ++i) {
        const bool is_v = i % (2 * n * d) >= n * d;
        if (is_v == bool(kv)) {
          ASSERT_EQ(back[i], cache[i]) << isa << " element " << i;
        }
      }
    }
  }
  EXPECT_EQ(VllmCpuCacheLayouts("neon", g, n, DType::kBF16).status().code(),
            StatusCode::kUnsupported);
  EXPECT_EQ(VllmCpuCacheLayouts("amx", g, n, DType::kF32).status().code(),
            StatusCode::kUnsupported);
  EXPECT_EQ(VllmCpuCacheLayouts("amx", g, 16, DType::kBF16).status().code(),
            StatusCode::kUnsupported);
}

}  // namespace
}  // namespace tqkv
