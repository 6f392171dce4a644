// Codec spec strings: presets, modifiers, the general form, round trips and errors.
#include <gtest/gtest.h>

#include <string>

#include "tqkv/codec.h"

namespace tqkv {
namespace {

CodecSpec ParseCodec(const std::string& s) {
  auto r = ParseCodecSpec(s);
  EXPECT_TRUE(r.ok()) << s << ": " << r.status().ToString();
  return r.ok() ? *r : CodecSpec{};
}

TEST(CodecSpec, RawPresets) {
  EXPECT_EQ(ParseCodec("fp16").kind, CodecKind::kRaw);
  EXPECT_EQ(ParseCodec("fp16").raw_dtype, DType::kF16);
  EXPECT_EQ(ParseCodec("bf16").raw_dtype, DType::kBF16);
  EXPECT_EQ(ParseCodec("fp32").raw_dtype, DType::kF32);
  EXPECT_EQ(ParseCodec("f32").raw_dtype, DType::kF32);
}

TEST(CodecSpec, TurboQuantPresets) {
  for (int b = 1; b <= 8; ++b) {
    const CodecSpec s = ParseCodec("tq" + std::to_string(b));
    EXPECT_EQ(s.kind, CodecKind::kTurboQuant);
    EXPECT_EQ(s.bits, b);
    EXPECT_EQ(s.outlier_bits, 0);
  }
  const CodecSpec a = ParseCodec("tq2.5");
  EXPECT_EQ(a.bits, 2);
  EXPECT_EQ(a.outlier_bits, 4);
  EXPECT_EQ(a.outlier_channels, 0);
  EXPECT_EQ(a.outlier_num, 1);
  EXPECT_EQ(a.outlier_den, 4);
  const CodecSpec b = ParseCodec("tq3.5");
  EXPECT_EQ(b.bits, 3);
  EXPECT_EQ(b.outlier_bits, 5);
}

TEST(CodecSpec, Modifiers) {
  const CodecSpec s = ParseCodec("tq3,rot=haar,seed=7,norm=f16,nc=1");
  EXPECT_EQ(s.bits, 3);
  EXPECT_EQ(s.rotation, RotationKind::kHaar);
  EXPECT_EQ(s.seed, 7u);
  EXPECT_EQ(s.norm_dtype, DType::kF16);
  EXPECT_TRUE(s.norm_correction);
  const CodecSpec g = ParseCodec("tq:b=4,split=32@5,rot=hd2,seed=0xff");
  EXPECT_EQ(g.bits, 4);
  EXPECT_EQ(g.outlier_bits, 5);
  EXPECT_EQ(g.outlier_channels, 32);
  EXPECT_EQ(g.rotation, RotationKind::kHadamard2);
  EXPECT_EQ(g.seed, 255u);
  const CodecSpec f = ParseCodec("tq:split=3/8@4");
  EXPECT_EQ(f.bits, 3);  // default
  EXPECT_EQ(f.outlier_num, 3);
  EXPECT_EQ(f.outlier_den, 8);
  EXPECT_TRUE(ParseCodec("tq3,qjl=1").qjl);
  EXPECT_EQ(ParseCodec("tq2.5,split=none").outlier_bits, 0);
  EXPECT_EQ(ParseCodec("tq:b=2,split=1/4@4"), ParseCodec("tq2.5"));
}

TEST(CodecSpec, RoundTrip) {
  for (const char* s : {"fp16",
                        "bf16",
                        "fp32",
                        "tq1",
                        "tq2",
                        "tq3",
                        "tq4",
                        "tq8",
                        "tq2.5",
                        "tq3.5",
                        "tq3,rot=haar",
                        "tq2.5,rot=haar",
                        "tq3.5,rot=kron",
                        "tq4,rot=hd2,seed=12345",
                        "tq2.5,norm=f16",
                        "tq3.5,nc=1",
                        "tq3,qjl=1",
                        "tq4,split=32@5",
                        "tq2,split=3/8@3",
                        "tq3,seed=0xffffffffffffffff",
                        "tq:b=3,rot=hd",
                        "tq:b=2,split=1/4@4"}) {
    const CodecSpec spec = ParseCodec(s);
    const std::string formatted = FormatCodecSpec(spec);
    EXPECT_EQ(ParseCodec(formatted), spec) << s << " -> " << formatted;
  }
  EXPECT_EQ(FormatCodecSpec(ParseCodec("tq:b=2,split=1/4@4")), "tq2.5");
  EXPECT_EQ(FormatCodecSpec(ParseCodec("tq:b=3")), "tq3");
  EXPECT_EQ(FormatCodecSpec(ParseCodec("tq3,seed=0xffffffffffffffff")), "tq3,seed=0xffffffffffffffff");
  EXPECT_EQ(FormatCodecSpec(ParseCodec("tq3,rot=auto,norm=f32,nc=0")), "tq3");
}

TEST(CodecSpec, Errors) {
  for (const char* s : {"",
                        "fp8",
                        "tq",
                        "tq0",
                        "tq9",
                        "tq2.6",
                        "TQ3",
                        "fp16,norm=f16",
                        "tq3,",
                        "tq3,b",
                        "tq3,=1",
                        "tq3,b=0",
                        "tq3,b=9",
                        "tq3,b=x",
                        "tq3,rot=dct",
                        "tq3,seed=-1",
                        "tq3,seed=18446744073709551616",
                        "tq3,norm=bf16",
                        "tq3,nc=2",
                        "tq3,qjl=yes",
                        "tq3,colour=red",
                        "tq3,b=3,b=4",
                        "tq:b=3,split=33",
                        "tq:split=0@4",
                        "tq:split=4/4@4",
                        "tq:split=1/4@9",
                        "tq:split=1/0@4",
                        "tq2.5,qjl=1",
                        "tq1,qjl=1",
                        "fp16:b=3",
                        "tq:",
                        "tq3,split=32@0"}) {
    const auto r = ParseCodecSpec(s);
    EXPECT_FALSE(r.ok()) << "'" << s << "' parsed";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(r.status().message().find("codec spec"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace tqkv
