// The layout and params shared with the CUDA kernels, checked on the CPU: PackCodecParams and a
// host emulation of the kernels' warp arithmetic (Sum8 lane order, FWHT shuffles, ballot planes,
// channel slots) must reproduce the CPU codec bit for bit, for every preset and head_dim.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/packed.h"
#include "cuda/params.h"
#include "gpu_ladder/gpu_test_util.h"
#include "tqkv/codec.h"

namespace tqkv {
namespace {

using cuda::EmulateDecodeVector;
using cuda::EmulateEncodeVector;
using cuda::PackCodecParams;

struct Case {
  std::string spec;
  uint32_t head_dim;
};

std::vector<Case> AllCases() {
  std::vector<Case> out;
  for (const auto& s : gpu_test::KernelSpecs()) {
    for (uint32_t d : gpu_test::KernelHeadDims()) out.push_back({s, d});
  }
  for (uint32_t d : gpu_test::KernelHeadDims()) out.push_back({"fp16", d});
  for (uint32_t d : gpu_test::KernelHeadDims()) out.push_back({"bf16", d});
  out.push_back({"tq3", 96});   // Kronecker via kAuto: 3 x 32, 3 registers per lane
  out.push_back({"tq3,rot=haar", 96});  // the dense kind on the same shape
  out.push_back({"tq3", 80});   // Kronecker 5 x 16: m % 32 != 0, blocks inside a register
  out.push_back({"tq3", 120});  // Kronecker 15 x 8
  out.push_back({"tq2.5", 48}); // 12 outliers: a subset smaller than a warp; 4-blocks (3 x 4)
  out.push_back({"tq2.5,rot=haar", 128});
  out.push_back({"tq3.5", 192});  // 48 outliers (3 x 16) + 144 (9 x 16), 6 registers
  return out;
}

class EmulationTest : public ::testing::TestWithParam<Case> {};

TEST_P(EmulationTest, EncodeAndDecodeMatchCpuCodecBitForBit) {
  const Case c = GetParam();
  auto spec = ParseCodecSpec(c.spec);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto codec = Codec::Create(*spec, c.head_dim);
  ASSERT_TRUE(codec.ok()) << codec.status().ToString();
  auto packed = PackCodecParams((*codec)->params());
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  const cuda::GpuCodecParams& p = packed->params;
  ASSERT_EQ(p.code_bytes, (*codec)->code_bytes());
  ASSERT_EQ(p.meta_bytes, (*codec)->group_meta_bytes());

  const size_t n = 96, d = c.head_dim, cb = p.code_bytes;
  const std::vector<float> xf =
      gpu_test::TestVectorsFor((*codec)->params().norm_dtype, n, c.head_dim, 7 + d);
  const std::vector<uint16_t> xh = gpu_test::ToHalf(xf);
  std::vector<uint8_t> meta((*codec)->group_meta_bytes());
  ASSERT_TRUE((*codec)->SelectGroupMeta(xh.data(), DType::kF16, n, d, meta).ok());
  const uint8_t* mask = meta.empty() ? nullptr : meta.data();

  for (DType in : {DType::kF16, DType::kF32}) {
    const void* x = in == DType::kF16 ? static_cast<const void*>(xh.data()) : xf.data();
    std::vector<uint8_t> cpu(n * cb), emu(n * cb, 0xEE);
    ASSERT_TRUE((*codec)->Encode(x, in, n, d, meta, cpu).ok());
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* xi = static_cast<const uint8_t*>(x) + i * d * DTypeSize(in);
      EmulateEncodeVector(p, xi, cuda::ToGpuDType(in), mask, emu.data() + i * cb);
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(0, std::memcmp(cpu.data() + i * cb, emu.data() + i * cb, cb))
          << c.spec << " d=" << d << " input " << DTypeName(in) << " vector " << i;
    }
    for (DType out : {DType::kF32, DType::kF16, DType::kBF16}) {
      const size_t es = DTypeSize(out);
      std::vector<uint8_t> want(n * d * es), got(n * d * es, 0xEE);
      ASSERT_TRUE((*codec)->Decode(cpu, n, meta, want.data(), out, d).ok());
      for (size_t i = 0; i < n; ++i) {
        EmulateDecodeVector(p, cpu.data() + i * cb, mask, got.data() + i * d * es,
                            cuda::ToGpuDType(out));
      }
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(0, std::memcmp(want.data() + i * d * es, got.data() + i * d * es, d * es))
            << c.spec << " d=" << d << " output " << DTypeName(out) << " vector " << i;
      }
    }
  }
}

// Mean-removed keys: the kernel's α·μ addition (read through KeyMeanRow / KeyMeanAlpha from a
// key-means chunk of 2 heads, 3 blocks of 40 tokens) equals Codec::DecodeAdd bit for bit.
TEST_P(EmulationTest, CenteredDecodeMatchesCpuDecodeAdd) {
  const Case c = GetParam();
  auto codec = Codec::Create(*ParseCodecSpec(c.spec), c.head_dim);
  ASSERT_TRUE(codec.ok());
  if ((*codec)->params().kind != CodecKind::kTurboQuant) GTEST_SKIP() << "keys of raw layers are stored as they are";
  auto packed = PackCodecParams((*codec)->params());
  ASSERT_TRUE(packed.ok());
  const cuda::GpuCodecParams& p = packed->params;
  const uint32_t heads = 2, block = 40;
  const uint64_t tokens = 96, blocks = 3;
  const size_t d = c.head_dim, cb = p.code_bytes;
  const std::vector<float> xf =
      gpu_test::TestVectorsFor((*codec)->params().norm_dtype, tokens, c.head_dim, 3 + d);
  std::vector<uint8_t> meta((*codec)->group_meta_bytes());
  ASSERT_TRUE((*codec)->SelectGroupMeta(xf.data(), DType::kF32, tokens, d, meta).ok());
  std::vector<uint8_t> codes(tokens * cb);
  ASSERT_TRUE((*codec)->Encode(xf.data(), DType::kF32, tokens, d, meta, codes).ok());
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 30.0f);
  for (DType md : {DType::kF16, DType::kF32}) {
    const size_t ms = DTypeSize(md);
    std::vector<float> values((blocks * d + tokens) * heads);
    std::vector<uint8_t> chunk(values.size() * ms);
    for (size_t i = 0; i < values.size(); ++i) {
      float v = i < blocks * d * heads ? nd(rng) : 1.0f + nd(rng) / 100.0f;
      if (md == DType::kF16) v = HalfToFloat(FloatToHalf(v));
      values[i] = v;
      StoreFromFloat(chunk.data(), md, i, v);
    }
    const cuda::GpuKeyMeans gm{chunk.data(), chunk.data() + blocks * d * heads * ms,
                               cuda::ToGpuDType(md), block, blocks, tokens};
    const uint32_t head = 1;  // the codes stand for head 1's keys
    for (DType out : {DType::kF32, DType::kF16, DType::kBF16}) {
      const size_t es = DTypeSize(out);
      std::vector<uint8_t> want(tokens * d * es), got(tokens * d * es, 0xEE);
      for (uint64_t b = 0; b < blocks; ++b) {
        const uint64_t lo = b * block, n = std::min<uint64_t>(tokens, lo + block) - lo;
        ASSERT_TRUE((*codec)
                        ->DecodeAdd({codes.data() + lo * cb, n * cb}, n, meta,
                                    {values.data() + (head * blocks + b) * d, d},
                                    {values.data() + blocks * d * heads + head * tokens + lo, n},
                                    want.data() + lo * d * es, out, d)
                        .ok());
      }
      for (uint64_t t = 0; t < tokens; ++t) {
        EmulateDecodeVector(p, codes.data() + t * cb, meta.empty() ? nullptr : meta.data(),
                            got.data() + t * d * es, cuda::ToGpuDType(out),
                            cuda::KeyMeanRow(gm, t, head, p.head_dim), gm.dtype,
                            cuda::KeyMeanAlpha(gm, t, head));
      }
      ASSERT_EQ(want, got) << c.spec << " d=" << d << " means " << DTypeName(md) << " output "
                           << DTypeName(out);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, EmulationTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string s = info.param.spec + "_d" + std::to_string(info.param.head_dim);
                           for (char& ch : s) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return s + "_" + std::to_string(info.index);
                         });

TEST(PackCodecParams, TableHoldsWhatTheCodecUses) {
  auto codec = Codec::Create(*ParseCodecSpec("tq2.5,norm=f16"), 128);
  ASSERT_TRUE(codec.ok());
  auto packed = PackCodecParams((*codec)->params());
  ASSERT_TRUE(packed.ok());
  const auto& p = packed->params;
  const auto& cp = (*codec)->params();
  ASSERT_EQ(p.num_subsets, 2u);
  EXPECT_EQ(p.norm_dtype, cuda::kGpuF16);
  EXPECT_EQ(p.subsets[0].norm_offset, 0u);
  EXPECT_EQ(p.subsets[1].norm_offset, 2u);
  EXPECT_EQ(p.subsets[0].planes_offset, 4u);
  EXPECT_EQ(p.subsets[1].planes_offset, 4u + cp.subsets[0].bits * ((cp.subsets[0].channels + 7u) / 8u));
  for (uint32_t s = 0; s < 2; ++s) {
    const auto& g = p.subsets[s];
    EXPECT_EQ(g.dim, cp.subsets[s].channels);
    EXPECT_EQ(g.bits, cp.subsets[s].bits);
    for (size_t k = 0; k < cp.subsets[s].centroids.size(); ++k) {
      EXPECT_EQ(packed->table[g.centroids + k], cp.subsets[s].centroids[k]);
    }
    for (size_t k = 0; k + 1 < cp.subsets[s].centroids.size(); ++k) {
      EXPECT_LT(packed->table[g.thresholds + k], cp.subsets[s].centroids[k + 1]);
      EXPECT_GT(packed->table[g.thresholds + k], cp.subsets[s].centroids[k]);
    }
    if (g.rotation == cuda::kGpuHaar || g.rotation == cuda::kGpuKronecker) {
      EXPECT_NE(g.haar, cuda::kGpuNoTable);
      EXPECT_NE(g.haar_t, cuda::kGpuNoTable);
    }
    if (g.rotation != cuda::kGpuHaar) { EXPECT_NE(g.signs1, cuda::kGpuNoTable); }
    if (g.rotation == cuda::kGpuKronecker) {
      EXPECT_EQ(g.block, g.dim & (~g.dim + 1u));  // 96 = 3 x 32
      const uint32_t q = g.dim / g.block;
      for (uint32_t i = 0; i < q * q; ++i) {
        EXPECT_EQ(packed->table[g.haar + i], packed->table[g.haar_t + (i % q) * q + i / q]);
      }
    } else {
      EXPECT_EQ(g.block, 0u);
    }
  }
  EXPECT_EQ(p.table_floats, packed->table.size());
}

TEST(PackCodecParams, RefusesWhatTheKernelsDoNotCover) {
  auto qjl = Codec::Create(*ParseCodecSpec("tq3,qjl=1"), 128);
  ASSERT_TRUE(qjl.ok()) << qjl.status().ToString();
  auto r = PackCodecParams((*qjl)->params());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find("qjl"), std::string::npos);
  auto big = Codec::Create(*ParseCodecSpec("tq3"), 512);
  ASSERT_TRUE(big.ok());
  r = PackCodecParams((*big)->params());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  auto raw = Codec::Create(*ParseCodecSpec("bf16"), 128);
  ASSERT_TRUE(raw.ok());
  auto rp = PackCodecParams((*raw)->params());
  ASSERT_TRUE(rp.ok());
  EXPECT_EQ(rp->params.kind, cuda::kGpuRaw);
  EXPECT_EQ(rp->params.raw_dtype, cuda::kGpuBF16);
  EXPECT_EQ(rp->params.code_bytes, 256u);
}

TEST(Layout, ChannelSlotMatchesExplicitChannelLists) {
  std::mt19937 rng(3);
  for (uint32_t d : {16u, 64u, 100u, 256u}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<uint8_t> mask((d + 7) / 8, 0);
      std::vector<uint32_t> outl, rest;
      for (uint32_t c = 0; c < d; ++c) {
        if (rng() % 4 == 0) mask[c / 8] |= uint8_t(1u << (c % 8));
      }
      for (uint32_t c = 0; c < d; ++c) ((mask[c / 8] >> (c % 8)) & 1 ? outl : rest).push_back(c);
      const auto k = static_cast<uint32_t>(outl.size());
      for (uint32_t j = 0; j < outl.size(); ++j) EXPECT_EQ(cuda::ChannelSlot(mask.data(), outl[j], k), j);
      for (uint32_t j = 0; j < rest.size(); ++j) {
        EXPECT_EQ(cuda::ChannelSlot(mask.data(), rest[j], k), k + j);
      }
    }
  }
  EXPECT_EQ(cuda::ChannelSlot(nullptr, 77, 0), 77u);
}

TEST(Layout, ConversionPortsMatchTypesH) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = HalfToFloat(static_cast<uint16_t>(h)), b = cuda::HalfBitsToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(cuda::FloatBits(a), cuda::FloatBits(b)) << h;
    ASSERT_EQ(cuda::FloatBits(BF16ToFloat(static_cast<uint16_t>(h))),
              cuda::FloatBits(cuda::BF16BitsToFloat(static_cast<uint16_t>(h))));
  }
  std::mt19937 rng(11);
  std::vector<uint32_t> bits = {0u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u,
                                0x477FF000u, 0x477FEFFFu, 0x33000000u, 0x33000001u, 0x38800000u,
                                0x387FFFFFu, 0x00000001u};
  for (int i = 0; i < 2000000; ++i) bits.push_back(rng());
  for (uint32_t u : bits) {
    const float f = cuda::BitsFloat(u);
    ASSERT_EQ(FloatToHalf(f), cuda::FloatToHalfBits(f)) << std::hex << u;
    ASSERT_EQ(FloatToBF16(f), cuda::FloatToBF16Bits(f)) << std::hex << u;
  }
}

TEST(Layout, RegistersPerLane) {
  EXPECT_EQ(cuda::RegsForHeadDim(16), 2u);
  EXPECT_EQ(cuda::RegsForHeadDim(64), 2u);
  EXPECT_EQ(cuda::RegsForHeadDim(96), 4u);
  EXPECT_EQ(cuda::RegsForHeadDim(128), 4u);
  EXPECT_EQ(cuda::RegsForHeadDim(160), 8u);
  EXPECT_EQ(cuda::RegsForHeadDim(256), 8u);
}

// The paged destination math against vLLM's layout written out independently:
// cache[block][slot][head][dim] with block = block_table[t / block_size], slot = t % block_size.
TEST(Layout, PagedAddressingMatchesVllmLayout) {
  const uint32_t heads = 3, d = 8, bs = 16;
  const std::vector<int64_t> table = {5, 0, 7, 2};  // 4 blocks cover 64 tokens, out of order
  cuda::GpuDst dst = cuda::CanonicalDst(nullptr, heads, d, cuda::kGpuF16);
  dst.block_ids = table.data();
  dst.block_tokens = bs;
  dst.block_stride = int64_t{bs} * heads * d;
  std::vector<int> hits(8 * bs * heads * d, 0);
  for (uint64_t t = 0; t < 64; ++t) {
    for (uint32_t h = 0; h < heads; ++h) {
      for (uint32_t c = 0; c < d; ++c) {
        const uint64_t want = (((static_cast<uint64_t>(table[t / bs]) * bs) + t % bs) * heads + h) * d + c;
        const uint64_t got = cuda::DstElementOffset(dst, t, h, c);
        ASSERT_EQ(got, want);
        ++hits[got];
      }
    }
  }
  // Blocks 5, 0, 7, 2 are filled exactly once; 1, 3, 4, 6 untouched.
  for (uint32_t b = 0; b < 8; ++b) {
    const bool used = b == 5 || b == 0 || b == 7 || b == 2;
    for (uint32_t i = 0; i < bs * heads * d; ++i) ASSERT_EQ(hits[b * bs * heads * d + i], used ? 1 : 0);
  }
  dst.block_tokens = 0;
  EXPECT_EQ(cuda::DstElementOffset(dst, 10, 2, 5), (10u * heads + 2) * d + 5);
}

}  // namespace
}  // namespace tqkv
