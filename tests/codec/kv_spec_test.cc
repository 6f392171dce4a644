// K/V codec specs: the kAvB preset family, the general k:SPEC/v:SPEC form, labels and errors.
#include <gtest/gtest.h>

#include <string>

#include "tqkv/codec.h"

namespace tqkv {
namespace {

KvCodecSpec Parse(const std::string& s) {
  auto r = ParseKvCodecSpec(s);
  EXPECT_TRUE(r.ok()) << s << ": " << r.status().ToString();
  return r.ok() ? *r : KvCodecSpec{};
}

CodecSpec Plain(const std::string& s) { return *ParseCodecSpec(s); }

TEST(KvCodecSpec, PresetFamilyIsTwoTurboQuantPresets) {
  for (const char* k : {"1", "2", "3", "4", "8", "2.5", "3.5"}) {
    for (const char* v : {"1", "2", "3", "4", "8", "2.5", "3.5"}) {
      const std::string text = std::string("k") + k + "v" + v;
      const KvCodecSpec s = Parse(text);
      EXPECT_EQ(s.k, Plain(std::string("tq") + k)) << text;
      EXPECT_EQ(s.v, Plain(std::string("tq") + v)) << text;
      // Prints back as written, or as the plain preset when K and V agree.
      EXPECT_EQ(FormatKvCodecSpec(s), std::string(k) == v ? std::string("tq") + k : text);
    }
  }
}

TEST(KvCodecSpec, PlainSpecsServeBothTensors) {
  for (const char* text : {"tq3", "fp16", "tq2.5,norm=f16", "tq:b=2,split=1/4@4,rot=hd2"}) {
    const KvCodecSpec s = Parse(text);
    EXPECT_TRUE(s.same()) << text;
    EXPECT_EQ(s.k, Plain(text));
    EXPECT_EQ(FormatKvCodecSpec(s), FormatCodecSpec(Plain(text)));
  }
}

TEST(KvCodecSpec, GeneralFormTakesAnyPlainSpecs) {
  KvCodecSpec s = Parse("k:tq4,norm=f16/v:tq2");
  EXPECT_EQ(s.k, Plain("tq4,norm=f16"));
  EXPECT_EQ(s.v, Plain("tq2"));
  EXPECT_EQ(FormatKvCodecSpec(s), "k:tq4,norm=f16/v:tq2");
  // '/' inside a split fraction does not end the K part.
  s = Parse("k:tq:b=2,split=1/8@4/v:fp16");
  EXPECT_EQ(s.k, Plain("tq2,split=1/8@4"));
  EXPECT_EQ(s.v, Plain("fp16"));
  EXPECT_EQ(FormatKvCodecSpec(s), "k:tq2,split=1/8@4/v:fp16");
  EXPECT_EQ(FormatKvCodecSpec(Parse("k:tq:b=2,split=1/4@4/v:fp16")), "k:tq2.5/v:fp16");
  // Presets in the general form print as the family.
  EXPECT_EQ(FormatKvCodecSpec(Parse("k:tq3.5/v:tq2.5")), "k3.5v2.5");
  EXPECT_EQ(FormatKvCodecSpec(Parse("k:tq4/v:tq4")), "tq4");
  // Every printed form parses back to the same specs.
  for (const char* text : {"k4v2", "k:fp16/v:tq3", "k:tq3,qjl=1/v:tq3", "k:tq4,seed=7/v:tq4"}) {
    const KvCodecSpec a = Parse(text);
    EXPECT_EQ(Parse(FormatKvCodecSpec(a)), a) << text;
  }
}

TEST(KvCodecSpec, BadSpecsSayWhy) {
  const struct {
    const char* spec;
    const char* says;
  } cases[] = {
      {"k4", "kAvB"},
      {"k4v", "V bits"},
      {"kv2", "K bits"},
      {"k9v2", "K"},
      {"k4v2.7", "V"},
      {"k4v2,norm=f16", "V bits"},
      {"ktq4vtq2", "K bits"},
      {"k:tq4", "/v:SPEC"},
      {"k:/v:tq2", "empty K"},
      {"k:tq4/v:", "empty V"},
      {"k:tq4/v:tq9", "V: codec spec 'tq9'"},
      {"k:k4v2/v:tq2", "K: codec spec"},
      {"k:tq4/v:tq2/v:tq3", "another K/V spec"},
      {"v:tq2/k:tq4", "K part comes first"},
      {"tq4v2", "unknown codec"},
      {"", "empty"},
  };
  for (const auto& c : cases) {
    auto r = ParseKvCodecSpec(c.spec);
    ASSERT_FALSE(r.ok()) << c.spec;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.spec;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos)
        << c.spec << ": " << r.status().message();
  }
}

TEST(KvCodecSpec, LabelsOfStoredParamsJoinLikeSpecs) {
  auto k = Codec::Create(Plain("tq4"), 64);
  auto v = Codec::Create(Plain("tq2.5"), 64);
  auto raw = Codec::Create(Plain("fp16"), 64);
  ASSERT_TRUE(k.ok() && v.ok() && raw.ok());
  EXPECT_EQ(KvCodecLabel((*k)->params(), (*v)->params()), "k4v2.5");
  EXPECT_EQ(KvCodecLabel((*k)->params(), (*k)->params()), "tq4");
  EXPECT_EQ(KvCodecLabel((*raw)->params(), (*v)->params()), "k:fp16/v:tq2.5");
}

// K at 4 bits and V at 2 bits average 3 bits per value plus the norms: every stored bit counted.
TEST(KvCodecSpec, BitsPerValueOfAPairIsTheMeanOfTheTwo) {
  const uint32_t d = 128;
  auto k = Codec::Create(Plain("tq4"), d);
  auto v = Codec::Create(Plain("tq2"), d);
  ASSERT_TRUE(k.ok() && v.ok());
  // One f32 norm per vector: (4·128 + 32) / 128 and (2·128 + 32) / 128 bits per value.
  EXPECT_DOUBLE_EQ((*k)->BitsPerValue(1), 4.25);
  EXPECT_DOUBLE_EQ((*v)->BitsPerValue(1), 2.25);
  EXPECT_EQ((*k)->code_bytes() + (*v)->code_bytes(), size_t{(4 + 2) * d / 8 + 8});
}

}  // namespace
}  // namespace tqkv
