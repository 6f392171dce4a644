// llama.cpp sequence state and slot file: parse, serialize, session mapping, checkpoint/restore.
// The blobs here are built by an independent writer that follows the pinned llama.cpp's
// llama_kv_cache::state_write (docs/llama.md), not by the code under test; real blobs from
// llama.cpp itself are tested in tests/llama/test_llama_engine.py.
#include "tqkv/llama_state.h"

#include <gtest/gtest.h>

#include <cstring>

#include "store/testing/store_testing.h"
#include "tqkv/container.h"
#include "tqkv/memory_store.h"

namespace tqkv::llama {
namespace {

struct Blob {
  std::vector<uint8_t> b;
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void Raw(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
  }
};

size_t ElemBytes(int32_t type) { return type == kGgmlF32 ? 4 : 2; }

// Element `i` of a layer's tensor as the given ggml type (finite values, distinct per seed).
void PutElem(Blob& o, int32_t type, uint32_t seed) {
  const float f = static_cast<float>(static_cast<int32_t>(seed * 2654435761u % 2001) - 1000) / 64;
  if (type == kGgmlF32) {
    o.Raw(&f, 4);
  } else {
    const uint16_t h = type == kGgmlF16 ? FloatToHalf(f) : FloatToBF16(f);
    o.Raw(&h, 2);
  }
}

struct CacheSpec {
  std::vector<int32_t> positions;  // one cell per position, sequence 0
  uint32_t layers = 2, n_embd = 8;
  int32_t k_type = kGgmlF16, v_type = kGgmlF16;
  bool v_trans = false;
  uint32_t empty_streams_before = 0;  // streams without cells of the sequence
  uint32_t seed = 1;
  uint32_t seqs = 1;  // every cell belongs to sequences 0 .. seqs - 1
};

// What llama_kv_cache::state_write writes for one cache.
void WriteCache(Blob& o, const CacheSpec& c) {
  o.U32(c.empty_streams_before + 1);
  for (uint32_t s = 0; s < c.empty_streams_before; ++s) o.U32(0);
  const uint32_t cells = static_cast<uint32_t>(c.positions.size());
  o.U32(cells);
  if (cells == 0) return;
  for (int32_t p : c.positions) {
    o.U32(static_cast<uint32_t>(p));
    o.U32(c.seqs);  // n_seq_id, then the ids ascending (state_write_meta's loop)
    for (uint32_t id = 0; id < c.seqs; ++id) o.U32(id);
  }
  o.U32(c.v_trans ? 1 : 0);
  o.U32(c.layers);
  for (uint32_t l = 0; l < c.layers; ++l) {
    o.U32(static_cast<uint32_t>(c.k_type));
    o.U64(uint64_t{c.n_embd} * ElemBytes(c.k_type));
    for (uint32_t i = 0; i < cells * c.n_embd; ++i) PutElem(o, c.k_type, c.seed + l * 1000 + i);
  }
  for (uint32_t l = 0; l < c.layers; ++l) {
    o.U32(static_cast<uint32_t>(c.v_type));
    if (c.v_trans) {
      o.U32(static_cast<uint32_t>(ElemBytes(c.v_type)));
      o.U32(c.n_embd);
    } else {
      o.U64(uint64_t{c.n_embd} * ElemBytes(c.v_type));
    }
    for (uint32_t i = 0; i < cells * c.n_embd; ++i) PutElem(o, c.v_type, c.seed + 77 + l * 1000 + i);
  }
}

// io_header: as llama_state_seq_get_data (magic, sequence id) rather than a slot file's body.
std::vector<uint8_t> MakeBlob(const std::vector<CacheSpec>& caches, bool io_header = false,
                              int32_t seq_id = 0) {
  Blob o;
  if (io_header) {
    o.U32(kSeqDataMagic);
    o.U32(static_cast<uint32_t>(seq_id));
  }
  for (const CacheSpec& c : caches) WriteCache(o, c);
  return o.b;
}

std::vector<int32_t> Range(int32_t begin, int32_t end) {
  std::vector<int32_t> v;
  for (int32_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

TEST(LlamaStateTest, ParsesAndReserializesEveryRowTypeInBothVLayouts) {
  for (int32_t type : {kGgmlF16, kGgmlBF16, kGgmlF32}) {
    for (bool v_trans : {false, true}) {
      SCOPED_TRACE(GgmlTypeName(type) + (v_trans ? " v_trans" : ""));
      CacheSpec c{Range(0, 5), 3, 8, type, type, v_trans, 0, 9};
      const std::vector<uint8_t> blob = MakeBlob({c});
      auto st = ParseSeqState(blob);
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      ASSERT_EQ(st->caches.size(), 1u);
      ASSERT_EQ(st->caches[0].streams.size(), 1u);
      const Stream& s = st->caches[0].streams[0];
      EXPECT_EQ(s.cells.size(), 5u);
      EXPECT_EQ(s.cells[4].pos, 4);
      EXPECT_EQ(s.v_trans, v_trans);
      ASSERT_EQ(s.layers.size(), 3u);
      EXPECT_EQ(s.layers[2].k_type, type);
      EXPECT_EQ(s.layers[2].n_embd_v, 8u);
      EXPECT_EQ(SerializeSeqState(*st), blob);
    }
  }
}

TEST(LlamaStateTest, SlidingWindowLayersHoldOnlyTheirWindow) {
  // Gemma 3 style: the full-attention cache holds positions 0..9, the sliding-window cache only
  // the window 6..9; a second stream without cells comes first in the window cache.
  CacheSpec full{Range(0, 10), 1, 8, kGgmlF16, kGgmlF16, true, 0, 3};
  CacheSpec swa{Range(6, 10), 2, 8, kGgmlF16, kGgmlF16, true, 1, 5};
  const std::vector<uint8_t> blob = MakeBlob({full, swa});
  auto st = ParseSeqState(blob);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_EQ(st->caches.size(), 2u);
  EXPECT_EQ(st->caches[1].streams.size(), 2u);
  EXPECT_TRUE(st->caches[1].streams[0].cells.empty());
  EXPECT_EQ(SerializeSeqState(*st), blob);

  auto session = ToSession(*st, 4, "gemma-like");
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  const KvCache& kv = session->kv->cache();
  EXPECT_EQ(kv.geometry(), (ModelGeometry{3, 2, 4}));
  EXPECT_EQ(kv.tokens(), 10u);
  EXPECT_EQ(kv.dtype(), DType::kF16);
  // The window's layers (session layers 1 and 2) hold its 4 cells, nothing padded.
  EXPECT_EQ(kv.layer_token_counts(), (std::vector<uint64_t>{10, 4, 4}));
  EXPECT_EQ(kv.tensor_bytes(1), 4u * 8 * 2);
  // Session layer 1 is the window cache's layer 0: its first cell (position 6) is its row 0.
  const auto* k1 = static_cast<const uint8_t*>(kv.k(1));
  const Layer& w0 = st->caches[1].streams[1].layers[0];
  EXPECT_EQ(0, std::memcmp(k1, w0.k.data(), 4 * 8 * 2));
  // V transposed: element (j = 1, cell 0) of the window's layer 0 is its V row 0, element 1.
  const auto* v1 = static_cast<const uint8_t*>(kv.v(1));
  EXPECT_EQ(0, std::memcmp(v1 + 1 * 2, w0.v.data() + 1 * 4 * 2, 2));

  auto back = FromSession(kv, session->engine_state);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->blob, blob);
  EXPECT_FALSE(back->has_tokens);
}

// A ring buffer leaves the window's cells out of position order: its rows are ranked by position,
// so the layer's last rows (the exact tail) are its most recent tokens; the blob comes back as it
// was.
TEST(LlamaStateTest, WindowCellsOutOfOrderAreRankedByPosition) {
  CacheSpec full{Range(0, 12), 2, 8, kGgmlF16, kGgmlF16, false, 0, 3};
  CacheSpec swa{{9, 10, 11, 7, 8}, 3, 8, kGgmlF16, kGgmlF16, true, 0, 5};
  const std::vector<uint8_t> blob = MakeBlob({full, swa});
  auto st = ParseSeqState(blob);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  auto session = ToSession(*st, 8, "ring");
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  const KvCache& kv = session->kv->cache();
  EXPECT_EQ(kv.layer_token_counts(), (std::vector<uint64_t>{12, 12, 5, 5, 5}));
  // Cell 3 (position 7) is row 0; cell 2 (position 11) the last row.
  const Layer& w0 = st->caches[1].streams[0].layers[0];
  const auto* k2 = static_cast<const uint8_t*>(kv.k(2));
  EXPECT_EQ(0, std::memcmp(k2, w0.k.data() + 3 * 8 * 2, 8 * 2));
  EXPECT_EQ(0, std::memcmp(k2 + 4 * 8 * 2, w0.k.data() + 2 * 8 * 2, 8 * 2));
  auto back = FromSession(kv, session->engine_state);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->blob, blob);
}

TEST(LlamaStateTest, GetDataBlobsKeepTheirMagicAndSequenceId) {
  const std::vector<uint8_t> blob = MakeBlob({CacheSpec{Range(0, 4), 1, 8}}, true, 5);
  auto st = ParseSeqState(blob);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_TRUE(st->io_header);
  EXPECT_EQ(st->seq_id, 5);
  EXPECT_EQ(st->caches[0].streams[0].cells.size(), 4u);
  EXPECT_EQ(SerializeSeqState(*st), blob);
  auto session = ToSession(*st, 4, "m");
  ASSERT_TRUE(session.ok());
  auto back = FromSession(session->kv->cache(), session->engine_state);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->blob, blob);
  // The magic and id alone: truncated.
  EXPECT_TRUE(ParseSeqState(std::span(blob.data(), 8)).status().IsCorruption());
}

TEST(LlamaStateTest, MixedTypesBecomeF32AndComeBackExactly) {
  CacheSpec c{Range(3, 9), 2, 6, kGgmlF16, kGgmlBF16, false, 0, 11};
  auto parsed = ParseSeqState(MakeBlob({c}));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  // NaNs with payloads, signalling ones too (the fuzzer's find: f16 0xfd0f came back 0xff0f),
  // and infinities: the f32 session keeps them and gives them back bit for bit.
  Layer& l0 = parsed->caches[0].streams[0].layers[0];
  const uint16_t f16s[] = {0xFD0F, 0x7C01, 0x7E00, 0xFC00, 0x7C00};
  const uint16_t bf16s[] = {0x7F81, 0xFF81, 0x7FC0, 0xFF80, 0x7F80};
  for (size_t i = 0; i < 5; ++i) {
    std::memcpy(&l0.k[2 * i], &f16s[i], 2);
    std::memcpy(&l0.v[2 * i], &bf16s[i], 2);
  }
  const std::vector<uint8_t> blob = SerializeSeqState(*parsed);
  auto st = ParseSeqState(blob);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  auto session = ToSession(*st, 3, "m");
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  EXPECT_EQ(session->kv->cache().dtype(), DType::kF32);
  auto back = FromSession(session->kv->cache(), session->engine_state);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->blob, blob);
}

TEST(LlamaStateTest, QuantizedTypesAreRefusedByName) {
  {
    CacheSpec c{Range(0, 4), 1, 32, kGgmlF16, kGgmlF16, false};
    std::vector<uint8_t> blob = MakeBlob({c});
    const uint32_t q8_0 = 8;
    std::memcpy(blob.data() + 4 + 4 + 4 * 12 + 8, &q8_0, 4);  // layer 0's K type
    auto st = ParseSeqState(blob);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), StatusCode::kUnsupported);
    EXPECT_NE(st.status().message().find("layer 0 K has type q8_0"), std::string::npos)
        << st.status().message();
  }
  {
    // A V type in the transposed layout: found after the K rows.
    CacheSpec c{Range(0, 4), 1, 32, kGgmlF16, kGgmlF16, true};
    std::vector<uint8_t> blob = MakeBlob({c});
    const size_t v_at = 4 + 4 + 4 * 12 + 8 + 12 + 4 * 32 * 2;
    uint32_t v_type;
    std::memcpy(&v_type, blob.data() + v_at, 4);
    ASSERT_EQ(v_type, 1u);
    const uint32_t q4_0 = 2;
    std::memcpy(blob.data() + v_at, &q4_0, 4);
    auto st = ParseSeqState(blob);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), StatusCode::kUnsupported);
    EXPECT_NE(st.status().message().find("layer 0 V has type q4_0"), std::string::npos)
        << st.status().message();
  }
}

TEST(LlamaStateTest, TruncatedOrExtendedBlobsAreCorruption) {
  CacheSpec full{Range(0, 3), 1, 4, kGgmlF16, kGgmlF16, true, 0, 3};
  CacheSpec swa{Range(1, 3), 1, 4, kGgmlBF16, kGgmlBF16, false, 0, 5};
  const std::vector<uint8_t> blob = MakeBlob({full, swa});
  // Every strict prefix: refused, never read past its end (ASan), never a crash. A prefix that
  // ends exactly after the first cache is a valid one-cache blob.
  const size_t first_cache = MakeBlob({full}).size();
  for (size_t n = 0; n < blob.size(); ++n) {
    auto st = ParseSeqState(std::span<const uint8_t>(blob.data(), n));
    if (n == first_cache) {
      EXPECT_TRUE(st.ok()) << n;
      continue;
    }
    ASSERT_FALSE(st.ok()) << n;
    EXPECT_EQ(st.status().code(), StatusCode::kCorruption) << n << ": " << st.status().ToString();
  }
  std::vector<uint8_t> longer = blob;
  longer.push_back(0);
  auto st = ParseSeqState(longer);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("does not know"), std::string::npos) << st.status().message();
}

TEST(LlamaStateTest, HugeCountsAreRefusedBeforeAllocating) {
  CacheSpec c{Range(0, 2), 1, 4};
  const std::vector<uint8_t> good = MakeBlob({c});
  for (size_t at : {size_t{0}, size_t{4}, size_t{12}, size_t{4 + 4 + 24 + 4}}) {
    std::vector<uint8_t> blob = good;
    const uint32_t huge = 0xFFFFFFF0u;
    std::memcpy(blob.data() + at, &huge, 4);
    auto st = ParseSeqState(blob);
    EXPECT_FALSE(st.ok()) << at;
  }
  // A row size that does not fit the row type.
  std::vector<uint8_t> blob = good;
  const uint64_t odd = 7;
  std::memcpy(blob.data() + 4 + 4 + 24 + 8 + 4, &odd, 8);
  auto st = ParseSeqState(blob);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("row size"), std::string::npos) << st.status().message();
}

// Issue 34 defect 1: a session used to be one rectangle of layers x tokens, padding short
// streams with zero rows: the crafted blob of the issue (1 cell x 4,500 layers, then 4,500 cells
// x 1 layer) made a 1.28 GB process and a 1.33 GB object from 738 KB, and since then was refused.
// Now each stream's layers hold its own cells: the session and the object follow the blob's size
// (the object: the rows' bytes plus at most two 4 KiB-aligned chunks and 2 index records per
// layer, docs/format.md §5), and doubling the blob doubles them (linear, not quadratic).
struct CraftedRun {
  size_t blob = 0;
  uint64_t held = 0;    // bytes the session allocated for K and V
  uint64_t object = 0;  // bytes of the fp16 object
};
CraftedRun ImportCrafted(uint32_t n) {
  CacheSpec wide{Range(0, 1), n, 8};
  CacheSpec tall{Range(0, static_cast<int32_t>(n)), 1, 8};
  const std::vector<uint8_t> blob = MakeBlob({wide, tall});
  CraftedRun run;
  run.blob = blob.size();
  auto st = ParseSeqState(blob);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  auto s = ToSession(*st, 8, "crafted");
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return run;
  const KvCache& kv = s->kv->cache();
  EXPECT_EQ(kv.geometry().layers, n + 1);
  EXPECT_EQ(kv.tokens(), n);
  for (uint32_t l = 0; l <= n; ++l) run.held += 2 * kv.tensor_bytes(l);
  MemoryStore store;
  CheckpointOptions opts;
  opts.codec = *ParseCodecSpec("fp16");
  auto cp = CheckpointSeqState(blob, 8, "crafted", nullptr, opts, store, "c");
  EXPECT_TRUE(cp.ok()) << cp.status().ToString();
  if (!cp.ok()) return run;
  run.object = cp->bytes_written;
  auto back = RestoreSeqState(store, "c");
  EXPECT_TRUE(back.ok()) << back.status().ToString();
  if (back.ok()) {
    EXPECT_EQ(back->blob, blob);
  }
  return run;
}

TEST(LlamaStateTest, StreamsOfDifferentCellCountsStoreWhatEachHolds) {
  const CraftedRun small = ImportCrafted(2250);
  const CraftedRun big = ImportCrafted(4500);
  ASSERT_GT(big.object, 0u);
  // The session holds the blob's rows: 2 x (4,500 + 4,500) rows of 8 f16.
  EXPECT_EQ(big.held, 2u * 9000 * 8 * 2);
  EXPECT_LE(big.held, big.blob);
  // The object: the rows it holds plus at most two 4 KiB pages and two index records per layer.
  // Every layer costs the blob at least 56 bytes (K and V: type, row size, one 16-byte row), so
  // per input byte at most 1 + 8,288 / 56 < 150 bytes, whatever the blob; the rectangle was
  // 1.33 GB.
  const uint64_t layers = 4501;
  EXPECT_LE(big.object, big.held + layers * (2 * 4096 + 2 * 48) + 64 * 1024);
  EXPECT_LE(big.object, 150u * big.blob + 64 * 1024);
  // Linear: twice the layers and cells, about twice the bytes.
  EXPECT_LE(static_cast<double>(big.object) / small.object, 2.1);
  EXPECT_LE(static_cast<double>(big.held) / small.held, 2.1);
}

// A window that started past the full cache's cells, both streams lossy-coded: exact rows fit
// the shortest layer, and the export rebuilds the layout with every cell where it was.
TEST(LlamaStateTest, RaggedSessionsExportByteIdenticallyAtFp16AndKeepTheLayoutWhenLossy) {
  CacheSpec full{Range(0, 300), 3, 64, kGgmlF16, kGgmlF16, true, 0, 3};
  CacheSpec swa{Range(268, 300), 15, 64, kGgmlF16, kGgmlF16, true, 0, 8};
  const std::vector<uint8_t> blob = MakeBlob({full, swa}, true, 2);
  MemoryStore store;
  CheckpointOptions opts;
  opts.codec = *ParseCodecSpec("fp16");
  auto st = CheckpointSeqState(blob, 64, "m", nullptr, opts, store, "s");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  // 3 x 300 + 15 x 32 rows of 64 f16, K and V: the fp16 session is no larger than the blob.
  EXPECT_EQ(st->fp16_bytes, 2u * (3 * 300 + 15 * 32) * 64 * 2);
  EXPECT_LE(st->bytes_written, blob.size() + 18 * 2 * 4096 + 64 * 1024);
  {
    auto object = store.Open("s").value();
    auto reader = ContainerReader::Open(object.get(), "s").value();
    EXPECT_EQ(ContainerVersionFor(reader->header()), 7u);
  }
  auto back = RestoreSeqState(store, "s");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->blob, blob);

  opts.codec = *ParseCodecSpec("tq3");
  opts.exact_tail = 64;  // more than the window: clamped to its 32
  ASSERT_TRUE(CheckpointSeqState(blob, 64, "m", nullptr, opts, store, "q").ok());
  auto lossy = RestoreSeqState(store, "q");
  ASSERT_TRUE(lossy.ok()) << lossy.status().ToString();
  ASSERT_EQ(lossy->blob.size(), blob.size());
  auto parsed = ParseSeqState(lossy->blob);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->caches[1].streams[0].cells[0].pos, 268);
  EXPECT_EQ(parsed->seq_id, 2);
  ASSERT_TRUE(VerifyObject(store, "q").ok());
}

// The restore opens the object once: the header's engine state comes back in the restore's
// stats, the session is allocated from the header (source dtype, ragged layers) in between.
TEST(LlamaStateTest, RestoreOpensTheObjectOnce) {
  CacheSpec full{Range(0, 40), 2, 16, kGgmlF16, kGgmlF16, true, 0, 3};
  CacheSpec swa{Range(24, 40), 2, 16, kGgmlF16, kGgmlF16, true, 0, 8};
  const std::vector<uint8_t> blob = MakeBlob({full, swa}, true, 2);
  FaultInjectionStore store(std::make_unique<MemoryStore>());
  CheckpointOptions opts;
  opts.codec = *ParseCodecSpec("fp16");
  ASSERT_TRUE(CheckpointSeqState(blob, 16, "m", nullptr, opts, store, "s").ok());
  const uint64_t opens = store.counters().opens;
  auto back = RestoreSeqState(store, "s");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->blob, blob);
  EXPECT_EQ(store.counters().opens, opens + 1);

  // A session without an engine state: refused after that one open, before any allocation.
  auto plain = KvCacheBuffer::Allocate("m", ModelGeometry{2, 1, 16}, DType::kF16, 4);
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE(Checkpoint((*plain)->cache(), opts, store, "plain").ok());
  const uint64_t before = store.counters().opens;
  auto refused = RestoreSeqState(store, "plain");
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
  EXPECT_EQ(store.counters().opens, before + 1);

  // Any restore returns the engine state it stored.
  auto session = KvCacheBuffer::Allocate("m", ModelGeometry{2, 1, 16}, DType::kF16, 4);
  ASSERT_TRUE(session.ok());
  opts.engine_state = {1, 2, 3};
  ASSERT_TRUE(Checkpoint((*plain)->cache(), opts, store, "state").ok());
  RestoreStats st;
  ASSERT_TRUE(RestoreInto(store, "state", (*session)->cache(), RestoreOptions{}, &st).ok());
  EXPECT_EQ(st.engine_state, (std::vector<uint8_t>{1, 2, 3}));
}

TEST(LlamaStateTest, SlotFileFraming) {
  const std::vector<uint8_t> blob = MakeBlob({CacheSpec{Range(0, 3), 1, 4}});
  SlotFile slot{{101, 7, -1}, blob};
  const std::vector<uint8_t> file = SerializeSlotFile(slot);
  ASSERT_EQ(file.size(), 12 + 12 + blob.size());
  EXPECT_EQ(std::string(file.begin(), file.begin() + 4), "qsgg");  // 'ggsq' as a u32
  auto back = ParseSlotFile(file);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tokens, slot.tokens);
  EXPECT_EQ(back->state, blob);

  std::vector<uint8_t> bad = file;
  bad[0] ^= 1;
  EXPECT_TRUE(ParseSlotFile(bad).status().IsCorruption());
  EXPECT_NE(ParseSlotFile(bad).status().message().find("magic"), std::string::npos);
  bad = file;
  bad[4] = 2;
  EXPECT_EQ(ParseSlotFile(bad).status().code(), StatusCode::kUnsupported);
  bad = file;
  bad[8] = 0xFF;  // 65535 tokens: more than the file holds
  bad[9] = 0xFF;
  EXPECT_TRUE(ParseSlotFile(bad).status().IsCorruption());
  for (size_t n = 0; n < 24; ++n) {
    EXPECT_FALSE(ParseSlotFile(std::span<const uint8_t>(file.data(), n)).ok()) << n;
  }
}

TEST(LlamaStateTest, Fp16CheckpointRestoresTheSameBytesAndTokens) {
  CacheSpec full{Range(0, 40), 2, 32, kGgmlF16, kGgmlF16, true, 0, 3};
  CacheSpec swa{Range(20, 40), 3, 32, kGgmlF16, kGgmlF16, true, 0, 8};
  const std::vector<uint8_t> blob = MakeBlob({full, swa});
  const std::vector<int32_t> tokens = Range(1000, 1040);
  MemoryStore store;
  CheckpointOptions opts;
  opts.codec = *ParseCodecSpec("fp16");
  opts.token_block = 16;
  auto st = CheckpointSeqState(blob, 16, "m", &tokens, opts, store, "s");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  auto back = RestoreSeqState(store, "s");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->blob, blob);
  EXPECT_TRUE(back->has_tokens);
  EXPECT_EQ(back->tokens, tokens);

  // Lossy: same layout and cells, other values.
  opts.codec = *ParseCodecSpec("tq3");
  ASSERT_TRUE(CheckpointSeqState(blob, 16, "m", nullptr, opts, store, "q").ok());
  auto lossy = RestoreSeqState(store, "q");
  ASSERT_TRUE(lossy.ok()) << lossy.status().ToString();
  ASSERT_EQ(lossy->blob.size(), blob.size());
  EXPECT_NE(lossy->blob, blob);
  EXPECT_FALSE(lossy->has_tokens);
  auto parsed = ParseSeqState(lossy->blob);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->caches[1].streams[0].cells[0].pos, 20);
}

// Cells shared by 8 sequences were refused as "ambiguous" while 9 imported (issue 49, item 13):
// read with cell extensions, ids 0..7 happen to consume a pair of cells exactly. llama.cpp writes
// a cell's ids ascending; a reading that gives any cell ids out of order is no reading.
TEST(LlamaStateTest, CellsOfAnyNumberOfSequencesImport) {
  for (uint32_t seqs : {1u, 2u, 3u, 7u, 8u, 9u, 16u}) {
    SCOPED_TRACE(seqs);
    CacheSpec c{Range(0, 12), 2, 32, kGgmlF16, kGgmlF16, false, 0, 4, seqs};
    const std::vector<uint8_t> blob = MakeBlob({c});
    auto parsed = ParseSeqState(blob);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_FALSE(parsed->cell_ext);
    ASSERT_EQ(parsed->caches[0].streams[0].cells[5].seq_ids.size(), seqs);
    EXPECT_EQ(parsed->caches[0].streams[0].cells[5].seq_ids.back(), static_cast<int32_t>(seqs - 1));
    MemoryStore store;
    CheckpointOptions opts;
    opts.codec = *ParseCodecSpec("fp16");
    ASSERT_TRUE(CheckpointSeqState(blob, 16, "m", nullptr, opts, store, "s").ok());
    auto back = RestoreSeqState(store, "s");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->blob, blob);
  }
}

TEST(LlamaStateTest, SessionsWithoutEngineStateAndBadHeadDimAreRefused) {
  const std::vector<uint8_t> blob = MakeBlob({CacheSpec{Range(0, 3), 1, 12}});
  auto st = ParseSeqState(blob);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(ToSession(*st, 5, "m").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ToSession(*st, 0, "m").status().code(), StatusCode::kInvalidArgument);
  // An empty sequence (no cells) has nothing to store.
  const std::vector<uint8_t> empty = MakeBlob({CacheSpec{{}, 1, 12}});
  auto e = ParseSeqState(empty);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(SerializeSeqState(*e), empty);
  EXPECT_EQ(ToSession(*e, 4, "m").status().code(), StatusCode::kInvalidArgument);

  MemoryStore store;
  auto kv = KvCacheBuffer::Allocate("plain", {1, 1, 16}, DType::kF16, 4);
  ASSERT_TRUE(kv.ok());
  CheckpointOptions opts;
  opts.codec = *ParseCodecSpec("fp16");
  ASSERT_TRUE(Checkpoint((*kv)->cache(), opts, store, "plain").ok());
  auto r = RestoreSeqState(store, "plain");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a llama.cpp session"), std::string::npos);
}

TEST(LlamaStateTest, DamagedEngineStatesAreRefusedNeverMisread) {
  CacheSpec full{Range(0, 6), 1, 8, kGgmlF16, kGgmlF16, false, 0, 3};
  CacheSpec swa{Range(2, 6), 1, 8, kGgmlF16, kGgmlF16, false, 0, 4};
  auto st = ParseSeqState(MakeBlob({full, swa}));
  ASSERT_TRUE(st.ok());
  const std::vector<int32_t> tokens = Range(0, 6);
  auto session = ToSession(*st, 4, "m", &tokens);
  ASSERT_TRUE(session.ok());
  const std::vector<uint8_t>& es = session->engine_state;
  for (size_t n = 0; n < es.size(); ++n) {
    EXPECT_FALSE(FromSession(session->kv->cache(), std::span(es.data(), n)).ok()) << n;
  }
  // Every single flipped bit: refused, or accepted as another valid state (a position, token or
  // sequence id); never a crash or an out-of-range row.
  size_t refused = 0;
  for (size_t i = 0; i < es.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> bad = es;
      bad[i] ^= static_cast<uint8_t>(1 << bit);
      refused += FromSession(session->kv->cache(), bad).ok() ? 0 : 1;
    }
  }
  EXPECT_GT(refused, es.size());
}

// Issue 34: layout 2 stores runs of consecutive cells and derives each cell's row by the import
// rule (layout 1 stored a 4-byte row per cell), so a Gemma-3-like state (3 full-attention layers,
// 15 window layers of 256 cells, one head of 256 f16 per row) makes an fp16 object no larger
// than the state, and the engine state does not grow with the cells.
TEST(LlamaStateTest, Fp16ObjectOfAWindowedStateIsNoLargerThanTheState) {
  size_t engine_bytes[2] = {};
  for (int i = 0; i < 2; ++i) {
    const int32_t n = 1000 * (i + 1);
    SCOPED_TRACE(n);
    CacheSpec full{Range(0, n), 3, 256, kGgmlF16, kGgmlF16, false, 0, 3};
    CacheSpec swa{Range(n - 256, n), 15, 256, kGgmlF16, kGgmlF16, false, 0, 5};
    const std::vector<uint8_t> blob = MakeBlob({full, swa}, true, 0);
    auto st = ParseSeqState(blob);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    auto session = ToSession(*st, 256, "gemma-like");
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    engine_bytes[i] = session->engine_state.size();
    MemoryStore store;
    CheckpointOptions opts;
    opts.codec = *ParseCodecSpec("fp16");
    auto cp = CheckpointSeqState(blob, 256, "gemma-like", nullptr, opts, store, "g");
    ASSERT_TRUE(cp.ok()) << cp.status().ToString();
    EXPECT_LE(cp->bytes_written, blob.size());
    auto back = RestoreSeqState(store, "g");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->blob, blob);
  }
  EXPECT_EQ(engine_bytes[0], engine_bytes[1]);
}

// An engine state of layout 1 as docs/format.md §13 gives it (a row per cell), one stream per
// cache: what tqkv wrote before layout 2.
std::vector<uint8_t> EngineStateV1(const SeqState& st, const std::vector<uint32_t>& first_layer,
                                   const std::vector<std::vector<uint32_t>>& rows) {
  Blob o;
  o.Raw("llsq", 4);
  o.U32(1);
  const uint8_t flags[4] = {0, 0, static_cast<uint8_t>(st.io_header ? 1 : 0), 0};
  o.Raw(flags, 4);
  o.U32(static_cast<uint32_t>(st.io_header ? st.seq_id : 0));
  o.U32(0);  // no slot tokens
  o.U32(static_cast<uint32_t>(st.caches.size()));
  for (size_t c = 0; c < st.caches.size(); ++c) {
    const Stream& s = st.caches[c].streams.at(0);
    o.U32(1);
    o.U32(static_cast<uint32_t>(s.cells.size()));
    const uint8_t vt[4] = {static_cast<uint8_t>(s.v_trans ? 1 : 0), 0, 0, 0};
    o.Raw(vt, 4);
    o.U32(static_cast<uint32_t>(s.layers.size()));
    for (size_t l = 0; l < s.layers.size(); ++l) {
      o.U32(first_layer[c] + static_cast<uint32_t>(l));
      o.U32(static_cast<uint32_t>(s.layers[l].k_type));
      o.U32(static_cast<uint32_t>(s.layers[l].v_type));
    }
    for (size_t i = 0; i < s.cells.size(); ++i) {
      o.U32(static_cast<uint32_t>(s.cells[i].pos));
      o.U32(rows[c][i]);
      o.U32(1);
      o.U32(0);
    }
  }
  return o.b;
}

TEST(LlamaStateTest, LayoutOneEngineStatesStillExportByteForByte) {
  CacheSpec full{Range(0, 12), 2, 8, kGgmlF16, kGgmlF16, false, 0, 3};
  CacheSpec swa{{9, 10, 11, 7, 8}, 3, 8, kGgmlF16, kGgmlF16, true, 0, 5};
  const std::vector<uint8_t> blob = MakeBlob({full, swa}, true, 3);
  auto st = ParseSeqState(blob);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  auto session = ToSession(*st, 8, "ring");
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  // The rows import placed (the window's ranked by position), written the old way.
  const std::vector<uint8_t> v1 =
      EngineStateV1(*st, {0, 2}, {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {2, 3, 4, 0, 1}});
  EXPECT_GT(v1.size(), session->engine_state.size());
  MemoryStore store;
  CheckpointOptions opts;
  opts.codec = *ParseCodecSpec("fp16");
  opts.engine_state = v1;
  ASSERT_TRUE(Checkpoint(session->kv->cache(), opts, store, "old").ok());
  auto back = RestoreSeqState(store, "old");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->blob, blob);
  // A layout-1 row past the window's 5 tokens is still refused.
  auto bad = EngineStateV1(*st, {0, 2}, {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {2, 3, 5, 0, 1}});
  EXPECT_TRUE(FromSession(session->kv->cache(), bad).status().IsCorruption());
}

// Layout 2's counts are bounded by the session before anything is allocated: a cell count past
// the tokens its layers hold, a run count past the cells, a run past the cells, a run of many
// cells with many sequence ids.
TEST(LlamaStateTest, HugeEngineStateCountsAreRefusedBeforeAllocating) {
  auto st = ParseSeqState(MakeBlob({CacheSpec{Range(0, 6), 1, 8}}));
  ASSERT_TRUE(st.ok());
  auto session = ToSession(*st, 4, "m");
  ASSERT_TRUE(session.ok());
  const std::vector<uint8_t>& es = session->engine_state;
  // tag, version, flags, seq id, tokens (20); caches, streams, cells (28); v_trans, layers,
  // one layer (52); runs (52); run: position, length, sequence count, one id (56..72).
  ASSERT_EQ(es.size(), 72u);
  for (size_t at : {size_t{28}, size_t{52}, size_t{60}, size_t{64}}) {
    for (uint32_t v : {0xFFFFFFF0u, 9u}) {
      std::vector<uint8_t> bad = es;
      std::memcpy(bad.data() + at, &v, 4);
      auto r = FromSession(session->kv->cache(), bad);
      EXPECT_TRUE(r.status().IsCorruption()) << at << " " << v << ": " << r.status().ToString();
    }
  }
}

}  // namespace
}  // namespace tqkv::llama
