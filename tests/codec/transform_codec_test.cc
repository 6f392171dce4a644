// The transform codec kl:B (docs/codec.md §11): spec, sizes, metadata, round trips, refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "codec/codec_test_util.h"
#include "tqkv/simd.h"
#include "tqkv/thread_pool.h"

namespace tqkv::transform_codec_test {
namespace {

using testing_util::Data;
using testing_util::MakeCodec;
using testing_util::Measure;

TEST(TransformCodecTest, SpecsParseFormatAndLabelBack) {
  auto s = ParseCodecSpec("kl:2.5");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->kind, CodecKind::kTransform);
  EXPECT_EQ(s->kl_milli, 2500u);
  EXPECT_EQ(s->norm_dtype, DType::kF16);
  for (const char* text : {"kl:2.5", "kl:3", "kl:2.375", "kl:1", "kl:8", "kl:2.5,norm=f32"}) {
    auto p = ParseCodecSpec(text);
    ASSERT_TRUE(p.ok()) << text << ": " << p.status().ToString();
    EXPECT_EQ(FormatCodecSpec(*p), text);
  }
  EXPECT_EQ(FormatCodecSpec(*ParseCodecSpec("kl:2.50")), "kl:2.5");
  EXPECT_EQ(FormatCodecSpec(*ParseCodecSpec("kl:3,norm=f16")), "kl:3");
  for (const char* bad : {"kl:", "kl:0.5", "kl:9", "kl:8.001", "kl:2.5555", "kl:x", "kl:2.",
                          "kl:.5", "kl:2.5,seed=1", "kl:2.5,norm=f8", "kl:2.5,norm=bf16",
                          "kl:0x2", "kl:2.0x1"}) {
    EXPECT_FALSE(ParseCodecSpec(bad).ok()) << bad;
  }
  // Every front end takes K/V specs: a plain kl spec, or either side of k:SPEC/v:SPEC.
  auto kv = ParseKvCodecSpec("kl:2.5");
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  EXPECT_TRUE(kv->same());
  kv = ParseKvCodecSpec("k:kl:3/v:tq2");
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  EXPECT_EQ(kv->k.kind, CodecKind::kTransform);
  EXPECT_EQ(kv->v.kind, CodecKind::kTurboQuant);
  EXPECT_EQ(FormatKvCodecSpec(*kv), "k:kl:3/v:tq2");
}

TEST(TransformCodecTest, CodeBytesFollowTheBudgetAndLabelsRoundTrip) {
  for (uint32_t d : {16u, 64u, 128u, 256u}) {
    for (const char* text : {"kl:2.5", "kl:2.3", "kl:3", "kl:4,norm=f32"}) {
      auto codec = MakeCodec(text, d);
      ASSERT_NE(codec, nullptr);
      const CodecParams& p = codec->params();
      const uint64_t milli = ParseCodecSpec(text)->kl_milli;
      const uint64_t norm_bits = 8 * DTypeSize(p.norm_dtype);
      EXPECT_EQ(p.code_bits, (milli * d / 1000 - norm_bits) / 8 * 8) << text << " d=" << d;
      EXPECT_EQ(codec->code_bytes(), DTypeSize(p.norm_dtype) + p.code_bits / 8);
      EXPECT_EQ(codec->group_meta_bytes(), 5u * d + 4);
      EXPECT_TRUE(ValidateCodecParams(p).ok());
      // The label resolves to the same parameters.
      auto again = MakeCodec(CodecLabel(p), d);
      ASSERT_NE(again, nullptr) << CodecLabel(p);
      EXPECT_TRUE(again->params() == p) << text << " d=" << d << " label " << CodecLabel(p);
    }
  }
  EXPECT_EQ(CodecLabel(MakeCodec("kl:2.5", 128)->params()), "kl:2.5");
  EXPECT_EQ(MakeCodec("kl:2.5", 128)->code_bytes(), 40u);  // 320 bits: an f16 norm and 304
  EXPECT_FALSE(Codec::Create(*ParseCodecSpec("kl:2.5"), 100).ok());  // not a multiple of 8
  EXPECT_FALSE(Codec::Create(*ParseCodecSpec("kl:2.5"), 8).ok());    // head_dim under 16
  EXPECT_FALSE(Codec::Create(*ParseCodecSpec("kl:2.5"), 512).ok());  // over the limit
}

TEST(TransformCodecTest, StoredParamsAreCheckedLikeEveryOtherKind) {
  const CodecParams good = MakeCodec("kl:3", 64)->params();
  auto broken = [&](auto mutate) {
    CodecParams p = good;
    mutate(p);
    return ValidateCodecParams(p).ok();
  };
  EXPECT_FALSE(broken([](CodecParams& p) { p.code_bits = 0; }));
  EXPECT_FALSE(broken([](CodecParams& p) { p.code_bits = 8 * 64 + 8; }));
  EXPECT_FALSE(broken([](CodecParams& p) { p.code_bits = 100; }));  // not whole bytes
  EXPECT_FALSE(broken([](CodecParams& p) { p.subsets.pop_back(); }));
  EXPECT_FALSE(broken([](CodecParams& p) { p.subsets[2].seed = 1; }));
  EXPECT_FALSE(broken([](CodecParams& p) { p.subsets[2].bits = 4; }));
  EXPECT_FALSE(broken([](CodecParams& p) { p.subsets[0].centroids[1] = NAN; }));
  EXPECT_FALSE(broken([](CodecParams& p) { p.qjl = true; }));
  EXPECT_FALSE(broken([](CodecParams& p) { p.norm_dtype = static_cast<DType>(7); }));
  EXPECT_TRUE(broken([](CodecParams&) {}));
}

struct Coded {
  std::vector<uint8_t> meta, codes;
  std::vector<float> out;
};

Coded RoundTrip(const Codec& c, const std::vector<float>& x, ThreadPool* pool = nullptr) {
  const uint32_t d = c.head_dim();
  const size_t n = x.size() / d;
  Coded r;
  r.meta.resize(c.group_meta_bytes());
  r.codes.resize(n * c.code_bytes());
  r.out.resize(x.size());
  EXPECT_TRUE(c.SelectGroupMeta(x.data(), DType::kF32, n, d, r.meta).ok());
  EXPECT_TRUE(c.Encode(x.data(), DType::kF32, n, d, r.meta, r.codes, pool).ok());
  EXPECT_TRUE(c.Decode(r.codes, n, r.meta, r.out.data(), DType::kF32, d, pool).ok());
  return r;
}

TEST(TransformCodecTest, MetadataSpendsExactlyTheBudget) {
  for (uint32_t d : {64u, 128u}) {
    auto codec = MakeCodec("kl:2.5", d);
    const Coded r = RoundTrip(*codec, Data(SyntheticKind::kKv, 512, d, 3));
    uint32_t total = 0, count[9] = {};
    for (uint32_t c = 0; c < d; ++c) {
      EXPECT_LE(r.meta[c], 8);
      total += r.meta[c];
      ++count[r.meta[c]];
    }
    EXPECT_EQ(total, codec->params().code_bits);
    for (uint32_t b = 1; b <= 8; ++b) EXPECT_EQ(count[b] % 8, 0u) << b;
    EXPECT_TRUE(codec->CheckGroupMeta(r.meta).ok());
  }
}

TEST(TransformCodecTest, ErrorFallsWithTheBudget) {
  const uint32_t d = 128;
  const std::vector<float> x = Data(SyntheticKind::kKv, 1024, d, 5);
  double last = 1.0;
  for (const char* spec : {"kl:1.5", "kl:2", "kl:2.5", "kl:3", "kl:4"}) {
    const Coded r = RoundTrip(*MakeCodec(spec, d), x);
    const double nmse = Measure(x, r.out, d).nmse;
    EXPECT_LT(nmse, last) << spec;
    last = nmse;
  }
  EXPECT_LT(last, 0.02);  // kl:4
}

TEST(TransformCodecTest, ThreadsAndSimdLevelsGiveTheSameBytes) {
  const uint32_t d = 64;
  const std::vector<float> x = Data(SyntheticKind::kKv, 700, d, 9);
  auto codec = MakeCodec("kl:2.5", d);
  const Coded one = RoundTrip(*codec, x);
  ThreadPool pool(3);
  const Coded many = RoundTrip(*codec, x, &pool);
  EXPECT_EQ(one.codes, many.codes);
  EXPECT_EQ(0, std::memcmp(one.out.data(), many.out.data(), one.out.size() * 4));
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!ForceSimdLevel(level).ok()) continue;
    const Coded r = RoundTrip(*codec, x);
    EXPECT_EQ(one.meta, r.meta) << SimdLevelName(level);
    EXPECT_EQ(one.codes, r.codes) << SimdLevelName(level);
    EXPECT_EQ(0, std::memcmp(one.out.data(), r.out.data(), one.out.size() * 4))
        << SimdLevelName(level);
  }
  ResetSimdLevel();
}

TEST(TransformCodecTest, ZeroAndNonFiniteVectorsStayInTheirOwnRow) {
  const uint32_t d = 32;
  std::vector<float> x = Data(SyntheticKind::kKv, 8, d, 1);
  std::fill(x.begin() + 2 * d, x.begin() + 3 * d, 0.0f);
  x[5 * d + 7] = NAN;
  auto codec = MakeCodec("kl:3", d);
  const Coded r = RoundTrip(*codec, x);
  for (uint32_t c = 0; c < d; ++c) {
    EXPECT_EQ(r.out[2 * d + c], 0.0f);
    EXPECT_TRUE(std::isnan(r.out[5 * d + c]));
    EXPECT_TRUE(std::isfinite(r.out[4 * d + c]));
    EXPECT_TRUE(std::isfinite(r.out[6 * d + c]));
  }
}

TEST(TransformCodecTest, DecodeAddAddsTheScaledMeanInF32) {
  const uint32_t d = 64;
  const size_t n = 40;
  const std::vector<float> x = Data(SyntheticKind::kKv, n, d, 4);
  auto codec = MakeCodec("kl:2.5", d);
  const Coded r = RoundTrip(*codec, x);
  std::vector<float> mean(d), scale(n), out(n * d);
  for (uint32_t c = 0; c < d; ++c) mean[c] = 0.25f * static_cast<float>(c) - 3.0f;
  for (size_t i = 0; i < n; ++i) scale[i] = 0.5f + 0.125f * static_cast<float>(i);
  ASSERT_TRUE(codec->DecodeAdd(r.codes, n, r.meta, mean, scale, out.data(), DType::kF32, d).ok());
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t c = 0; c < d; ++c) {
      const float product = scale[i] * mean[c];
      EXPECT_EQ(out[i * d + c], r.out[i * d + c] + product) << i << "," << c;
    }
  }
}

TEST(TransformCodecTest, BadMetadataIsRefusedNamingWhy) {
  const uint32_t d = 32;
  const std::vector<float> x = Data(SyntheticKind::kKv, 16, d, 2);
  auto codec = MakeCodec("kl:3", d);
  const Coded r = RoundTrip(*codec, x);
  std::vector<float> out(x.size());
  auto refused = [&](std::vector<uint8_t> meta, const char* why) {
    const Status s = codec->Decode(r.codes, 16, meta, out.data(), DType::kF32, d);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << why << ": " << s.ToString();
    EXPECT_NE(s.message().find(why), std::string::npos) << s.ToString();
    EXPECT_FALSE(codec->CheckGroupMeta(meta).ok());
  };
  std::vector<uint8_t> m = r.meta;
  m.pop_back();
  refused(m, "bytes, need");
  m = r.meta;
  for (uint32_t c = 0; c < d; ++c) {
    if (m[c] > 0 && m[c] < 8) {
      ++m[c];
      break;
    }
  }
  refused(m, "bits sum to");
  m = r.meta;
  m[0] = 9;
  refused(m, "at most 8");
  m = r.meta;
  m[d + 1] = 0x7C;  // channel 0's mean: f16 exponent all ones (inf or NaN)
  refused(m, "not finite");
  m = r.meta;
  m[3 * d + 1] |= 0x80;  // channel 0's scale: negative
  refused(m, "negative");
  m = r.meta;  // one channel a bit more, another a bit less: classes no longer multiples of 8
  for (uint32_t c = 0, up = d, down = d; c < d && (up == d || down == d); ++c) {
    if (up == d && m[c] < 8 && m[c] >= 1) up = c;
    else if (down == d && m[c] >= 1 && (up == d || m[c] != m[up])) down = c;
    if (up != d && down != d) {
      ++m[up];
      --m[down];
    }
  }
  refused(m, "a multiple of 8");
  m = r.meta;
  const float three = 3.0f;
  std::memcpy(&m[5 * d], &three, 4);
  refused(m, "power of two");
  // A power of two so large that finite codes decode to infinity (issue 49, item 14); the
  // largest g the encoder could write for f32 data is far below it.
  m = r.meta;
  const float huge = 0x1p127f, fine = 0x1p50f;
  std::memcpy(&m[5 * d], &huge, 4);
  refused(m, "can decode a finite code to infinity");
  std::memcpy(&m[5 * d], &fine, 4);
  EXPECT_TRUE(codec->CheckGroupMeta(m).ok());
  // With f32 norms tqkv writes g = 1, and nothing else is taken.
  auto f32 = MakeCodec("kl:3,norm=f32", d);
  const Coded r32 = RoundTrip(*f32, x);
  m = r32.meta;
  const float two = 2.0f;
  std::memcpy(&m[5 * d], &two, 4);
  EXPECT_NE(f32->CheckGroupMeta(m).message().find("f32 norms is not 1"), std::string::npos);
}

}  // namespace
}  // namespace tqkv::transform_codec_test
