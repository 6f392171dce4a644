// SmolLM2-135M-Instruct (Q4_1 GGUF): metadata, geometry, tokenizer and a short greedy
// generation. Skipped when the file is absent: fetch it with scripts/fetch_smollm2.sh.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "model/engine.h"
#include "model/model.h"
#include "model_test_util.h"
#include "tqkv/simd.h"

namespace tqkv::model {
namespace {

class SmolLm2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = testing::SmolLm2Path();
    if (!testing::FileExists(path)) return;
    auto m = Model::Load(path);
    if (m.ok()) {
      model_ = std::move(m).value().release();
    } else {
      load_error_ = new std::string(m.status().ToString());
    }
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    delete load_error_;
    load_error_ = nullptr;
  }
  void SetUp() override {
    if (load_error_ != nullptr) FAIL() << *load_error_;
    if (model_ == nullptr) {
      GTEST_SKIP() << "SmolLM2 GGUF not found at " << testing::SmolLm2Path()
                   << "; run scripts/fetch_smollm2.sh (or set TQKV_SMOLLM2_GGUF)";
    }
  }
  static Model* model_;
  static std::string* load_error_;
};
Model* SmolLm2Test::model_ = nullptr;
std::string* SmolLm2Test::load_error_ = nullptr;

TEST_F(SmolLm2Test, MetadataAndGeometry) {
  const LlamaConfig& c = model_->config();
  EXPECT_EQ(c.n_layers, 30u);
  EXPECT_EQ(c.dim, 576u);
  EXPECT_EQ(c.n_heads, 9u);
  EXPECT_EQ(c.n_kv_heads, 3u);
  EXPECT_EQ(c.head_dim, 64u);
  EXPECT_EQ(c.rope_dim, 64u);
  EXPECT_EQ(c.hidden_dim, 1536u);
  EXPECT_EQ(c.vocab_size, 49152u);
  EXPECT_EQ(c.context_length, 8192u);
  EXPECT_FLOAT_EQ(c.rope_freq_base, 100000.0f);
  EXPECT_NEAR(c.norm_eps, 1e-5f, 1e-9f);
  EXPECT_EQ(c.rope_layout, RopeLayout::kInterleaved);
  EXPECT_EQ(model_->geometry(), (ModelGeometry{30, 3, 64}));
  EXPECT_EQ(model_->name(), "smollm2-135m");
  auto preset = FindModelPreset(model_->name());
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(preset->geometry, model_->geometry());
  EXPECT_TRUE(model_->weights().tied_output);
  EXPECT_EQ(model_->weights().token_embd.type, GgmlType::kQ8_0);
  EXPECT_EQ(model_->weights().layers[0].wq.type, GgmlType::kQ4_1);
  ASSERT_NE(model_->gguf(), nullptr);
  EXPECT_EQ(model_->gguf()->version(), 3u);
  EXPECT_EQ(model_->gguf()->tensors().size(), 272u);
}

TEST_F(SmolLm2Test, Tokenizer) {
  const Tokenizer* t = model_->tokenizer();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 49152u);
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  EXPECT_EQ(t->Piece(1), "<|im_start|>");
  EXPECT_FALSE(t->add_bos_default());
  // Common words are single tokens; the leading space belongs to the word (GPT-2 style).
  const auto hello = t->Encode("Hello world", false);
  ASSERT_EQ(hello.size(), 2u);
  EXPECT_EQ(t->Piece(hello[1]), "\xC4\xA0world");  // "Ġworld"
  // Digits are split one by one.
  EXPECT_EQ(t->Encode("2024", false).size(), 4u);
  // Special tokens only when asked.
  const auto chat = t->Encode("<|im_start|>user\nHi<|im_end|>", false, /*parse_special=*/true);
  ASSERT_GE(chat.size(), 4u);
  EXPECT_EQ(chat.front(), 1);
  EXPECT_EQ(chat.back(), 2);
  EXPECT_GT(t->Encode("<|im_start|>", false).size(), 1u);
  for (std::string s : {"The quick brown fox jumps over the lazy dog.", "  leading and trailing  ",
                        "tabs\tand\nnew\n\nlines", "It's 3.14159, isn't it?",
                        "caf\xC3\xA9 \xE2\x98\x95 "
                        "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
                        "<|im_start|>user\nHi<|im_end|>"}) {
    EXPECT_EQ(t->Decode(t->Encode(s, false)), s) << s;
    EXPECT_EQ(t->Decode(t->Encode(s, false, true)), s) << s;
  }
  // Bytes that never occur in UTF-8 (0xFE, 0xFF) have no byte token in this vocabulary: unknown.
  const auto bad = t->Encode("x\xFF\xFEy", false);
  ASSERT_EQ(bad.size(), 4u);
  EXPECT_EQ(bad[1], 0);
  // Pre-tokenizer: words keep their leading space, runs of spaces give all but the last.
  const auto words = BpeTokenizer::PreTokenize("Hello,  world 42 it's");
  const std::vector<std::string_view> expect = {"Hello", ",", " ",   " world", " ",
                                                "4",     "2", " it", "'s"};
  EXPECT_EQ(words, expect);
}

TEST_F(SmolLm2Test, GreedyGenerationIsPlausibleEnglish) {
  EngineOptions o;
  o.threads = 2;
  o.max_tokens = 512;
  auto e = LlamaEngine::Create(*model_, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const Tokenizer& t = *model_->tokenizer();
  const std::string prompt =
      "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
  const auto ids = t.Encode(prompt, false, true);
  auto out = GenerateGreedy(**e, ids, 12, t.eos_id());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const std::string text = t.Decode(*out);
  std::printf("SmolLM2 greedy: %s\n", text.c_str());
  EXPECT_NE(text.find("Paris"), std::string::npos) << text;
  // The answer's text tokenizes back to the model's own ids.
  EXPECT_EQ(t.Encode(text, false, /*parse_special=*/true), *out) << text;
  size_t letters = 0;
  for (char c : text) letters += std::isalpha(static_cast<unsigned char>(c)) ? 1 : 0;
  EXPECT_GT(letters, text.size() / 2) << text;
}

TEST_F(SmolLm2Test, ExportImportAndThreadsSimdLevelAreBitExact) {
  for (ActivationPrecision act : {ActivationPrecision::kQ8, ActivationPrecision::kF32}) {
    SCOPED_TRACE(ActivationPrecisionName(act));
    EngineOptions o;
    o.activations = act;
    o.threads = 2;
    o.max_tokens = 256;
    auto a = LlamaEngine::Create(*model_, o);
    auto b = LlamaEngine::Create(*model_, o);
    ASSERT_TRUE(a.ok() && b.ok());
    const auto ids = model_->tokenizer()->Encode("Once upon a time, in a small village,", false);
    auto la = (*a)->Prefill(ids);
    ASSERT_TRUE(la.ok());
    auto cache = (*a)->ExportCache();
    ASSERT_TRUE(cache.ok());
    EXPECT_EQ((*cache)->cache().model(), "smollm2-135m");
    ASSERT_TRUE((*b)->ImportCache((*cache)->cache()).ok());
    // One thread and the scalar kernels give the same bits as two threads with AVX2.
    {
      EngineOptions o1 = o;
      o1.threads = 1;
      o1.prefill_chunk = 5;
      ASSERT_TRUE(ForceSimdLevel(SimdLevel::kScalar).ok());
      auto c = LlamaEngine::Create(*model_, o1);
      ResetSimdLevel();
      ASSERT_TRUE(c.ok());
      auto lc = (*c)->Prefill(ids);
      ASSERT_TRUE(lc.ok());
      EXPECT_EQ(std::memcmp(la->data(), lc->data(), la->size() * sizeof(float)), 0);
    }
    int32_t next = ArgMax(*la);
    for (int i = 0; i < 3; ++i) {
      auto x = (*a)->Forward(next);
      auto y = (*b)->Forward(next);
      ASSERT_TRUE(x.ok() && y.ok());
      ASSERT_EQ(std::memcmp(x->data(), y->data(), x->size() * sizeof(float)), 0) << i;
      next = ArgMax(*x);
    }
  }
}

}  // namespace
}  // namespace tqkv::model

namespace tqkv::model {
namespace {

// Prefill speed (not a pass/fail check): TQKV_MODEL_BENCH=1 [TQKV_MODEL_BENCH_THREADS=2]
//   build-model/tests/tqkv_model_tests --gtest_filter='SmolLm2Test.BenchPrefill*'
TEST_F(SmolLm2Test, BenchPrefill2048) {
  const char* on = std::getenv("TQKV_MODEL_BENCH");
  if (on == nullptr || *on == '\0' || *on == '0') GTEST_SKIP() << "set TQKV_MODEL_BENCH=1 to run";
  size_t threads = 2;
  if (const char* t = std::getenv("TQKV_MODEL_BENCH_THREADS"))
    threads = std::strtoul(t, nullptr, 10);
  size_t n_tokens = 2048;
  if (const char* t = std::getenv("TQKV_MODEL_BENCH_TOKENS"))
    n_tokens = std::strtoul(t, nullptr, 10);
  n_tokens = std::clamp<size_t>(n_tokens, 1, 8000);
  const Tokenizer& tok = *model_->tokenizer();
  const std::string para =
      "The old lighthouse keeper climbed the spiral stairs every evening, counting the steps "
      "as his father had taught him. From the top he could see the whole bay: the fishing boats "
      "coming home, the gulls circling the harbour, and the long line of cliffs that turned gold "
      "in the last light of the day. He wrote down the weather in a thick notebook, 1,024 pages "
      "long, and he never missed a single night. ";
  std::vector<int32_t> ids;
  while (ids.size() < n_tokens) {
    auto more = tok.Encode(para, false);
    ids.insert(ids.end(), more.begin(), more.end());
  }
  ids.resize(n_tokens);
  EngineOptions o;
  o.threads = threads;
  o.max_tokens = static_cast<uint32_t>(n_tokens + 64);
  auto e = LlamaEngine::Create(*model_, o);
  ASSERT_TRUE(e.ok());
  const auto cpu_seconds = [] {
    struct rusage ru;
    ::getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
           1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  };
  const double c0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  auto logits = (*e)->Prefill(ids);
  const auto t1 = std::chrono::steady_clock::now();
  const double c1 = cpu_seconds();
  ASSERT_TRUE(logits.ok());
  int32_t next = ArgMax(*logits);
  const int kDecode = 16;
  for (int i = 0; i < kDecode; ++i) {
    auto l = (*e)->Forward(next);
    ASSERT_TRUE(l.ok());
    next = ArgMax(*l);
  }
  const auto t2 = std::chrono::steady_clock::now();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf(
      "SmolLM2-135M Q4_1 prefill of %zu tokens on %zu threads (%s): %.2f s = %.1f tok/s; "
      "prefill CPU time %.2f s; decode after it: %.1f ms/token\n",
      ids.size(), threads, std::string(SimdLevelName((*e)->simd_level())).c_str(), prefill_s,
      ids.size() / prefill_s, c1 - c0, 1000.0 * decode_s / kDecode);
}

}  // namespace
}  // namespace tqkv::model
