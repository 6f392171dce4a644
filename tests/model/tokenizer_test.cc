// Tokenizers without the big models: the GPT-2 pre-tokenizer, and a small byte-level BPE
// vocabulary written as GGUF metadata.
#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model_test_util.h"

namespace tqkv::model {
namespace {

using Words = std::vector<std::string_view>;

TEST(PreTokenizeTest, SplitsLikeGpt2WithIsolatedDigits) {
  EXPECT_EQ(BpeTokenizer::PreTokenize("Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(BpeTokenizer::PreTokenize("Hello,  world 42 it's"),
            (Words{"Hello", ",", " ", " world", " ", "4", "2", " it", "'s"}));
  EXPECT_EQ(BpeTokenizer::PreTokenize("a\n\nb"), (Words{"a", "\n", "\n", "b"}));
  EXPECT_EQ(BpeTokenizer::PreTokenize("x   "), (Words{"x", "   "}));
  EXPECT_EQ(BpeTokenizer::PreTokenize("we're  ...ok!?"),
            (Words{"we", "'re", " ", " ...", "ok", "!?"}));
  EXPECT_EQ(BpeTokenizer::PreTokenize("x3.14"), (Words{"x", "3", ".", "1", "4"}));
  EXPECT_EQ(BpeTokenizer::PreTokenize("caf\xC3\xA9 na\xC3\xAFve"),
            (Words{"caf\xC3\xA9", " na\xC3\xAFve"}));
  EXPECT_EQ(BpeTokenizer::PreTokenize("\xE6\x97\xA5\xE6\x9C\xAC \xE2\x82\xAC"
                                      "5"),
            (Words{"\xE6\x97\xA5\xE6\x9C\xAC", " \xE2\x82\xAC", "5"}));
  EXPECT_TRUE(BpeTokenizer::PreTokenize("").empty());
  // Pieces always cover the input exactly, even for invalid UTF-8.
  for (std::string s : {std::string("a\xFF\xC3 b\x80"), std::string("\t \n x"), std::string(" ")}) {
    std::string joined;
    for (auto w : BpeTokenizer::PreTokenize(s)) joined += w;
    EXPECT_EQ(joined, s);
  }
}

// GPT-2 byte -> printable code point, UTF-8 encoded.
std::string ByteChar(uint8_t b) {
  uint32_t cp = b;
  if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

TEST(BpeTokenizerTest, MergesByRankAndRoundTrips) {
  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (int b = 0; b < 256; ++b) tokens.push_back(ByteChar(static_cast<uint8_t>(b)));
  const std::string sp = ByteChar(' ');  // "Ġ"
  // Merges, best first: "l l", "Ġ w", "h e", "he ll", "hell o".
  const std::vector<std::string> merges = {"l l", sp + " w", "h e", "he ll", "hell o"};
  for (const std::string& m : {std::string("ll"), sp + "w", std::string("he"), std::string("hell"),
                               std::string("hello")}) {
    tokens.push_back(m);
  }
  std::vector<int32_t> types(tokens.size(), 1);
  types[0] = types[1] = types[2] = 3;
  testing::GgufBuilder g;
  g.KvStr("tokenizer.ggml.model", "gpt2");
  g.KvStr("tokenizer.ggml.pre", "smollm");
  g.KvStrArray("tokenizer.ggml.tokens", tokens);
  g.KvArray<int32_t>("tokenizer.ggml.token_type", GgufValueType::kInt32, types);
  g.KvStrArray("tokenizer.ggml.merges", merges);
  g.KvU32("tokenizer.ggml.bos_token_id", 1);
  g.KvU32("tokenizer.ggml.eos_token_id", 2);
  g.KvBool("tokenizer.ggml.add_bos_token", false);
  const std::string path = testing::TempPath("bpe.gguf");
  testing::WriteFile(path, g.Build());
  auto file = GgufFile::Open(path);
  std::remove(path.c_str());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto tok = TokenizerFromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const Tokenizer& t = **tok;
  const int32_t kHello = 259 + 4, kSpW = 259 + 1;
  const auto ids = t.Encode("hello world", /*add_bos=*/true);
  // BOS, "hello", "Ġw", "o", "r", "l", "d"
  const std::vector<int32_t> expect = {1, kHello, kSpW, 3 + 'o', 3 + 'r', 3 + 'l', 3 + 'd'};
  EXPECT_EQ(ids, expect);
  EXPECT_EQ(t.Decode(ids), "<|im_start|>hello world");
  EXPECT_EQ(t.Encode("<|im_end|>", false, true), std::vector<int32_t>{2});
  EXPECT_GT(t.Encode("<|im_end|>", false, false).size(), 1u);
  for (std::string s : {"hello hello\n\tworld 1234", "caf\xC3\xA9 \xF0\x9F\x99\x82", "", " "}) {
    EXPECT_EQ(t.Decode(t.Encode(s, false)), s) << s;
  }
  EXPECT_FALSE(t.add_bos_default());
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);

  // Broken metadata: bos id out of range; merges not strings.
  testing::GgufBuilder bad;
  bad.KvStr("tokenizer.ggml.model", "gpt2");
  bad.KvStrArray("tokenizer.ggml.tokens", tokens);
  bad.KvStrArray("tokenizer.ggml.merges", merges);
  bad.KvU32("tokenizer.ggml.bos_token_id", 100000);
  testing::WriteFile(path, bad.Build());
  auto bf = GgufFile::Open(path);
  ASSERT_TRUE(bf.ok());
  EXPECT_TRUE(TokenizerFromGguf(**bf).status().IsCorruption());
  testing::GgufBuilder bad2;
  bad2.KvStr("tokenizer.ggml.model", "gpt2");
  bad2.KvStrArray("tokenizer.ggml.tokens", tokens);
  bad2.KvArray<int32_t>("tokenizer.ggml.merges", GgufValueType::kInt32, {1, 2});
  testing::WriteFile(path, bad2.Build());
  auto bf2 = GgufFile::Open(path);
  ASSERT_TRUE(bf2.ok());
  EXPECT_TRUE(TokenizerFromGguf(**bf2).status().IsCorruption());
  testing::GgufBuilder bad3;
  bad3.KvStr("tokenizer.ggml.model", "wordpiece");
  testing::WriteFile(path, bad3.Build());
  auto bf3 = GgufFile::Open(path);
  ASSERT_TRUE(bf3.ok());
  EXPECT_EQ(TokenizerFromGguf(**bf3).status().code(), StatusCode::kUnsupported);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tqkv::model
