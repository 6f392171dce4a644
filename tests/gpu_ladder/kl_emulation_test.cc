// The CUDA decoder of kl:B (src/cuda/decode_kl.cu), checked on the CPU: its host emulation
// (EmulateDecodeVector, the kernel's arithmetic per vector, reading only the packed params and
// the group metadata as stored) must reproduce Codec::Decode and DecodeAdd bit for bit, for
// metadata the encoder selects and for shuffled ones (other class layouts and row positions),
// and must turn metadata the codec refuses into NaN without reading past the code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/packed.h"
#include "cuda/params.h"
#include "gpu_ladder/gpu_test_util.h"
#include "tqkv/codec.h"

namespace tqkv {
namespace {

struct KlCase {
  std::string spec;
  uint32_t head_dim;
};

std::vector<KlCase> KlCases() {
  std::vector<KlCase> out;
  for (const char* s : {"kl:2.5", "kl:2.4", "kl:1.2", "kl:4", "kl:6.5,norm=f32"}) {
    for (uint32_t d : {64u, 128u, 256u}) out.push_back({s, d});
  }
  out.push_back({"kl:3", 16});   // one block of 8 or 16: lanes of a warp idle
  out.push_back({"kl:2.5", 80}); // 3 registers' worth: E = 4
  out.push_back({"kl:3.5", 96});
  return out;
}

std::string Name(const ::testing::TestParamInfo<KlCase>& info) {
  std::string s = info.param.spec + "_d" + std::to_string(info.param.head_dim);
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

// The channels' bits, means and scales permuted together: the same classes (sizes, sum) with
// other channels in them, so other row positions.
std::vector<uint8_t> ShuffledMeta(const std::vector<uint8_t>& meta, uint32_t d, uint32_t seed) {
  std::vector<uint32_t> perm(d);
  for (uint32_t c = 0; c < d; ++c) perm[c] = c;
  std::mt19937 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<uint8_t> out = meta;
  for (uint32_t c = 0; c < d; ++c) {
    const uint32_t s = perm[c];
    out[c] = meta[s];
    std::memcpy(&out[d + 2 * c], &meta[d + 2 * s], 2);
    std::memcpy(&out[3 * d + 2 * c], &meta[3 * d + 2 * s], 2);
  }
  return out;
}

class KlEmulationTest : public ::testing::TestWithParam<KlCase> {};

TEST_P(KlEmulationTest, DecodeMatchesCpuCodecBitForBit) {
  const KlCase c = GetParam();
  auto codec = Codec::Create(*ParseCodecSpec(c.spec), c.head_dim);
  ASSERT_TRUE(codec.ok()) << codec.status().ToString();
  auto packed = cuda::PackCodecParams((*codec)->params());
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  const cuda::GpuCodecParams& p = packed->params;
  ASSERT_EQ(p.kind, cuda::kGpuTransform);
  ASSERT_EQ(p.code_bytes, (*codec)->code_bytes());
  ASSERT_EQ(p.meta_bytes, (*codec)->group_meta_bytes());
  ASSERT_EQ(cuda::KlCodeBits(p), (*codec)->params().code_bits);

  const size_t n = 80, d = c.head_dim, cb = p.code_bytes;
  const std::vector<float> x = gpu_test::TestVectorsFor((*codec)->params().norm_dtype, n, c.head_dim, d);
  std::vector<uint8_t> selected((*codec)->group_meta_bytes());
  ASSERT_TRUE((*codec)->SelectGroupMeta(x.data(), DType::kF32, n, d, selected).ok());
  for (uint32_t shuffle = 0; shuffle < 3; ++shuffle) {
    const std::vector<uint8_t> meta = shuffle == 0 ? selected : ShuffledMeta(selected, c.head_dim, shuffle);
    ASSERT_TRUE((*codec)->CheckGroupMeta(meta).ok());
    std::vector<uint8_t> codes(n * cb);
    ASSERT_TRUE((*codec)->Encode(x.data(), DType::kF32, n, d, meta, codes).ok());
    for (DType out : {DType::kF32, DType::kF16, DType::kBF16}) {
      const size_t es = DTypeSize(out);
      std::vector<uint8_t> want(n * d * es), got(n * d * es, 0xEE);
      ASSERT_TRUE((*codec)->Decode(codes, n, meta, want.data(), out, d).ok());
      for (size_t i = 0; i < n; ++i) {
        cuda::EmulateDecodeVector(p, codes.data() + i * cb, meta.data(), got.data() + i * d * es,
                                  cuda::ToGpuDType(out));
      }
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(0, std::memcmp(want.data() + i * d * es, got.data() + i * d * es, d * es))
            << c.spec << " d=" << d << " shuffle " << shuffle << " output " << DTypeName(out)
            << " vector " << i;
      }
    }
  }
}

// Keys after their means: α·μ read through KeyMeanRow / KeyMeanAlpha equals Codec::DecodeAdd.
TEST_P(KlEmulationTest, CenteredDecodeMatchesCpuDecodeAdd) {
  const KlCase c = GetParam();
  auto codec = Codec::Create(*ParseCodecSpec(c.spec), c.head_dim);
  ASSERT_TRUE(codec.ok());
  auto packed = cuda::PackCodecParams((*codec)->params());
  ASSERT_TRUE(packed.ok());
  const cuda::GpuCodecParams& p = packed->params;
  const uint64_t tokens = 48;
  const size_t d = c.head_dim, cb = p.code_bytes;
  const std::vector<float> x = gpu_test::TestVectorsFor((*codec)->params().norm_dtype, tokens, c.head_dim, 3 + d);
  std::vector<uint8_t> meta((*codec)->group_meta_bytes());
  ASSERT_TRUE((*codec)->SelectGroupMeta(x.data(), DType::kF32, tokens, d, meta).ok());
  std::vector<uint8_t> codes(tokens * cb);
  ASSERT_TRUE((*codec)->Encode(x.data(), DType::kF32, tokens, d, meta, codes).ok());
  // One head, one mean block of every token: the means chunk [mean][alphas] in f32.
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 30.0f);
  std::vector<float> chunk(d + tokens);
  for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = i < d ? nd(rng) : 1.0f + nd(rng) / 100.0f;
  const auto* bytes = reinterpret_cast<const uint8_t*>(chunk.data());
  const cuda::GpuKeyMeans gm{bytes, bytes + d * 4, cuda::kGpuF32, static_cast<uint32_t>(tokens), 1,
                             tokens};
  for (DType out : {DType::kF32, DType::kF16}) {
    const size_t es = DTypeSize(out);
    std::vector<uint8_t> want(tokens * d * es), got(tokens * d * es, 0xEE);
    ASSERT_TRUE((*codec)
                    ->DecodeAdd(codes, tokens, meta, {chunk.data(), d}, {chunk.data() + d, tokens},
                                want.data(), out, d)
                    .ok());
    for (uint64_t t = 0; t < tokens; ++t) {
      cuda::EmulateDecodeVector(p, codes.data() + t * cb, meta.data(), got.data() + t * d * es,
                                cuda::ToGpuDType(out), cuda::KeyMeanRow(gm, t, 0, p.head_dim),
                                gm.dtype, cuda::KeyMeanAlpha(gm, t, 0));
    }
    ASSERT_EQ(want, got) << c.spec << " d=" << d << " output " << DTypeName(out);
  }
}

INSTANTIATE_TEST_SUITE_P(KlCodecs, KlEmulationTest, ::testing::ValuesIn(KlCases()), Name);

// Every fault Codec::CheckGroupMeta refuses makes the kernel write NaN and read nothing past the
// code (the emulation runs under ASan in CI); the same faults as tests/format's corruption tests.
TEST(KlEmulation, MetadataTheCodecRefusesDecodesToNaN) {
  const uint32_t d = 64;
  auto codec = Codec::Create(*ParseCodecSpec("kl:2.5"), d);
  ASSERT_TRUE(codec.ok());
  auto packed = cuda::PackCodecParams((*codec)->params());
  ASSERT_TRUE(packed.ok());
  const cuda::GpuCodecParams& p = packed->params;
  const std::vector<float> x = gpu_test::TestVectors(16, d, 9);
  std::vector<uint8_t> meta((*codec)->group_meta_bytes());
  ASSERT_TRUE((*codec)->SelectGroupMeta(x.data(), DType::kF32, 16, d, meta).ok());
  std::vector<uint8_t> code(p.code_bytes);
  ASSERT_TRUE((*codec)->Encode(x.data(), DType::kF32, 1, d, meta, code).ok());
  uint32_t first_coded = 0;
  while (meta[first_coded] == 0) ++first_coded;
  for (int fault = 0; fault < 6; ++fault) {
    SCOPED_TRACE(fault);
    std::vector<uint8_t> bad = meta;
    if (fault == 0) bad[first_coded] += 1;                  // the bits sum to one more
    if (fault == 1) bad[0] = 9;                             // a channel of 9 bits
    if (fault == 2) bad[0] = 200;                           // far beyond any code
    if (fault == 3) bad[d + 1] = 0x7C;                      // an infinite mean
    if (fault == 4) bad[3 * d + 1] = 0x80;                  // a negative scale
    if (fault == 5) bad[5 * d] = 1;                         // g not a power of two
    ASSERT_FALSE((*codec)->CheckGroupMeta(bad).ok());
    std::vector<float> out(d, 0.0f);
    cuda::EmulateDecodeVector(p, code.data(), bad.data(), out.data(), cuda::kGpuF32);
    for (uint32_t c = 0; c < d; ++c) ASSERT_TRUE(std::isnan(out[c])) << c;
  }
  // Classes that are not multiples of 8 channels, the sum unchanged: three 2-bit channels to 1
  // bit, three to 3 bits.
  std::vector<uint8_t> bad = meta;
  std::vector<uint32_t> two;
  for (uint32_t c = 0; c < d; ++c) {
    if (bad[c] == 2) two.push_back(c);
  }
  ASSERT_GE(two.size(), 6u);
  for (int i = 0; i < 3; ++i) bad[two[i]] = 1;
  for (int i = 3; i < 6; ++i) bad[two[i]] = 3;
  ASSERT_FALSE((*codec)->CheckGroupMeta(bad).ok());
  std::vector<float> out(d, 0.0f);
  cuda::EmulateDecodeVector(p, code.data(), bad.data(), out.data(), cuda::kGpuF32);
  for (uint32_t c = 0; c < d; ++c) ASSERT_TRUE(std::isnan(out[c])) << c;
}

// The GPU decodes with the container's stored codebooks, not Lloyd-Max tables of its own: a
// record whose codebooks differ (valid: finite, ascending) decodes on the emulation exactly as
// the CPU codec built from that record does, and differently from the standard codebooks
// (issue 49, item 6; docs/gpu.md).
TEST(KlEmulation, StoredCodebooksThatDifferAreUsed) {
  const uint32_t d = 64;
  const size_t n = 16;
  auto standard = Codec::Create(*ParseCodecSpec("kl:3"), d);
  ASSERT_TRUE(standard.ok());
  CodecParams params = (*standard)->params();
  for (SubsetParams& s : params.subsets) {
    for (float& c : s.centroids) c = 1.5f * c + 0.25f;  // still finite and ascending
  }
  auto stored = Codec::FromParams(params);
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  auto packed = cuda::PackCodecParams(params);
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  const cuda::GpuCodecParams& p = packed->params;
  const std::vector<float> x = gpu_test::TestVectors(n, d, 4);
  std::vector<uint8_t> meta((*stored)->group_meta_bytes()), codes(n * p.code_bytes);
  ASSERT_TRUE((*stored)->SelectGroupMeta(x.data(), DType::kF32, n, d, meta).ok());
  ASSERT_TRUE((*stored)->Encode(x.data(), DType::kF32, n, d, meta, codes).ok());
  std::vector<float> want(n * d), other(n * d), got(n * d);
  ASSERT_TRUE((*stored)->Decode(codes, n, meta, want.data(), DType::kF32, d).ok());
  ASSERT_TRUE((*standard)->Decode(codes, n, meta, other.data(), DType::kF32, d).ok());
  for (size_t i = 0; i < n; ++i) {
    cuda::EmulateDecodeVector(p, codes.data() + i * p.code_bytes, meta.data(),
                              reinterpret_cast<uint8_t*>(got.data() + i * d), cuda::kGpuF32);
  }
  EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4));
  EXPECT_NE(0, std::memcmp(other.data(), got.data(), other.size() * 4));
}

// The table holds what the codec uses: each codebook, each block size's signs and scale.
TEST(KlEmulation, PackedTableHoldsTheCodebooksAndBlockRotations) {
  auto codec = Codec::Create(*ParseCodecSpec("kl:2.5"), 128);
  ASSERT_TRUE(codec.ok());
  auto packed = cuda::PackCodecParams((*codec)->params());
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  const cuda::GpuCodecParams& p = packed->params;
  ASSERT_EQ(p.table_floats, cuda::kGpuKlTableFloats);
  for (uint32_t b = 1; b <= 8; ++b) {
    const std::vector<float>& want = (*codec)->params().subsets[b - 1].centroids;
    ASSERT_EQ(want.size(), size_t{1} << b);
    EXPECT_EQ(0, std::memcmp(want.data(), p.table + cuda::KlCentroidsAt(b), want.size() * 4)) << b;
  }
  for (uint32_t m = 8; m <= 256; m <<= 1) {
    EXPECT_EQ(p.table[cuda::KlScaleAt(m)], static_cast<float>(1.0 / std::sqrt(double(m)))) << m;
    for (uint32_t j = 0; j < m; ++j) {
      ASSERT_TRUE(p.table[cuda::KlSignsAt(m) + j] == 1.0f || p.table[cuda::KlSignsAt(m) + j] == -1.0f);
    }
  }
  EXPECT_EQ(cuda::KlScaleAt(256) + 1, cuda::kGpuKlTableFloats);
  EXPECT_EQ(cuda::KlSignsAt(256) + 256, cuda::KlScaleAt(8));
}

}  // namespace
}  // namespace tqkv
