// The engine on stories260K (llama2.c checkpoint): greedy reference ids, batched prefill vs
// token-by-token, KV cache export/import, determinism, tokenizer, corrupt files, and the same
// model written as GGUF (f32 bit-exact with the .bin path, quantized types, half-split RoPE).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "model/engine.h"
#include "model/model.h"
#include "model_test_util.h"
#include "stories_converter.h"
#include "tqkv/simd.h"

namespace tqkv::model {
namespace {

using testing::StoriesBin;
using testing::TempPath;

const std::vector<int32_t> kReferenceIds = {403, 407, 261, 378, 432, 383, 286, 261,
                                            376, 298, 315, 421, 395, 317, 426, 338,
                                            401, 396, 267, 337, 410, 408, 419, 292};

std::unique_ptr<Model> LoadStories() {
  auto m = Model::Load(StoriesBin());
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<LlamaEngine> MakeEngine(const Model& m, EngineOptions o = {}) {
  if (o.threads == 0 && o.pool == nullptr) o.threads = 2;
  auto e = LlamaEngine::Create(m, o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<int32_t> Prompt() {  // BOS + the reference continuation
  std::vector<int32_t> p = {1};
  p.insert(p.end(), kReferenceIds.begin(), kReferenceIds.end());
  return p;
}

TEST(StoriesTest, LoadsGeometry) {
  TQKV_REQUIRE_STORIES();
  auto m = LoadStories();
  ASSERT_NE(m, nullptr);
  const LlamaConfig& c = m->config();
  EXPECT_EQ(c.dim, 64u);
  EXPECT_EQ(c.hidden_dim, 172u);
  EXPECT_EQ(c.n_layers, 5u);
  EXPECT_EQ(c.n_heads, 8u);
  EXPECT_EQ(c.n_kv_heads, 4u);
  EXPECT_EQ(c.head_dim, 8u);
  EXPECT_EQ(c.vocab_size, 512u);
  EXPECT_EQ(c.context_length, 512u);
  EXPECT_TRUE(m->weights().tied_output);
  EXPECT_EQ(m->format(), ModelFormat::kLlama2c);
  EXPECT_EQ(m->name(), "stories260K");
  EXPECT_EQ(m->geometry(), (ModelGeometry{5, 4, 8}));
  ASSERT_NE(m->tokenizer(), nullptr);
  EXPECT_EQ(m->tokenizer()->vocab_size(), 512u);
}

TEST(StoriesTest, GreedyFromBosReproducesReferenceIds) {
  TQKV_REQUIRE_STORIES();
  auto m = LoadStories();
  ASSERT_NE(m, nullptr);
  auto e = MakeEngine(*m);
  const int32_t bos = 1;
  auto ids = GenerateGreedy(*e, std::span<const int32_t>(&bos, 1), 24);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(*ids, kReferenceIds);
  EXPECT_EQ(e->position(), 24u);  // BOS + 23 fed back; the 24th id is not yet in the cache
  const std::string text = m->tokenizer()->Decode(*ids);
  EXPECT_EQ(
      text.rfind("Once upon a time, there was a little girl named Lily. She loved to play", 0), 0u)
      << text;
}

TEST(StoriesTest, PrefillEqualsTokenByToken) {
  TQKV_REQUIRE_STORIES();
  auto m = LoadStories();
  ASSERT_NE(m, nullptr);
  const auto prompt = Prompt();
  for (uint32_t chunk : {256u, 7u, 1u}) {
    EngineOptions o;
    o.prefill_chunk = chunk;
    auto a = MakeEngine(*m, o);
    auto b = MakeEngine(*m);
    auto la = a->Prefill(prompt);
    ASSERT_TRUE(la.ok()) << la.status().ToString();
    std::vector<float> lb;
    for (int32_t t : prompt) {
      auto r = b->Forward(t);
      ASSERT_TRUE(r.ok());
      lb = *r;
    }
    EXPECT_TRUE(BitEqual(*la, lb)) << "chunk " << chunk;
    EXPECT_EQ(a->position(), prompt.size());
    // The caches agree bit for bit, and so does the continuation.
    const KvCache ca = a->CacheView(), cb = b->CacheView();
    for (uint32_t l = 0; l < 5; ++l) {
      EXPECT_EQ(std::memcmp(ca.k(l), cb.k(l), ca.tensor_bytes()), 0) << l;
      EXPECT_EQ(std::memcmp(ca.v(l), cb.v(l), ca.tensor_bytes()), 0) << l;
    }
    auto na = a->Forward(ArgMax(*la));
    auto nb = b->Forward(ArgMax(lb));
    ASSERT_TRUE(na.ok() && nb.ok());
    EXPECT_TRUE(BitEqual(*na, *nb));
  }
}

TEST(StoriesTest, ExportedCacheContinuesBitExactInFreshEngine) {
  TQKV_REQUIRE_STORIES();
  auto m = LoadStories();
  ASSERT_NE(m, nullptr);
  auto a = MakeEngine(*m);
  const auto prompt = Prompt();
  auto la = a->Prefill(prompt);
  ASSERT_TRUE(la.ok());
  auto exported = a->ExportCache();
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  const KvCache& cache = (*exported)->cache();
  EXPECT_EQ(cache.tokens(), prompt.size());
  EXPECT_EQ(cache.dtype(), DType::kF16);
  EXPECT_EQ(cache.geometry(), m->geometry());
  EXPECT_EQ(cache.model(), "stories260K");

  auto b = MakeEngine(*m);
  ASSERT_TRUE(b->ImportCache(cache).ok());
  EXPECT_EQ(b->position(), prompt.size());
  int32_t next = ArgMax(*la);
  for (int step = 0; step < 8; ++step) {
    auto na = a->Forward(next);
    auto nb = b->Forward(next);
    ASSERT_TRUE(na.ok() && nb.ok());
    ASSERT_TRUE(BitEqual(*na, *nb)) << "step " << step;
    next = ArgMax(*na);
  }

  // An f32 copy of the cache (exact widening) restores the same state.
  auto wide = KvCacheBuffer::Allocate("stories260K", m->geometry(), DType::kF32, cache.tokens());
  ASSERT_TRUE(wide.ok());
  const size_t elems = cache.tokens() * m->geometry().token_elems();
  for (uint32_t l = 0; l < 5; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (size_t i = 0; i < elems; ++i) {
        StoreFromFloat((*wide)->cache().tensor(l, kv), DType::kF32, i,
                       LoadAsFloat(cache.tensor(l, kv), DType::kF16, i));
      }
    }
  }
  auto c = MakeEngine(*m);
  auto d = MakeEngine(*m);
  ASSERT_TRUE(c->ImportCache((*wide)->cache()).ok());
  ASSERT_TRUE(d->ImportCache(cache).ok());
  auto nc = c->Forward(5);
  auto nd = d->Forward(5);
  ASSERT_TRUE(nc.ok() && nd.ok());
  EXPECT_TRUE(BitEqual(*nc, *nd));
}

TEST(StoriesTest, ImportRejectsMismatchedCaches) {
  TQKV_REQUIRE_STORIES();
  auto m = LoadStories();
  ASSERT_NE(m, nullptr);
  auto e = MakeEngine(*m);
  auto wrong = KvCacheBuffer::Allocate("x", ModelGeometry{5, 2, 8}, DType::kF16, 3);
  ASSERT_TRUE(wrong.ok());
  EXPECT_FALSE(e->ImportCache((*wrong)->cache()).ok());
  auto too_long = KvCacheBuffer::Allocate("x", m->geometry(), DType::kF16, 513);
  ASSERT_TRUE(too_long.ok());
  EXPECT_FALSE(e->ImportCache((*too_long)->cache()).ok());
  KvCache unset("x", m->geometry(), DType::kF16, 4);  // no tensors set
  EXPECT_FALSE(e->ImportCache(unset).ok());
  EXPECT_EQ(e->position(), 0u);
}

TEST(StoriesTest, LogitsIndependentOfThreadsAndSimdLevel) {
  TQKV_REQUIRE_STORIES();
  auto m = LoadStories();
  ASSERT_NE(m, nullptr);
  const auto prompt = Prompt();
  std::vector<std::vector<float>> results;
  for (SimdLevel level : SupportedSimdLevels()) {
    ASSERT_TRUE(ForceSimdLevel(level).ok());
    for (size_t threads : {1u, 2u, 5u}) {
      EngineOptions o;
      o.threads = threads;
      auto e = MakeEngine(*m, o);
      // The model kernels have no AVX-512 table: that level runs the AVX2 one.
      EXPECT_EQ(e->simd_level(), level == SimdLevel::kAvx512 ? SimdLevel::kAvx2 : level);
      auto l = e->Prefill(prompt);
      ASSERT_TRUE(l.ok());
      results.push_back(*l);
    }
  }
  ResetSimdLevel();
  for (size_t i = 1; i < results.size(); ++i) EXPECT_TRUE(BitEqual(results[0], results[i])) << i;
}

TEST(StoriesTest, EngineRejectsBadInput) {
  TQKV_REQUIRE_STORIES();
  auto m = LoadStories();
  ASSERT_NE(m, nullptr);
  EngineOptions o;
  o.max_tokens = 8;
  auto e = MakeEngine(*m, o);
  EXPECT_FALSE(e->Prefill({}).ok());
  EXPECT_FALSE(e->Forward(512).ok());
  EXPECT_FALSE(e->Forward(-1).ok());
  std::vector<int32_t> nine(9, 5);
  EXPECT_FALSE(e->Prefill(nine).ok());
  EXPECT_EQ(e->position(), 0u);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(e->Forward(5).ok());
  EXPECT_FALSE(e->Forward(5).ok());
  e->Reset();
  EXPECT_TRUE(e->Forward(5).ok());
}

TEST(StoriesTest, TokenizerRoundTripsAndMatchesModel) {
  TQKV_REQUIRE_STORIES();
  auto m = LoadStories();
  ASSERT_NE(m, nullptr);
  const Tokenizer& t = *m->tokenizer();
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  // The model's own greedy text tokenizes back to the model's ids.
  const std::string text = t.Decode(kReferenceIds);
  auto ids = t.Encode(text, /*add_bos=*/true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()), kReferenceIds);
  for (std::string s : {"Once upon a time", "Lily and Ben went to the park.", "a", "  two  spaces",
                        "caf\xC3\xA9 \xE2\x98\x95 na\xC3\xAFve", "tab\tand\nnewline", "Zzq~^|"}) {
    const auto e = t.Encode(s, false);
    EXPECT_EQ(t.Decode(e), s) << s;
    for (int32_t id : e) EXPECT_LT(static_cast<size_t>(id), t.vocab_size());
  }
  // Byte fallback: a character missing from the 512-token vocabulary becomes its UTF-8 bytes.
  const auto e = t.Encode("\xE2\x98\x95", false);
  ASSERT_GE(e.size(), 3u);
  EXPECT_EQ(e[e.size() - 3], 0xE2 + 3);
  EXPECT_TRUE(t.Encode("", false).empty());
  EXPECT_EQ(t.Encode("", true), std::vector<int32_t>{1});
}

TEST(StoriesTest, TruncatedOrCorruptCheckpointFailsCleanly) {
  TQKV_REQUIRE_STORIES();
  const std::string bytes = testing::ReadFile(StoriesBin());
  ASSERT_EQ(bytes.size(), 1056540u);
  const std::string path = TempPath("stories_bad.bin");
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 64; ++n) lengths.push_back(n);
  for (size_t n = 65; n < bytes.size(); n += 4099) lengths.push_back(n);
  lengths.push_back(bytes.size() - 1);
  for (size_t n : lengths) {
    testing::WriteFile(path, bytes.substr(0, n));
    auto m = Model::Load(path);
    EXPECT_FALSE(m.ok()) << "length " << n;
  }
  testing::WriteFile(path, bytes + "x");
  EXPECT_FALSE(Model::Load(path).ok());
  // Header fields: zero, negative, huge, inconsistent.
  const std::vector<std::pair<int, int32_t>> flips = {
      {0, 0},       {0, -64},       {0, 1 << 30}, {0, 63}, {1, 0},  {1, 1 << 30}, {2, 0},
      {2, 1 << 20}, {3, 0},         {3, 7},       {3, 65}, {4, 0},  {4, 3},       {4, 16},
      {5, 0},       {5, INT32_MIN}, {5, 1 << 30}, {6, 0},  {6, -1}, {6, 1 << 30}, {5, -512}};
  for (const auto& [field, value] : flips) {
    std::string b = bytes;
    std::memcpy(b.data() + 4 * field, &value, 4);
    testing::WriteFile(path, b);
    auto m = Model::Load(path);
    EXPECT_FALSE(m.ok()) << "field " << field << " = " << value;
    if (!m.ok()) {
      EXPECT_TRUE(m.status().IsCorruption()) << m.status().ToString();
    }
  }
  EXPECT_TRUE(Model::Load("/nonexistent/stories.bin").status().IsNotFound());
  std::remove(path.c_str());
}

TEST(StoriesTest, SeparateClassifierCheckpoint) {
  TQKV_REQUIRE_STORIES();
  // Negative vocab_size: a classifier follows the weights. Use a copy of the embedding, so the
  // logits must equal the tied model's bit for bit.
  std::string bytes = testing::ReadFile(StoriesBin());
  const int32_t neg_vocab = -512;
  std::memcpy(bytes.data() + 5 * 4, &neg_vocab, 4);
  bytes += testing::ReadFile(StoriesBin()).substr(28, 512 * 64 * 4);
  const std::string path = TempPath("stories_sep.bin");
  testing::WriteFile(path, bytes);
  ModelLoadOptions o;
  o.tokenizer_path = testing::StoriesTok();
  auto sep = Model::Load(path, o);
  std::remove(path.c_str());
  ASSERT_TRUE(sep.ok()) << sep.status().ToString();
  EXPECT_FALSE((*sep)->weights().tied_output);
  EXPECT_NE((*sep)->weights().output.data, (*sep)->weights().token_embd.data);
  ASSERT_NE((*sep)->tokenizer(), nullptr);
  auto m = LoadStories();
  ASSERT_NE(m, nullptr);
  auto a = MakeEngine(*m);
  auto b = MakeEngine(**sep);
  auto la = a->Prefill(Prompt());
  auto lb = b->Prefill(Prompt());
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_TRUE(BitEqual(*la, *lb));
}

TEST(StoriesTest, TruncatedTokenizerFails) {
  TQKV_REQUIRE_STORIES();
  const std::string bytes = testing::ReadFile(testing::StoriesTok());
  const std::string path = TempPath("tok_bad.bin");
  for (size_t n = 0; n < bytes.size(); n += (n < 64 ? 1 : 97)) {
    testing::WriteFile(path, bytes.substr(0, n));
    EXPECT_FALSE(ScoreTokenizer::LoadLlama2c(path, 512).ok()) << n;
  }
  ModelLoadOptions o;
  o.tokenizer_path = path;
  EXPECT_FALSE(Model::Load(StoriesBin(), o).ok());
  std::remove(path.c_str());
}

// ---- the same model written as GGUF ----

std::unique_ptr<Model> LoadConverted(const Model& m, const testing::ConvertOptions& o,
                                     const std::string& name) {
  const std::string path = TempPath(name);
  testing::WriteFile(path, testing::StoriesAsGguf(m, o));
  auto g = Model::Load(path);
  std::remove(path.c_str());  // the mapping stays valid
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? std::move(g).value() : nullptr;
}

TEST(StoriesGgufTest, F32GgufMatchesCheckpointBitExact) {
  TQKV_REQUIRE_STORIES();
  auto m = LoadStories();
  ASSERT_NE(m, nullptr);
  testing::ConvertOptions o;
  auto g = LoadConverted(*m, o, "stories_f32.gguf");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->format(), ModelFormat::kGguf);
  EXPECT_EQ(g->name(), "stories-260k");
  EXPECT_EQ(g->geometry(), m->geometry());
  EXPECT_EQ(g->config().hidden_dim, 172u);
  EXPECT_TRUE(g->weights().tied_output);
  EXPECT_EQ(g->config().rope_layout, RopeLayout::kInterleaved);
  auto a = MakeEngine(*m);
  auto b = MakeEngine(*g);
  const auto prompt = Prompt();
  auto la = a->Prefill(prompt);
  auto lb = b->Prefill(prompt);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_TRUE(BitEqual(*la, *lb));
  // The GGUF SentencePiece tokenizer (U+2581 spaces) agrees with the llama2.c one.
  ASSERT_NE(g->tokenizer(), nullptr);
  for (std::string s :
       {"Once upon a time, there was a little girl named Lily.", "  x  y ", "caf\xC3\xA9!"}) {
    EXPECT_EQ(g->tokenizer()->Encode(s, true), m->tokenizer()->Encode(s, true)) << s;
    EXPECT_EQ(g->tokenizer()->Decode(g->tokenizer()->Encode(s, true)), s);
  }
  // A separate classifier (output.weight) gives the same logits too.
  o.separate_output = true;
  auto s = LoadConverted(*m, o, "stories_sep.gguf");
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->weights().tied_output);
  auto c = MakeEngine(*s);
  auto lc = c->Prefill(prompt);
  ASSERT_TRUE(lc.ok());
  EXPECT_TRUE(BitEqual(*la, *lc));
}

TEST(StoriesGgufTest, QuantizedGgufsRunAndStayClose) {
  TQKV_REQUIRE_STORIES();
  auto m = LoadStories();
  ASSERT_NE(m, nullptr);
  auto ref = MakeEngine(*m);
  const auto prompt = Prompt();
  auto lref = ref->Prefill(prompt);
  ASSERT_TRUE(lref.ok());
  for (GgmlType type :
       {GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    testing::ConvertOptions o;
    o.type = type;
    auto g = LoadConverted(*m, o, "stories_q.gguf");
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->weights().layers[0].wq.type, type);
    auto e = MakeEngine(*g);
    auto l = e->Prefill(prompt);
    ASSERT_TRUE(l.ok());
    double num = 0, den = 0;
    for (size_t i = 0; i < l->size(); ++i) {
      ASSERT_TRUE(std::isfinite((*l)[i]));
      num += ((*l)[i] - (*lref)[i]) * ((*l)[i] - (*lref)[i]);
      den += (*lref)[i] * (*lref)[i];
    }
    const double rel = std::sqrt(num / den);
    const double bound = (type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1) ? 0.35 : 0.05;
    EXPECT_LT(rel, bound) << GgmlTraits(type).name;
    // Quantized weights also keep prefill == token-by-token.
    auto t = MakeEngine(*g);
    std::vector<float> lt;
    for (int32_t id : prompt) lt = *t->Forward(id);
    EXPECT_TRUE(BitEqual(*l, lt)) << GgmlTraits(type).name;
  }
}

TEST(StoriesGgufTest, HalfSplitRopeLayoutMatchesInterleaved) {
  TQKV_REQUIRE_STORIES();
  auto m = LoadStories();
  ASSERT_NE(m, nullptr);
  testing::ConvertOptions o;
  o.half_split = true;
  auto g = LoadConverted(*m, o, "stories_hf.gguf");
  ASSERT_NE(g, nullptr);
  EngineOptions eo;
  eo.rope_layout = RopeLayout::kHalfSplit;
  auto e = MakeEngine(*g, eo);
  EXPECT_EQ(e->config().rope_layout, RopeLayout::kHalfSplit);
  const int32_t bos = 1;
  auto ids = GenerateGreedy(*e, std::span<const int32_t>(&bos, 1), 24);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, kReferenceIds);
  // With the wrong layout the permuted model is a different function.
  auto wrong = MakeEngine(*g);
  auto a = wrong->Prefill(Prompt());
  auto r = MakeEngine(*m);
  auto b = r->Prefill(Prompt());
  ASSERT_TRUE(a.ok() && b.ok());
  double diff = 0;
  for (size_t i = 0; i < a->size(); ++i)
    diff = std::max(diff, std::fabs(double((*a)[i]) - (*b)[i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(StoriesGgufTest, TruncatedOrCorruptGgufFailsCleanly) {
  TQKV_REQUIRE_STORIES();
  auto m = LoadStories();
  ASSERT_NE(m, nullptr);
  testing::ConvertOptions o;
  o.type = GgmlType::kQ4_1;
  const std::string bytes = testing::StoriesAsGguf(*m, o);
  const std::string path = TempPath("stories_bad.gguf");
  {
    testing::WriteFile(path, bytes);
    ASSERT_TRUE(Model::Load(path).ok());
  }
  std::vector<size_t> lengths;
  for (size_t n = 0; n < 512; ++n) lengths.push_back(n);
  for (size_t n = 512; n < bytes.size(); n += 4093) lengths.push_back(n);
  lengths.push_back(bytes.size() - 1);
  for (size_t n : lengths) {
    testing::WriteFile(path, bytes.substr(0, n));
    auto g = Model::Load(path);
    EXPECT_FALSE(g.ok()) << "length " << n;
  }
  // Header fields: version, counts.
  auto patch = [&](size_t off, uint64_t v, size_t width) {
    std::string b = bytes;
    std::memcpy(b.data() + off, &v, width);
    testing::WriteFile(path, b);
    return Model::Load(path);
  };
  EXPECT_EQ(patch(4, 1, 4).status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(patch(4, 4, 4).status().code(), StatusCode::kUnsupported);
  EXPECT_TRUE(patch(8, uint64_t{1} << 60, 8).status().IsCorruption());   // tensor count
  EXPECT_TRUE(patch(16, uint64_t{1} << 60, 8).status().IsCorruption());  // kv count
  EXPECT_FALSE(patch(8, 0, 8).ok());                                     // no tensors
  EXPECT_TRUE(patch(24, uint64_t{1} << 62, 8).status().IsCorruption());  // first key length
  EXPECT_TRUE(patch(0, 0x46554746, 4).status().IsCorruption());          // magic
  // Flip every byte of the metadata region: must never crash (many flips stay valid).
  size_t failures = 0;
  for (size_t off = 0; off < 4000 && off < bytes.size(); off += 3) {
    std::string b = bytes;
    b[off] = static_cast<char>(b[off] ^ 0xFF);
    testing::WriteFile(path, b);
    failures += Model::Load(path).ok() ? 0 : 1;
  }
  EXPECT_GT(failures, 50u);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tqkv::model
