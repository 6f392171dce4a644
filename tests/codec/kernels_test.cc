// Kernel layer: the reference primitives, and every SIMD table bit-for-bit against the reference.
#include "codec/kernels/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace tqkv::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Equal bit patterns, or both NaN: NaN payloads may legitimately depend on which operand the
// compiler put first in a commutative scalar operation.
bool SameFloat(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

// Owns the arrays a SubsetPlan points into.
struct TestPlan {
  std::vector<float> signs1, signs2, haar, haar_t, centroids, thresholds;
  SubsetPlan plan;
};

std::vector<double> GaussianMatrix(uint32_t dim, std::mt19937& rng) {
  std::normal_distribution<double> gauss;
  std::vector<double> q(size_t{dim} * dim);
  for (auto& v : q) v = gauss(rng);
  return q;
}

// Gram-Schmidt on a Gaussian matrix (in double): rows orthonormal. One per dim, reused by every
// plan of that dim.
const std::vector<double>& OrthogonalMatrix(uint32_t dim) {
  static std::map<uint32_t, std::vector<double>> cache;
  auto it = cache.find(dim);
  if (it != cache.end()) return it->second;
  std::mt19937 rng(dim);
  std::vector<double> q = GaussianMatrix(dim, rng);
  for (uint32_t r = 0; r < dim; ++r) {
    double* row = &q[size_t{r} * dim];
    for (uint32_t p = 0; p < r; ++p) {
      const double* prev = &q[size_t{p} * dim];
      double dot = 0;
      for (uint32_t k = 0; k < dim; ++k) dot += row[k] * prev[k];
      for (uint32_t k = 0; k < dim; ++k) row[k] -= dot * prev[k];
    }
    double nn = 0;
    for (uint32_t k = 0; k < dim; ++k) nn += row[k] * row[k];
    nn = std::sqrt(nn);
    for (uint32_t k = 0; k < dim; ++k) row[k] /= nn;
  }
  return cache.emplace(dim, std::move(q)).first->second;
}

// orthogonal = false leaves the Haar matrix Gaussian: bit-identity does not need orthogonality, and
// Gram-Schmidt of a 1000+ dim matrix would dominate the test's run time.
TestPlan MakePlan(uint32_t dim, uint32_t bits, RotationKind rot, DType norm_dtype, bool nc,
                  std::mt19937& rng, bool orthogonal = true) {
  TestPlan t;
  std::normal_distribution<double> gauss;
  std::uniform_int_distribution<int> coin(0, 1);
  for (uint32_t i = 0; i < dim; ++i) {
    t.signs1.push_back(coin(rng) ? 1.0f : -1.0f);
    t.signs2.push_back(coin(rng) ? 1.0f : -1.0f);
  }
  // Kronecker: the q*q factor, q = dim / B, B the largest power of two dividing dim.
  const uint32_t block = rot == RotationKind::kKronecker ? (dim & (~dim + 1u)) : 0;
  if (rot == RotationKind::kHaar || rot == RotationKind::kKronecker) {
    const uint32_t n = rot == RotationKind::kHaar ? dim : dim / block;
    const std::vector<double> q = orthogonal ? OrthogonalMatrix(n) : GaussianMatrix(n, rng);
    t.haar.resize(q.size());
    t.haar_t.resize(q.size());
    for (uint32_t r = 0; r < n; ++r) {
      for (uint32_t c = 0; c < n; ++c) {
        t.haar[size_t{r} * n + c] = static_cast<float>(q[size_t{r} * n + c]);
        t.haar_t[size_t{c} * n + r] = static_cast<float>(q[size_t{r} * n + c]);
      }
    }
  }
  const size_t levels = size_t{1} << bits;
  // Symmetric codebooks on odd seeds: the middle threshold is then exactly 0, which the many exact
  // zeros of a Hadamard transform of all-equal inputs hit (strict compare).
  const bool symmetric = rng() & 1;
  while (t.centroids.size() < levels) {
    t.centroids.clear();
    for (size_t k = 0; k < levels; ++k) {
      const float c = static_cast<float>(gauss(rng));
      t.centroids.push_back(symmetric && k >= levels / 2 ? -t.centroids[levels - 1 - k] : c);
    }
    std::sort(t.centroids.begin(), t.centroids.end());
    t.centroids.erase(std::unique(t.centroids.begin(), t.centroids.end()), t.centroids.end());
  }
  for (size_t k = 0; k + 1 < levels; ++k) {
    t.thresholds.push_back(0.5f * (t.centroids[k] + t.centroids[k + 1]));
  }
  const double m = dim;
  double enc = 1, dec = 1 / m;
  if (rot == RotationKind::kHadamard2) {
    enc = 1 / std::sqrt(m);
    dec = 1 / (m * std::sqrt(m));
  } else if (rot == RotationKind::kHaar) {
    enc = std::sqrt(m);
    dec = 1 / std::sqrt(m);
  } else if (rot == RotationKind::kKronecker) {
    enc = std::sqrt(m / block);
    dec = 1 / std::sqrt(m * block);
  }
  SubsetPlan& p = t.plan;
  p.dim = dim;
  p.bits = bits;
  p.rotation = rot;
  p.block = block;
  p.signs1 = t.signs1.data();
  p.signs2 = t.signs2.data();
  p.haar = t.haar.empty() ? nullptr : t.haar.data();
  p.haar_t = t.haar_t.empty() ? nullptr : t.haar_t.data();
  p.centroids = t.centroids.data();
  p.thresholds = t.thresholds.data();
  p.enc_scale = static_cast<float>(enc);
  p.dec_scale = static_cast<float>(dec);
  p.norm_correction = nc;
  p.norm_dtype = norm_dtype;
  return t;
}

// Random Gaussian vectors followed by the edge cases, `stride` floats apart.
std::vector<float> MakeInputs(uint32_t dim, size_t stride, size_t* n, std::mt19937& rng) {
  std::normal_distribution<float> gauss;
  std::vector<std::vector<float>> vecs;
  for (int i = 0; i < 24; ++i) {
    std::vector<float> v(dim);
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    for (auto& x : v) x = gauss(rng) * scale;
    vecs.push_back(v);
  }
  auto filled = [&](float value) { return std::vector<float>(dim, value); };
  vecs.push_back(filled(0.0f));
  vecs.push_back(filled(-0.0f));
  vecs.push_back(filled(1.0f));
  vecs.push_back(filled(-3.5f));
  vecs.push_back(filled(1e-40f));  // denormal: squares underflow to 0
  vecs.push_back(filled(1e-20f));  // squares denormal-ish
  vecs.push_back(filled(1e18f));   // squares overflow
  vecs.push_back(filled(3e37f));
  vecs.push_back(filled(std::numeric_limits<float>::denorm_min()));
  for (float special : {kInf, -kInf, kNaN, 1e30f, 1e-38f}) {
    std::vector<float> v(dim);
    for (auto& x : v) x = gauss(rng);
    v[rng() % dim] = special;
    vecs.push_back(v);
  }
  {  // one large coordinate among small ones
    std::vector<float> v(dim, 1e-3f);
    v[0] = 1e6f;
    vecs.push_back(v);
  }
  {  // only denormals, random signs
    std::vector<float> v(dim);
    for (auto& x : v) x = (rng() & 1 ? -1.0f : 1.0f) * 1e-41f * static_cast<float>(rng() % 100);
    vecs.push_back(v);
  }
  {  // alternating magnitudes; also makes the count odd, so batched kernels see partial batches
    std::vector<float> v(dim);
    for (size_t i = 0; i < dim; ++i) v[i] = (i % 2 ? -1e3f : 1e-3f) * static_cast<float>(i + 1);
    vecs.push_back(v);
  }
  *n = vecs.size();
  std::vector<float> out(*n * stride, 12345.0f);
  for (size_t i = 0; i < *n; ++i) std::copy(vecs[i].begin(), vecs[i].end(), &out[i * stride]);
  return out;
}

std::vector<uint32_t> DimsFor(RotationKind rot) {
  if (rot == RotationKind::kHaar) return {3, 8, 16, 20, 32, 64, 96, 128, 256};
  // q = 1 (a power of two), odd q with B = 8..64 (SIMD), B < 8 and odd sizes (reference fallback).
  if (rot == RotationKind::kKronecker) return {5, 12, 20, 24, 40, 48, 64, 72, 96, 120, 192, 320};
  return {8, 16, 32, 64, 128, 256, 512};
}

// Every table this CPU runs: one per level, and both builds of the AVX-512 kernels.
std::vector<const KernelTable*> SimdTables() {
  std::vector<const KernelTable*> tables;
  for (SimdLevel level : SupportedSimdLevels()) tables.push_back(&KernelsFor(level));
  const std::vector<const KernelTable*> avx512 = Avx512KernelVariants();
  if (avx512.size() > 1) tables.push_back(avx512[1]);
  return tables;
}

std::string Describe(const SubsetPlan& p, const KernelTable& t) {
  return std::string(t.name) + " dim=" + std::to_string(p.dim) + " bits=" + std::to_string(p.bits) +
         " rot=" + std::to_string(static_cast<int>(p.rotation)) +
         " norm=" + std::string(DTypeName(p.norm_dtype)) +
         " nc=" + std::to_string(p.norm_correction);
}

TEST(KernelsDispatch, TablesMatchLevels) {
  EXPECT_STREQ(KernelsFor(SimdLevel::kScalar).name, "scalar");
  EXPECT_STREQ(ScalarKernels().name, "scalar");
  if (SimdLevelSupported(SimdLevel::kAvx2)) {
    ASSERT_NE(Avx2Kernels(), nullptr);
    EXPECT_EQ(&KernelsFor(SimdLevel::kAvx2), Avx2Kernels());
  } else {
    EXPECT_EQ(Avx2Kernels(), nullptr);
    EXPECT_EQ(&KernelsFor(SimdLevel::kAvx2), &ScalarKernels());
  }
  if (SimdLevelSupported(SimdLevel::kAvx512)) {
    ASSERT_NE(Avx512Kernels(), nullptr);
    EXPECT_EQ(&KernelsFor(SimdLevel::kAvx512), Avx512Kernels());
    // Two builds of the AVX-512 kernels; the FWHT choice follows the vendor (kernels.h).
    const std::vector<const KernelTable*> v = Avx512KernelVariants();
    ASSERT_EQ(v.size(), 2u);
    EXPECT_EQ(v[0], Avx512Kernels());
#if defined(__x86_64__)
    const bool intel = __builtin_cpu_is("intel") != 0;
#else
    const bool intel = false;
#endif
    EXPECT_STREQ(v[0]->name, intel ? "avx512-fma8" : "avx512");
    EXPECT_STREQ(v[1]->name, intel ? "avx512" : "avx512-fma8");
  } else {
    EXPECT_EQ(Avx512Kernels(), nullptr);
    EXPECT_TRUE(Avx512KernelVariants().empty());
  }
  // Every supported level has a table that is not the reference (scalar aside).
  for (SimdLevel level : SupportedSimdLevels()) {
    if (level == SimdLevel::kScalar) continue;
    EXPECT_NE(&KernelsFor(level), &ScalarKernels()) << SimdLevelName(level);
  }
  ASSERT_TRUE(ForceSimdLevel(SimdLevel::kScalar).ok());
  EXPECT_EQ(&ActiveKernels(), &ScalarKernels());
  ResetSimdLevel();
  EXPECT_EQ(&ActiveKernels(), &KernelsFor(ActiveSimdLevel()));
}

// The levels every table comparison in this file runs, printed for the CI log; on AArch64 the
// NEON table must be among them, or the comparisons would test only the reference.
TEST(KernelsDispatch, NeonTableOnAarch64Only) {
  std::string names;
  for (SimdLevel level : SupportedSimdLevels()) names += " " + std::string(SimdLevelName(level));
  std::printf("simd levels:%s\n", names.c_str());
#if defined(__aarch64__)
  EXPECT_TRUE(SimdLevelSupported(SimdLevel::kNeon));
  ASSERT_NE(NeonKernels(), nullptr);
  EXPECT_EQ(&KernelsFor(SimdLevel::kNeon), NeonKernels());
  EXPECT_STREQ(NeonKernels()->name, "neon");
  EXPECT_EQ(BestSimdLevel(), SimdLevel::kNeon);
#else
  EXPECT_FALSE(SimdLevelSupported(SimdLevel::kNeon));
  EXPECT_EQ(NeonKernels(), nullptr);
  EXPECT_EQ(&KernelsFor(SimdLevel::kNeon), &ScalarKernels());
#endif
}

TEST(KernelsRef, Sum8SquaresOrder) {
  std::vector<float> v(21);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * static_cast<float>(i) - 0.7f;
  float acc[8] = {};
  for (size_t i = 0; i < v.size(); ++i) acc[i % 8] += v[i] * v[i];
  const float want =
      ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
  EXPECT_EQ(std::bit_cast<uint32_t>(ref::Sum8Squares(v.data(), v.size())),
            std::bit_cast<uint32_t>(want));
  EXPECT_EQ(ref::Sum8Squares(v.data(), 0), 0.0f);
}

TEST(KernelsRef, FwhtOfBasisVectorIsHadamardRow) {
  for (size_t m : {1u, 2u, 8u, 64u, 256u}) {
    for (size_t k = 0; k < m; k += (m > 8 ? 7 : 1)) {
      std::vector<float> y(m, 0.0f);
      y[k] = 1.0f;
      ref::Fwht(y.data(), m);
      for (size_t j = 0; j < m; ++j) {
        const float want = std::popcount(j & k) % 2 ? -1.0f : 1.0f;
        ASSERT_EQ(y[j], want) << "m=" << m << " k=" << k << " j=" << j;
      }
    }
  }
}

TEST(KernelsRef, FwhtTwiceScalesByM) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> small(-50, 50);
  std::vector<float> x(128), y(128);
  for (auto& v : x) v = static_cast<float>(small(rng));
  y = x;
  ref::Fwht(y.data(), y.size());
  ref::Fwht(y.data(), y.size());
  for (size_t j = 0; j < x.size(); ++j) EXPECT_EQ(y[j], 128.0f * x[j]);  // small ints: exact
}

TEST(KernelsRef, MatVecTIsColumnAccumulationWithFma) {
  std::mt19937 rng(4);
  std::normal_distribution<float> gauss;
  const size_t m = 13;
  std::vector<float> mt(m * m), x(m), y(m), want(m, 0.0f);
  for (auto& v : mt) v = gauss(rng);
  for (auto& v : x) v = gauss(rng);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < m; ++j) want[j] = std::fma(mt[i * m + j], x[i], want[j]);
  }
  ref::MatVecT(mt.data(), x.data(), m, y.data());
  for (size_t j = 0; j < m; ++j) EXPECT_EQ(y[j], want[j]);
}

TEST(KernelsRef, KronMixIsBlockwiseFmaInOrder) {
  std::mt19937 rng(41);
  std::normal_distribution<float> gauss;
  const size_t q = 3, block = 8, m = q * block;
  std::vector<float> mt(q * q), x(m), y(m);
  for (auto& v : mt) v = gauss(rng);
  for (auto& v : x) v = gauss(rng);
  ref::KronMix(mt.data(), x.data(), q, block, y.data());
  for (size_t a = 0; a < q; ++a) {
    for (size_t b = 0; b < block; ++b) {
      float want = 0.0f;
      for (size_t a2 = 0; a2 < q; ++a2) want = std::fma(mt[a2 * q + a], x[a2 * block + b], want);
      EXPECT_EQ(std::bit_cast<uint32_t>(y[a * block + b]), std::bit_cast<uint32_t>(want));
    }
  }
}

TEST(KernelsRef, QuantizeCountsThresholdsStrictlyBelow) {
  std::mt19937 rng(5);
  for (uint32_t bits = 1; bits <= 8; ++bits) {
    std::vector<float> t((1u << bits) - 1);
    for (size_t k = 0; k < t.size(); ++k) t[k] = static_cast<float>(k) - t.size() / 2.0f;
    std::vector<float> zs = {kNaN, -kNaN, kInf, -kInf, 0.0f, -0.0f};
    for (float v : t) {
      zs.push_back(v);
      zs.push_back(std::nextafter(v, kInf));
      zs.push_back(std::nextafter(v, -kInf));
    }
    std::uniform_real_distribution<float> uni(-200.0f, 200.0f);
    for (int i = 0; i < 200; ++i) zs.push_back(uni(rng));
    for (float z : zs) {
      uint32_t want = 0;
      for (float v : t) want += v < z;
      ASSERT_EQ(ref::Quantize(z, t.data(), bits), want) << "bits=" << bits << " z=" << z;
    }
  }
}

TEST(KernelsRef, PackPlanesLayoutAndRoundTrip) {
  // Known layout: idx[j] = j for 8 entries at 3 bits.
  uint8_t idx8[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  uint8_t planes[3];
  ref::PackPlanes(idx8, 8, 3, planes);
  EXPECT_EQ(planes[0], 0xAA);
  EXPECT_EQ(planes[1], 0xCC);
  EXPECT_EQ(planes[2], 0xF0);

  std::mt19937 rng(6);
  for (size_t m = 1; m <= 41; ++m) {
    for (uint32_t bits = 1; bits <= 8; ++bits) {
      std::vector<uint8_t> idx(m), back(m);
      for (auto& v : idx) v = static_cast<uint8_t>(rng() & ((1u << bits) - 1));
      const size_t pb = (m + 7) / 8;
      std::vector<uint8_t> pl(bits * pb, 0x5A);
      ref::PackPlanes(idx.data(), m, bits, pl.data());
      for (uint32_t p = 0; p < bits; ++p) {  // padding bits of the last byte are zero
        if (m % 8) {
          ASSERT_EQ(pl[p * pb + pb - 1] >> (m % 8), 0);
        }
      }
      ref::UnpackPlanes(pl.data(), m, bits, back.data());
      ASSERT_EQ(idx, back) << "m=" << m << " bits=" << bits;
    }
  }
}

TEST(KernelsRef, EncodeZeroAndNonFiniteNorms) {
  std::mt19937 rng(7);
  for (DType nd : {DType::kF32, DType::kF16}) {
    TestPlan t = MakePlan(16, 3, RotationKind::kHadamard, nd, true, rng);
    const size_t nb = DTypeSize(nd), stride = nb + t.plan.planes_bytes();
    std::vector<float> x(3 * 16, 0.0f);
    x[16 + 5] = kNaN;
    x[32 + 1] = kInf;
    std::vector<uint8_t> code(3 * stride, 0xEE);
    ScalarKernels().encode(t.plan, x.data(), 16, 3, code.data(), code.data() + nb, stride);
    for (int v = 0; v < 3; ++v) {
      const uint8_t* c = &code[v * stride];
      const float norm = nd == DType::kF32
                             ? std::bit_cast<float>(uint32_t{c[0]} | uint32_t{c[1]} << 8 |
                                                    uint32_t{c[2]} << 16 | uint32_t{c[3]} << 24)
                             : HalfToFloat(uint16_t(c[0] | c[1] << 8));
      if (v == 0) {
        EXPECT_EQ(std::bit_cast<uint32_t>(norm), 0u);
      } else {
        EXPECT_TRUE(std::isnan(norm));
        if (nd == DType::kF32) {
          EXPECT_EQ(std::bit_cast<uint32_t>(norm), 0x7FC00000u);
        } else {
          EXPECT_EQ(c[0] | c[1] << 8, 0x7E00);
        }
      }
      for (size_t b = nb; b < stride; ++b) EXPECT_EQ(c[b], 0) << v;
    }
  }
}

// Decode(Encode(x)) stays close to x at 8 bits: catches scale or rotation mix-ups that a
// ref-vs-SIMD comparison cannot.
TEST(KernelsRef, RoundTripIsAccurate) {
  std::mt19937 rng(8);
  std::normal_distribution<float> gauss;
  for (RotationKind rot : {RotationKind::kHadamard, RotationKind::kHadamard2, RotationKind::kHaar,
                           RotationKind::kKronecker}) {
    // 96 = 3 * 32 for the Kronecker kind, so its q*q mix is exercised.
    TestPlan t = MakePlan(rot == RotationKind::kKronecker ? 96 : 64, 8, rot, DType::kF32, false,
                          rng);
    for (size_t k = 0; k < t.centroids.size(); ++k) {  // uniform grid over [-4, 4]
      t.centroids[k] = -4.0f + 8.0f * static_cast<float>(k) / 255.0f;
    }
    for (size_t k = 0; k + 1 < t.centroids.size(); ++k) {
      t.thresholds[k] = 0.5f * (t.centroids[k] + t.centroids[k + 1]);
    }
    const size_t m = t.plan.dim;
    std::vector<float> x(m), y(m);
    for (auto& v : x) v = gauss(rng) * 3.0f;
    std::vector<uint8_t> code(4 + t.plan.planes_bytes());
    ScalarKernels().encode(t.plan, x.data(), m, 1, code.data(), code.data() + 4, code.size());
    ScalarKernels().decode(t.plan, code.data(), code.data() + 4, code.size(), 1, y.data(), m);
    double err = 0, ref = 0;
    for (size_t j = 0; j < m; ++j) {
      err += (x[j] - y[j]) * (x[j] - y[j]);
      ref += x[j] * x[j];
    }
    EXPECT_LT(err / ref, 1e-3) << static_cast<int>(rot);
  }
}

void ExpectMatchesReference(RotationKind rot) {
  std::mt19937 rng(42 + static_cast<int>(rot));
  const KernelTable& scalar = ScalarKernels();
  {
    for (uint32_t dim : DimsFor(rot)) {
      for (uint32_t bits = 1; bits <= 8; ++bits) {
        for (DType nd : {DType::kF32, DType::kF16}) {
          for (bool nc : {false, true}) {
            // Large dense rotations are slow in the reference: two of the four norm variants.
            if (rot == RotationKind::kHaar && dim >= 128 && nc != (nd == DType::kF16)) continue;
            TestPlan t = MakePlan(dim, bits, rot, nd, nc, rng);
            const SubsetPlan& p = t.plan;
            // Gaps between vectors on odd bit widths; packed (sanitizers see overruns) on even.
            const size_t gap = bits % 2;
            const size_t x_stride = dim + 3 * gap;
            size_t n = 0;
            const std::vector<float> x = MakeInputs(dim, x_stride, &n, rng);
            const size_t nb = DTypeSize(nd);
            const size_t code_stride = nb + p.planes_bytes() + 5 * gap;
            std::vector<uint8_t> want(n * code_stride, 0xCD);
            scalar.encode(p, x.data(), x_stride, n, want.data(), want.data() + nb, code_stride);

            // Extra decode inputs: all-zero and all-one planes with assorted norms.
            std::vector<uint8_t> codes = want;
            for (uint8_t fill : {0x00, 0xFF}) {
              for (float norm : {1.0f, 0.0f, 7.5e-5f, 6e4f, kInf, kNaN, 1e-45f}) {
                std::vector<uint8_t> c(code_stride, fill);
                if (nd == DType::kF32) {
                  std::memcpy(c.data(), &norm, 4);
                } else {
                  const uint16_t h = FloatToHalf(norm);
                  std::memcpy(c.data(), &h, 2);
                }
                codes.insert(codes.end(), c.begin(), c.end());
              }
            }
            // encode_unit (the transform codec's blocks): the planes of each vector with its
            // norm taken as 1, the norm's bytes untouched.
            std::vector<uint8_t> want_unit(n * code_stride, 0xCD);
            scalar.encode_unit(p, x.data(), x_stride, n, want_unit.data() + nb, code_stride);
            const size_t n_dec = codes.size() / code_stride;
            const size_t out_stride = dim + gap;
            std::vector<float> want_out(n_dec * out_stride, -1.0f);
            scalar.decode(p, codes.data(), codes.data() + nb, code_stride, n_dec, want_out.data(),
                          out_stride);

            for (const KernelTable* table : SimdTables()) {
              SCOPED_TRACE(Describe(p, *table));
              std::vector<uint8_t> got(n * code_stride, 0xCD);
              table->encode(p, x.data(), x_stride, n, got.data(), got.data() + nb, code_stride);
              for (size_t v = 0; v < n; ++v) {
                ASSERT_EQ(0,
                          std::memcmp(&got[v * code_stride], &want[v * code_stride], code_stride))
                    << "vector " << v;
              }
              ASSERT_NE(table->encode_unit, nullptr);
              std::vector<uint8_t> got_unit(n * code_stride, 0xCD);
              table->encode_unit(p, x.data(), x_stride, n, got_unit.data() + nb, code_stride);
              for (size_t v = 0; v < n; ++v) {
                ASSERT_EQ(0, std::memcmp(&got_unit[v * code_stride], &want_unit[v * code_stride],
                                         code_stride))
                    << "encode_unit, vector " << v;
              }
              std::vector<float> got_out(n_dec * out_stride, -1.0f);
              table->decode(p, codes.data(), codes.data() + nb, code_stride, n_dec, got_out.data(),
                            out_stride);
              for (size_t i = 0; i < got_out.size(); ++i) {
                ASSERT_TRUE(SameFloat(got_out[i], want_out[i]))
                    << "vector " << i / out_stride << " lane " << i % out_stride << ": "
                    << got_out[i] << " vs " << want_out[i];
              }
            }
          }
        }
      }
    }
  }
}

// whiten (the transform codec's encode): norms and whitened rows of every table against the
// reference bit for bit, for head dims each SIMD level takes or falls back on, rows a shuffled
// subset of the channels with scales above, at and below 0 (and NaN), a zero vector, a NaN and an
// infinite entry, strided rows.
TEST(KernelsSimd, WhitenMatchesReference) {
  std::mt19937 rng(50);
  std::normal_distribution<float> gauss;
  for (size_t d : {8u, 13u, 16u, 64u, 128u, 136u, 256u}) {
    for (size_t rows : {d, d - d / 8, size_t{1}}) {
      SCOPED_TRACE("d=" + std::to_string(d) + " rows=" + std::to_string(rows));
      const size_t n = 11, x_stride = d + 5, w_stride = rows + 3;
      std::vector<float> x(n * x_stride);
      for (size_t i = 0; i < n; ++i) {
        const float sc = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
        for (size_t c = 0; c < d; ++c) x[i * x_stride + c] = i == 3 ? 0.0f : gauss(rng) * sc;
      }
      x[5 * x_stride + d / 2] = std::numeric_limits<float>::quiet_NaN();
      x[7 * x_stride] = std::numeric_limits<float>::infinity();
      std::vector<uint32_t> channel(d);
      std::iota(channel.begin(), channel.end(), 0u);
      std::shuffle(channel.begin(), channel.end(), rng);
      channel.resize(rows);
      std::vector<float> mean(rows), scale(rows);
      for (size_t r = 0; r < rows; ++r) {
        mean[r] = 0.1f * gauss(rng);
        scale[r] = r % 9 == 4 ? 0.0f : r % 9 == 7 ? -0.5f : std::abs(gauss(rng)) + 1e-3f;
      }
      if (rows > 2) scale[2] = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> want_n(n), want_w(n * w_stride, -7.0f);
      ScalarKernels().whiten(x.data(), x_stride, n, d, channel.data(), mean.data(), scale.data(),
                             rows, want_n.data(), want_w.data(), w_stride);
      EXPECT_EQ(want_n[3], 0.0f);
      for (const KernelTable* table : SimdTables()) {
        ASSERT_NE(table->whiten, nullptr);
        SCOPED_TRACE(table->name);
        std::vector<float> got_n(n), got_w(n * w_stride, -7.0f);
        table->whiten(x.data(), x_stride, n, d, channel.data(), mean.data(), scale.data(), rows,
                      got_n.data(), got_w.data(), w_stride);
        for (size_t i = 0; i < n; ++i) ASSERT_TRUE(SameFloat(got_n[i], want_n[i])) << i;
        for (size_t j = 0; j < got_w.size(); ++j) {
          ASSERT_TRUE(SameFloat(got_w[j], want_w[j])) << j << ": " << got_w[j] << " " << want_w[j];
        }
      }
    }
  }
}

// unit_moments (the transform codec's metadata): sums, count and largest norm of every table
// against the reference bit for bit, added onto earlier sums in two calls, zero/NaN/inf vectors
// skipped, head dims each SIMD level takes or falls back on.
TEST(KernelsSimd, UnitMomentsMatchReference) {
  std::mt19937 rng(51);
  std::normal_distribution<float> gauss;
  for (size_t d : {8u, 13u, 16u, 64u, 128u, 136u, 256u}) {
    SCOPED_TRACE("d=" + std::to_string(d));
    const size_t n = 23, x_stride = d + 3;
    std::vector<float> x(n * x_stride);
    for (size_t i = 0; i < n; ++i) {
      const float sc = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
      for (size_t c = 0; c < d; ++c) x[i * x_stride + c] = i == 3 ? 0.0f : gauss(rng) * sc + 0.1f;
    }
    x[5 * x_stride + d / 2] = std::numeric_limits<float>::quiet_NaN();
    x[7 * x_stride] = std::numeric_limits<float>::infinity();
    std::vector<double> start1(d), start2(d);
    for (size_t c = 0; c < d; ++c) {
      start1[c] = gauss(rng);
      start2[c] = std::abs(gauss(rng));
    }
    const auto run = [&](const KernelTable& k, std::vector<double>& s1, std::vector<double>& s2,
                         size_t& count, float& largest) {
      s1 = start1;
      s2 = start2;
      count = 2;
      largest = 0.5f;
      k.unit_moments(x.data(), x_stride, 9, d, s1.data(), s2.data(), &count, &largest);
      k.unit_moments(x.data() + 9 * x_stride, x_stride, n - 9, d, s1.data(), s2.data(), &count,
                     &largest);
    };
    std::vector<double> w1, w2;
    size_t wc = 0;
    float wl = 0;
    run(ScalarKernels(), w1, w2, wc, wl);
    EXPECT_EQ(wc, 2 + n - 3);  // the zero, NaN and infinite vectors have no say
    for (const KernelTable* table : SimdTables()) {
      ASSERT_NE(table->unit_moments, nullptr);
      SCOPED_TRACE(table->name);
      std::vector<double> g1, g2;
      size_t gc = 0;
      float gl = 0;
      run(*table, g1, g2, gc, gl);
      EXPECT_EQ(gc, wc);
      EXPECT_EQ(std::bit_cast<uint32_t>(gl), std::bit_cast<uint32_t>(wl));
      ASSERT_EQ(0, std::memcmp(g1.data(), w1.data(), d * sizeof(double)));
      ASSERT_EQ(0, std::memcmp(g2.data(), w2.data(), d * sizeof(double)));
    }
  }
}

// encode_unit is encode of a vector whose norm is exactly 1 (here four entries of +-0.5), less
// the norm: the same planes in the reference and every table.
TEST(KernelsSimd, EncodeUnitIsEncodeAtNormOne) {
  std::mt19937 rng(49);
  for (uint32_t dim : {8u, 16u, 32u, 64u, 128u, 256u}) {
    for (uint32_t bits = 1; bits <= 8; ++bits) {
      TestPlan t = MakePlan(dim, bits, RotationKind::kHadamard, DType::kF16, false, rng);
      const SubsetPlan& p = t.plan;
      const size_t n = 9, code_stride = 2 + p.planes_bytes();
      std::vector<float> x(n * dim, 0.0f);
      for (size_t v = 0; v < n; ++v) {
        for (int k = 0; k < 4; ++k) x[v * dim + (v + 2 * k) % dim] = rng() % 2 ? 0.5f : -0.5f;
      }
      std::vector<uint8_t> want(n * code_stride);
      ScalarKernels().encode(p, x.data(), dim, n, want.data(), want.data() + 2, code_stride);
      std::vector<const KernelTable*> tables = SimdTables();
      tables.insert(tables.begin(), &ScalarKernels());
      for (const KernelTable* table : tables) {
        ASSERT_NE(table->encode_unit, nullptr);
        SCOPED_TRACE(Describe(p, *table));
        std::vector<uint8_t> got(n * code_stride, 0xCD);
        table->encode_unit(p, x.data(), dim, n, got.data() + 2, code_stride);
        for (size_t v = 0; v < n; ++v) {
          EXPECT_EQ(got[v * code_stride], 0xCD);  // no norm written
          ASSERT_EQ(0, std::memcmp(&got[v * code_stride + 2], &want[v * code_stride + 2],
                                   p.planes_bytes()))
              << "vector " << v;
        }
      }
    }
  }
}

// Every table against the reference: codes byte for byte, decoded floats bit for bit.
TEST(KernelsSimd, HadamardMatchesReference) { ExpectMatchesReference(RotationKind::kHadamard); }
TEST(KernelsSimd, Hadamard2MatchesReference) { ExpectMatchesReference(RotationKind::kHadamard2); }
TEST(KernelsSimd, HaarMatchesReference) { ExpectMatchesReference(RotationKind::kHaar); }
TEST(KernelsSimd, KroneckerMatchesReference) { ExpectMatchesReference(RotationKind::kKronecker); }

// Shapes the SIMD tables hand to the reference (odd dims, dims beyond their stack buffers) and
// empty batches.
TEST(KernelsSimd, FallbackShapesAndEmptyBatches) {
  std::mt19937 rng(43);
  struct Shape {
    uint32_t dim;
    RotationKind rot;
  };
  for (Shape shape : {Shape{2048, RotationKind::kHadamard}, Shape{1, RotationKind::kHaar},
                      Shape{12, RotationKind::kHaar}, Shape{1040, RotationKind::kHaar},
                      Shape{1040, RotationKind::kKronecker}, Shape{36, RotationKind::kKronecker}}) {
    TestPlan t = MakePlan(shape.dim, 3, shape.rot, DType::kF16, true, rng, false);
    size_t n = 0;
    const std::vector<float> x = MakeInputs(shape.dim, shape.dim, &n, rng);
    n = std::min<size_t>(n, 6);
    const size_t stride = 2 + t.plan.planes_bytes();
    std::vector<uint8_t> want(n * stride), got(n * stride);
    std::vector<float> want_out(n * shape.dim), got_out(n * shape.dim);
    ScalarKernels().encode(t.plan, x.data(), shape.dim, n, want.data(), want.data() + 2, stride);
    ScalarKernels().decode(t.plan, want.data(), want.data() + 2, stride, n, want_out.data(),
                           shape.dim);
    for (const KernelTable* table : SimdTables()) {
      SCOPED_TRACE(Describe(t.plan, *table));
      table->encode(t.plan, x.data(), shape.dim, n, got.data(), got.data() + 2, stride);
      EXPECT_EQ(got, want);
      table->decode(t.plan, want.data(), want.data() + 2, stride, n, got_out.data(), shape.dim);
      for (size_t i = 0; i < got_out.size(); ++i) ASSERT_TRUE(SameFloat(got_out[i], want_out[i]));
      // n = 0 touches nothing.
      table->encode(t.plan, nullptr, shape.dim, 0, nullptr, nullptr, stride);
      table->decode(t.plan, nullptr, nullptr, stride, 0, nullptr, shape.dim);
      table->to_f32(nullptr, DType::kF16, 0, nullptr);
      table->from_f32(nullptr, 0, DType::kBF16, nullptr);
    }
  }
}

// The split gather/scatter of every table against the reference, and scatter(gather(x)) == x:
// random masks, masks packed into single bytes, d with a tail (d % 8 != 0), strided vectors.
TEST(KernelsSimd, SplitGatherScatterMatchReference) {
  std::mt19937 rng(44);
  std::normal_distribution<float> gauss;
  for (size_t d : {16u, 20u, 64u, 96u, 128u, 130u, 256u}) {
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<uint8_t> mask((d + 7) / 8, 0);
      size_t m0 = 0;
      for (size_t c = 0; c < d; ++c) {
        const bool set = trial == 0 ? c < 8 : trial == 1 ? c >= d - 5 : (rng() % 4 == 0);
        if (set) {
          mask[c / 8] |= uint8_t(1u << (c % 8));
          ++m0;
        }
      }
      const size_t m1 = d - m0, n = 5, stride = d + 3;
      std::vector<float> x(n * stride);
      for (auto& v : x) v = gauss(rng);
      std::vector<float> want0(n * m0 + kSplitSlack), want1(n * m1 + kSplitSlack);
      ScalarKernels().split_gather(x.data(), stride, n, mask.data(), d, want0.data(), m0,
                                   want1.data(), m1);
      std::vector<float> back(n * stride, -7.0f);
      ScalarKernels().split_scatter(want0.data(), m0, want1.data(), m1, n, mask.data(), d,
                                    back.data(), stride);
      for (size_t i = 0; i < n; ++i) {
        for (size_t c = 0; c < d; ++c) ASSERT_EQ(back[i * stride + c], x[i * stride + c]);
        for (size_t c = d; c < stride; ++c) ASSERT_EQ(back[i * stride + c], -7.0f);
      }
      for (const KernelTable* table : SimdTables()) {
        SCOPED_TRACE(std::string(table->name) + " d=" + std::to_string(d) +
                     " m0=" + std::to_string(m0));
        std::vector<float> got0(want0.size(), 9.0f), got1(want1.size(), 9.0f);
        table->split_gather(x.data(), stride, n, mask.data(), d, got0.data(), m0, got1.data(), m1);
        for (size_t j = 0; j < n * m0; ++j) ASSERT_EQ(got0[j], want0[j]) << j;
        for (size_t j = 0; j < n * m1; ++j) ASSERT_EQ(got1[j], want1[j]) << j;
        std::vector<float> got(n * stride, -7.0f);
        table->split_scatter(want0.data(), m0, want1.data(), m1, n, mask.data(), d, got.data(),
                             stride);
        ASSERT_EQ(got, back);
      }
    }
  }
}

// The mean-removed keys' add of every table against the reference, bit for bit: d with a tail,
// strided vectors, padding between vectors untouched.
TEST(KernelsSimd, AddScaledMatchesReference) {
  std::mt19937 rng(45);
  std::normal_distribution<float> gauss;
  for (size_t d : {1u, 7u, 8u, 20u, 64u, 128u, 130u, 256u}) {
    const size_t n = 9, stride = d + 5;
    std::vector<float> mean(d), scale(n), x(n * stride);
    for (auto& v : mean) v = 30.0f * gauss(rng);
    for (auto& v : scale) v = gauss(rng);
    for (auto& v : x) v = gauss(rng);
    std::vector<float> want = x;
    ScalarKernels().add_scaled(mean.data(), scale.data(), n, d, want.data(), stride);
    for (size_t i = 0; i < n; ++i) {
      for (size_t c = 0; c < d; ++c) {
        const float p = scale[i] * mean[c];  // rounded product, then the add
        ASSERT_EQ(want[i * stride + c], x[i * stride + c] + p);
      }
      for (size_t c = d; c < stride; ++c) ASSERT_EQ(want[i * stride + c], x[i * stride + c]);
    }
    for (const KernelTable* table : SimdTables()) {
      SCOPED_TRACE(std::string(table->name) + " d=" + std::to_string(d));
      std::vector<float> got = x;
      table->add_scaled(mean.data(), scale.data(), n, d, got.data(), stride);
      for (size_t j = 0; j < got.size(); ++j) ASSERT_EQ(got[j], want[j]) << j;
    }
  }
}

// The transform codec's gather_affine of every table against the reference, bit for bit: any
// permutation with repeats, d with a tail, strided rows and outputs, padding untouched; vector
// counts below, at and past a batch of 8, positions within whole registers of the row or not.
TEST(KernelsSimd, GatherAffineMatchesReference) {
  std::mt19937 rng(46);
  std::normal_distribution<float> gauss;
  for (size_t d : {1u, 8u, 13u, 16u, 64u, 128u, 200u, 256u})
  for (size_t n : {7u, 8u, 21u})
  for (bool whole : {false, true}) {
    SCOPED_TRACE("n=" + std::to_string(n) + (whole ? " whole registers" : ""));
    const size_t row_stride = d + 3, out_stride = d + 5;
    std::vector<float> row(n * row_stride), a(d), b(d), norms(n), out(n * out_stride);
    std::vector<uint32_t> from(d);
    for (auto& v : row) v = gauss(rng);
    for (auto& v : a) v = gauss(rng);
    for (size_t c = 0; c < d; ++c) b[c] = c % 5 == 0 ? 0.0f : gauss(rng);  // 0-bit channels
    for (auto& v : norms) v = 100.0f * std::abs(gauss(rng));
    for (auto& v : out) v = gauss(rng);
    const size_t span = whole && row_stride >= 8 ? row_stride / 8 * 8 : row_stride;
    for (auto& f : from) f = static_cast<uint32_t>(rng() % span);
    std::vector<float> want = out;
    ScalarKernels().gather_affine(row.data(), row_stride, from.data(), a.data(), b.data(),
                                  norms.data(), n, d, want.data(), out_stride);
    for (size_t i = 0; i < n; ++i) {
      for (size_t c = 0; c < d; ++c) {
        const float base = a[c] * norms[i];
        const float step = b[c] * row[i * row_stride + from[c]];
        ASSERT_EQ(want[i * out_stride + c], base + step);
      }
      for (size_t c = d; c < out_stride; ++c) ASSERT_EQ(want[i * out_stride + c], out[i * out_stride + c]);
    }
    for (const KernelTable* table : SimdTables()) {
      SCOPED_TRACE(std::string(table->name) + " d=" + std::to_string(d));
      std::vector<float> got = out;
      table->gather_affine(row.data(), row_stride, from.data(), a.data(), b.data(), norms.data(),
                           n, d, got.data(), out_stride);
      for (size_t j = 0; j < got.size(); ++j) ASSERT_EQ(got[j], want[j]) << j;
    }
  }
}

// The transform codec's fused route (dequantize each block, then transform_assemble) against its
// block route (decode each block, then gather_affine), in the reference and every table that has
// it: the same floats bit for bit, for blocks of 8 to 256 channels at 1 to 8 bits in any order,
// a zero and a non-finite norm among the vectors, counts below, at and past batches of 8 and 16,
// d with a tail past whole registers, more row positions than the AVX-512 assembly holds; and the
// whole decode from codes (transform_decode) where a table has it.
TEST(KernelsSimd, TransformAssembleMatchesTheBlockRoute) {
  std::mt19937 rng(48);
  std::normal_distribution<float> gauss;
  struct Shape {
    size_t d;
    std::vector<std::pair<uint32_t, uint32_t>> blocks;  // (dim, bits), in row order
  };
  const std::vector<Shape> shapes = {
      {128, {{16, 1}, {8, 1}, {16, 2}, {32, 3}, {16, 4}, {8, 4}, {8, 5}}},
      {64, {{32, 2}, {16, 6}, {8, 8}}},
      {128, {{64, 3}, {32, 2}}},
      {13, {{8, 3}}},
      {88, {{64, 1}, {16, 1}, {8, 1}}},
      {200, {{128, 2}, {64, 3}, {8, 1}}},
      {256, {{256, 3}}},
      {256, {{8, 1}, {128, 4}, {16, 5}, {64, 2}, {32, 7}, {8, 8}}},
      {320, {{256, 2}, {64, 3}}},
  };
  for (const Shape& shape : shapes) {
    for (size_t n : {7u, 8u, 16u, 21u, 33u}) {
      SCOPED_TRACE("d=" + std::to_string(shape.d) + " n=" + std::to_string(n));
      const size_t d = shape.d, row_stride = (d + 7) / 8 * 8;
      std::vector<TestPlan> plans;
      std::vector<TransformBlock> blocks;
      std::vector<size_t> planes_at;
      size_t at = 2, offset = 0;  // an f16 norm, then the blocks' planes
      for (const auto& [dim, bits] : shape.blocks) {
        plans.push_back(MakePlan(dim, bits, RotationKind::kHadamard, DType::kF16, false, rng));
        plans.back().plan.dec_scale = 1.0f / std::sqrt(static_cast<float>(dim));
        planes_at.push_back(at);
        at += plans.back().plan.planes_bytes();
        offset += dim;
      }
      offset = 0;
      for (TestPlan& t : plans) {  // signs pointers once the vector stops moving
        blocks.push_back({offset, t.plan.dim, t.plan.signs1});
        offset += t.plan.dim;
      }
      const size_t code_bytes = at;
      std::vector<uint8_t> codes(n * code_bytes);
      for (auto& c : codes) c = static_cast<uint8_t>(rng());
      for (size_t i = 0; i < n; ++i) {
        const float norm = i == 2 ? 0.0f : i == 4 ? std::numeric_limits<float>::infinity()
                                                   : 10.0f * std::abs(gauss(rng));
        const uint16_t h = FloatToHalf(norm);
        std::memcpy(&codes[i * code_bytes], &h, 2);
      }
      std::vector<uint32_t> from(d);
      std::vector<float> a(d), b(d), norms(n);
      for (size_t c = 0; c < d; ++c) {
        from[c] = static_cast<uint32_t>(rng() % offset);
        a[c] = gauss(rng);
        b[c] = c % 7 == 0 ? 0.0f : gauss(rng);
      }
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, &codes[i * code_bytes], 2);
        norms[i] = HalfToFloat(h);
      }
      const auto route = [&](const KernelTable& k, bool fused) {
        std::vector<float> row(n * row_stride + 8, 0.0f), out(n * d, -1.0f);
        for (size_t j = 0; j < plans.size(); ++j) {
          const uint8_t* code = codes.data();
          if (fused) {
            k.dequantize(plans[j].plan, code, code + planes_at[j], code_bytes, n,
                         row.data() + blocks[j].offset, row_stride);
          } else {
            k.decode(plans[j].plan, code, code + planes_at[j], code_bytes, n,
                     row.data() + blocks[j].offset, row_stride);
          }
        }
        if (fused) {
          k.transform_assemble(row.data(), row_stride, blocks.data(), blocks.size(), from.data(),
                               a.data(), b.data(), norms.data(), n, d, out.data(), d);
        } else {
          k.gather_affine(row.data(), row_stride, from.data(), a.data(), b.data(), norms.data(), n,
                          d, out.data(), d);
        }
        return out;
      };
      const std::vector<float> want = route(ScalarKernels(), false);
      ASSERT_NE(ScalarKernels().dequantize, nullptr);
      const std::vector<float> fused_ref = route(ScalarKernels(), true);
      ASSERT_EQ(std::memcmp(fused_ref.data(), want.data(), want.size() * 4), 0);
      for (const KernelTable* table : SimdTables()) {
        if (table->dequantize == nullptr) continue;
        SCOPED_TRACE(table->name);
        const std::vector<float> got = route(*table, true);
        for (size_t j = 0; j < got.size(); ++j) {
          ASSERT_EQ(std::memcmp(&got[j], &want[j], 4), 0) << j << ": " << got[j] << " " << want[j];
        }
      }
      // transform_decode: the same elements as the route, add_scaled and from_f32 of the
      // reference, in every dtype, with and without key means, into strided rows (padding kept).
      std::vector<TransformCodeBlock> code_blocks;
      for (size_t j = 0; j < plans.size(); ++j) {
        code_blocks.push_back({&plans[j].plan, planes_at[j]});
      }
      std::vector<float> mean(d), scale(n);
      for (auto& v : mean) v = gauss(rng);
      for (auto& v : scale) v = gauss(rng);
      for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
      for (bool with_mean : {false, true}) {
        const size_t out_stride = d + 3, es = DTypeSize(dtype);
        std::vector<float> xf = want;
        if (with_mean) ScalarKernels().add_scaled(mean.data(), scale.data(), n, d, xf.data(), d);
        std::vector<uint8_t> expect(n * out_stride * es, 0xA5);
        for (size_t i = 0; i < n; ++i) {
          ScalarKernels().from_f32(xf.data() + i * d, d, dtype,
                                   expect.data() + i * out_stride * es);
        }
        for (const KernelTable* table : SimdTables()) {
          if (table->transform_decode == nullptr) continue;
          SCOPED_TRACE(std::string(table->name) + " transform_decode " +
                       std::string(DTypeName(dtype)) + (with_mean ? " mean" : ""));
          std::vector<uint8_t> got(expect.size(), 0xA5);
          const bool taken = table->transform_decode(
              codes.data(), code_bytes, code_blocks.data(), blocks.data(), blocks.size(),
              from.data(), a.data(), b.data(), norms.data(), n, d,
              with_mean ? mean.data() : nullptr, with_mean ? scale.data() : nullptr, got.data(),
              dtype, out_stride);
          // Refused (nothing written) only past the 256 row positions the kernel holds.
          ASSERT_EQ(taken, offset <= 256);
          if (!taken) {
            ASSERT_EQ(got, std::vector<uint8_t>(expect.size(), 0xA5));
            continue;
          }
          for (size_t j = 0; j < got.size(); ++j) ASSERT_EQ(got[j], expect[j]) << j;
        }
      }
    }
  }
}

// EncodeFrom / DecodeTo of every table (the fused kernels where a table has them, the batch route
// otherwise) against the reference's to_f32 + encode and decode + add_scaled + from_f32: codes
// and output elements byte for byte, for each input dtype, with and without key means, strided.
TEST(KernelsSimd, FusedConversionMatchesReference) {
  std::mt19937 rng(47);
  std::normal_distribution<float> gauss;
  const KernelTable& scalar = ScalarKernels();
  for (RotationKind rot : {RotationKind::kHadamard, RotationKind::kHadamard2,
                           RotationKind::kKronecker, RotationKind::kHaar}) {
    for (uint32_t dim : DimsFor(rot)) {
      if (rot == RotationKind::kHaar && dim > 96) continue;  // slow in the reference
      for (uint32_t bits : {1u, 3u, 4u, 5u, 8u}) {
        const bool nc = bits % 2 == 1;
        TestPlan t = MakePlan(dim, bits, rot, bits == 4 ? DType::kF32 : DType::kF16, nc, rng);
        const SubsetPlan& p = t.plan;
        const size_t nb = DTypeSize(p.norm_dtype);
        const size_t gap = bits % 2, x_stride = dim + 3 * gap, code_stride = nb + p.planes_bytes();
        size_t n = 0;
        const std::vector<float> xf = MakeInputs(dim, x_stride, &n, rng);
        std::vector<float> mean(dim), scale(n);
        for (auto& v : mean) v = 4.0f * gauss(rng);
        for (auto& v : scale) v = gauss(rng);
        for (DType dt : {DType::kF16, DType::kBF16, DType::kF32}) {
          const size_t el = DTypeSize(dt);
          std::vector<uint8_t> x(xf.size() * el);
          scalar.from_f32(xf.data(), xf.size(), dt, x.data());
          std::vector<float> xr(xf.size());  // what the encoder sees
          scalar.to_f32(x.data(), dt, xf.size(), xr.data());
          std::vector<uint8_t> want(n * code_stride, 0xCD);
          scalar.encode(p, xr.data(), x_stride, n, want.data(), want.data() + nb, code_stride);
          for (bool with_mean : {false, true}) {
            std::vector<float> dec(n * x_stride, 0.0f);
            scalar.decode(p, want.data(), want.data() + nb, code_stride, n, dec.data(), x_stride);
            if (with_mean) {
              scalar.add_scaled(mean.data(), scale.data(), n, dim, dec.data(), x_stride);
            }
            std::vector<uint8_t> want_out(n * x_stride * el, 0xEE);
            for (size_t i = 0; i < n; ++i) {
              scalar.from_f32(&dec[i * x_stride], dim, dt, &want_out[i * x_stride * el]);
            }
            std::vector<const KernelTable*> tables = SimdTables();
            tables.push_back(&scalar);
            for (const KernelTable* table : tables) {
              SCOPED_TRACE(Describe(p, *table) + " dtype=" + std::string(DTypeName(dt)) +
                           (with_mean ? " mean" : ""));
              std::vector<uint8_t> got(n * code_stride, 0xCD);
              EncodeFrom(*table, p, x.data(), dt, x_stride, n, got.data(), got.data() + nb,
                         code_stride);
              ASSERT_EQ(got, want);
              std::vector<uint8_t> got_out(n * x_stride * el, 0xEE);
              DecodeTo(*table, p, want.data(), want.data() + nb, code_stride, n,
                       with_mean ? mean.data() : nullptr, with_mean ? scale.data() : nullptr,
                       got_out.data(), dt, x_stride);
              for (size_t i = 0; i < n * x_stride; ++i) {
                if (std::memcmp(&got_out[i * el], &want_out[i * el], el) == 0) continue;
                if (dt == DType::kF32) {  // NaN payloads: as SameFloat
                  float a, b;
                  std::memcpy(&a, &got_out[i * el], 4);
                  std::memcpy(&b, &want_out[i * el], 4);
                  if (SameFloat(a, b)) continue;
                }
                FAIL() << "vector " << i / x_stride << " lane " << i % x_stride;
              }
            }
          }
        }
      }
    }
  }
}

// The fused split kernels of every table against the reference (which is split_gather + encode
// of each subset, and decode of each subset + split_scatter): the rotation kinds the presets use
// (Hadamard outliers, Kronecker rest), Haar (the tables' batch-wise route), d beyond the fused
// route's 512 channels, odd-sized reference shapes, strided vectors and codes, edge-case inputs.
TEST(KernelsSimd, SplitEncodeDecodeMatchReference) {
  std::mt19937 rng(46);
  struct Shape {
    uint32_t m0, m1;
    RotationKind r0, r1;
    uint32_t b0, b1;
  };
  const std::vector<Shape> shapes = {
      {32, 96, RotationKind::kHadamard, RotationKind::kKronecker, 4, 2},
      {32, 96, RotationKind::kHadamard, RotationKind::kKronecker, 5, 3},
      {16, 48, RotationKind::kHadamard2, RotationKind::kKronecker, 6, 1},
      {64, 192, RotationKind::kKronecker, RotationKind::kKronecker, 8, 4},
      {8, 40, RotationKind::kHadamard, RotationKind::kKronecker, 7, 2},  // q = 5
      {32, 96, RotationKind::kHadamard, RotationKind::kHaar, 4, 2},
      {24, 8, RotationKind::kHaar, RotationKind::kHadamard, 3, 3},
      {8, 512, RotationKind::kHadamard, RotationKind::kHadamard, 4, 2},   // d / 8 = 65 chunks
      // The AVX-512 fused route: blocks of 16 and 64, all of 1..5 bits, d = 512 (32 registers).
      {16, 48, RotationKind::kHadamard2, RotationKind::kKronecker, 5, 1},
      {64, 192, RotationKind::kKronecker, RotationKind::kKronecker, 3, 4},
      {256, 256, RotationKind::kHadamard, RotationKind::kHadamard2, 2, 3},
      {5, 12, RotationKind::kKronecker, RotationKind::kHaar, 3, 2},       // reference shapes
      // The AVX2 in-register coders: Hadamard in 8 registers, Kronecker blocks of one register.
      {64, 24, RotationKind::kHadamard2, RotationKind::kKronecker, 3, 2},
      {64, 24, RotationKind::kHadamard, RotationKind::kKronecker, 8, 5},
  };
  for (const Shape& sh : shapes) {
    for (DType nd : {DType::kF32, DType::kF16}) {
      const bool nc = rng() & 1;
      TestPlan t0 = MakePlan(sh.m0, sh.b0, sh.r0, nd, nc, rng);
      TestPlan t1 = MakePlan(sh.m1, sh.b1, sh.r1, nd, nc, rng);
      const size_t d = sh.m0 + sh.m1;
      std::vector<uint8_t> mask((d + 7) / 8, 0);
      std::vector<uint32_t> channels(d);
      for (uint32_t c = 0; c < d; ++c) channels[c] = c;
      std::shuffle(channels.begin(), channels.end(), rng);
      for (uint32_t i = 0; i < sh.m0; ++i) {
        mask[channels[i] / 8] |= uint8_t(1u << (channels[i] % 8));
      }
      SplitPlan sp;
      sp.sub[0] = t0.plan;
      sp.sub[1] = t1.plan;
      const size_t nb = DTypeSize(nd);
      sp.norm_offset[0] = 0;
      sp.norm_offset[1] = nb;
      sp.planes_offset[0] = 2 * nb;
      sp.planes_offset[1] = 2 * nb + t0.plan.planes_bytes();
      const size_t gap = sh.b0 % 2;
      const size_t code_stride = 2 * nb + t0.plan.planes_bytes() + t1.plan.planes_bytes() + 3 * gap;
      const size_t x_stride = d + 5 * gap;
      size_t n = 0;
      const std::vector<float> x = MakeInputs(static_cast<uint32_t>(d), x_stride, &n, rng);
      std::vector<uint8_t> want(n * code_stride, 0xCD);
      ScalarKernels().split_encode(sp, x.data(), DType::kF32, x_stride, n, mask.data(),
                                   want.data(), code_stride);
      // The reference is the composition of the unfused kernels.
      {
        std::vector<float> g0(n * sh.m0 + kSplitSlack), g1(n * sh.m1 + kSplitSlack);
        ScalarKernels().split_gather(x.data(), x_stride, n, mask.data(), d, g0.data(), sh.m0,
                                     g1.data(), sh.m1);
        std::vector<uint8_t> comp(n * code_stride, 0xCD);
        ScalarKernels().encode(t0.plan, g0.data(), sh.m0, n, comp.data(), comp.data() + 2 * nb,
                               code_stride);
        ScalarKernels().encode(t1.plan, g1.data(), sh.m1, n, comp.data() + nb,
                               comp.data() + sp.planes_offset[1], code_stride);
        ASSERT_EQ(comp, want);
      }
      // Decode also random codes (any bytes but the norms, which stay finite).
      std::vector<uint8_t> codes = want;
      for (int extra = 0; extra < 9; ++extra) {
        std::vector<uint8_t> c(code_stride);
        for (auto& b : c) b = static_cast<uint8_t>(rng());
        for (size_t s = 0; s < 2; ++s) {
          const float norm = std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10);
          if (nd == DType::kF32) {
            std::memcpy(c.data() + s * nb, &norm, 4);
          } else {
            const uint16_t h = FloatToHalf(norm);
            std::memcpy(c.data() + s * nb, &h, 2);
          }
        }
        codes.insert(codes.end(), c.begin(), c.end());
      }
      const size_t n_dec = codes.size() / code_stride;
      const size_t out_stride = d + 3 * gap;
      std::vector<float> want_out(n_dec * out_stride, -1.0f);
      ScalarKernels().split_decode(sp, codes.data(), code_stride, n_dec, mask.data(),
                                   want_out.data(), DType::kF32, out_stride);
      // The same vectors as fp16 and bf16, in and out: the conversions of to_f32 / from_f32.
      std::vector<std::vector<uint8_t>> want_codes_h, want_out_h;
      for (DType io : {DType::kF16, DType::kBF16}) {
        std::vector<uint8_t> xh(x.size() * 2);
        ScalarKernels().from_f32(x.data(), x.size(), io, xh.data());
        std::vector<uint8_t> ch(n * code_stride, 0xCD);
        ScalarKernels().split_encode(sp, xh.data(), io, x_stride, n, mask.data(), ch.data(),
                                     code_stride);
        std::vector<float> xr(x.size());
        ScalarKernels().to_f32(xh.data(), io, xh.size() / 2, xr.data());
        std::vector<uint8_t> cf(n * code_stride, 0xCD);
        ScalarKernels().split_encode(sp, xr.data(), DType::kF32, x_stride, n, mask.data(),
                                     cf.data(), code_stride);
        ASSERT_EQ(ch, cf);
        std::vector<uint8_t> oh(n_dec * out_stride * 2, 0xEE);
        ScalarKernels().split_decode(sp, codes.data(), code_stride, n_dec, mask.data(), oh.data(),
                                     io, out_stride);
        want_codes_h.push_back(ch);
        want_out_h.push_back(oh);
      }
      for (const KernelTable* table : SimdTables()) {
        SCOPED_TRACE(std::string(table->name) + " m0=" + std::to_string(sh.m0) +
                     " m1=" + std::to_string(sh.m1) + " " + std::string(DTypeName(nd)));
        std::vector<uint8_t> got(n * code_stride, 0xCD);
        table->split_encode(sp, x.data(), DType::kF32, x_stride, n, mask.data(), got.data(),
                            code_stride);
        for (size_t v = 0; v < n; ++v) {
          ASSERT_EQ(0, std::memcmp(&got[v * code_stride], &want[v * code_stride], code_stride))
              << "vector " << v;
        }
        std::vector<float> got_out(n_dec * out_stride, -1.0f);
        table->split_decode(sp, codes.data(), code_stride, n_dec, mask.data(), got_out.data(),
                            DType::kF32, out_stride);
        for (size_t i = 0; i < got_out.size(); ++i) {
          ASSERT_TRUE(SameFloat(got_out[i], want_out[i]))
              << "vector " << i / out_stride << " lane " << i % out_stride;
        }
        int h = 0;
        for (DType io : {DType::kF16, DType::kBF16}) {
          std::vector<uint8_t> xh(x.size() * 2);
          ScalarKernels().from_f32(x.data(), x.size(), io, xh.data());
          std::vector<uint8_t> ch(n * code_stride, 0xCD);
          table->split_encode(sp, xh.data(), io, x_stride, n, mask.data(), ch.data(),
                              code_stride);
          ASSERT_EQ(ch, want_codes_h[h]) << DTypeName(io);
          std::vector<uint8_t> oh(n_dec * out_stride * 2, 0xEE);
          table->split_decode(sp, codes.data(), code_stride, n_dec, mask.data(), oh.data(), io,
                              out_stride);
          ASSERT_EQ(oh, want_out_h[h]) << DTypeName(io);
          ++h;
        }
        // One vector and none.
        std::vector<float> one(out_stride, -1.0f);
        table->split_decode(sp, codes.data(), code_stride, 1, mask.data(), one.data(),
                            DType::kF32, out_stride);
        for (size_t i = 0; i < out_stride; ++i) ASSERT_TRUE(SameFloat(one[i], want_out[i]));
        table->split_encode(sp, nullptr, DType::kF16, x_stride, 0, mask.data(), nullptr,
                            code_stride);
        table->split_decode(sp, nullptr, code_stride, 0, mask.data(), nullptr, DType::kF16,
                            out_stride);
      }
    }
  }
}

// SelectGroupMeta's channel energies: every table gives the reference's sums bit for bit (and
// the reference the plain double loop), f16/bf16/f32, strided rows, d with and without a tail.
TEST(KernelsSimd, ChannelEnergyMatchesReference) {
  std::mt19937 rng(47);
  std::normal_distribution<float> gauss;
  for (DType dt : {DType::kF16, DType::kBF16, DType::kF32}) {
    for (size_t d : {4u, 8u, 12u, 20u, 64u, 128u, 130u, 1032u}) {
      for (size_t n : {0u, 1u, 3u, 4u, 9u}) {
        const size_t stride = d + 3;
        std::vector<float> xf(n * stride);
        for (auto& v : xf) v = gauss(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 30) - 15);
        if (n > 2) {
          xf[stride + 1] = kInf;
          xf[2 * stride + 2] = kNaN;
        }
        std::vector<uint8_t> x(xf.size() * DTypeSize(dt));
        ScalarKernels().from_f32(xf.data(), xf.size(), dt, x.data());
        std::vector<double> want(d, 0.25);
        ScalarKernels().channel_energy(x.data(), dt, n, stride, d, want.data());
        std::vector<double> plain(d, 0.25);
        for (size_t i = 0; i < n; ++i) {
          for (size_t c = 0; c < d; ++c) {
            const double v = LoadAsFloat(x.data(), dt, i * stride + c);
            plain[c] += v * v;
          }
        }
        for (size_t c = 0; c < d; ++c) {
          ASSERT_TRUE(plain[c] == want[c] || (std::isnan(plain[c]) && std::isnan(want[c])));
        }
        for (const KernelTable* table : SimdTables()) {
          SCOPED_TRACE(std::string(table->name) + " d=" + std::to_string(d) +
                       " n=" + std::to_string(n) + " " + std::string(DTypeName(dt)));
          std::vector<double> got(d, 0.25);
          table->channel_energy(x.data(), dt, n, stride, d, got.data());
          for (size_t c = 0; c < d; ++c) {
            ASSERT_TRUE(std::bit_cast<uint64_t>(got[c]) == std::bit_cast<uint64_t>(want[c]) ||
                        (std::isnan(got[c]) && std::isnan(want[c])))
                << c;
          }
        }
      }
    }
  }
}

TEST(KernelsSimd, HalfToFloatAllPatterns) {
  std::vector<uint16_t> h(65536 + 5);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i);
  for (const KernelTable* table : SimdTables()) {
    SCOPED_TRACE(table->name);
    std::vector<float> out(h.size());
    table->to_f32(h.data(), DType::kF16, h.size(), out.data());
    for (size_t i = 0; i < h.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(HalfToFloat(h[i])))
          << std::hex << h[i];
    }
    table->to_f32(h.data(), DType::kBF16, h.size(), out.data());
    for (size_t i = 0; i < h.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(BF16ToFloat(h[i])));
    }
    // Round trip of every half: from_f32 must give the pattern back (NaNs come back quiet).
    std::vector<uint16_t> back(h.size());
    table->to_f32(h.data(), DType::kF16, h.size(), out.data());
    table->from_f32(out.data(), out.size(), DType::kF16, back.data());
    for (size_t i = 0; i < h.size(); ++i) {
      const bool nan = (h[i] & 0x7C00) == 0x7C00 && (h[i] & 0x3FF);
      ASSERT_EQ(back[i], nan ? (h[i] | 0x200) : h[i]) << std::hex << h[i];
    }
  }
}

TEST(KernelsSimd, FloatConversionsMatchScalar) {
  std::mt19937 rng(9);
  std::vector<float> f;
  for (int i = 0; i < 200000; ++i) f.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  std::uniform_real_distribution<float> uni(-70000.0f, 70000.0f);
  for (int i = 0; i < 50000; ++i) f.push_back(uni(rng));
  for (float v : {0.0f, -0.0f, kInf, -kInf, kNaN, -kNaN, 65504.0f, 65519.99f, 65520.0f, 1e-45f,
                  5.96e-8f, 2.98e-8f, 2.9802322e-8f, 6.1e-5f, 1e-40f, 3.4e38f, 1.0f, -1.0f}) {
    f.push_back(v);
  }
  f.push_back(std::bit_cast<float>(0x7F800001u));  // signalling NaN
  f.push_back(std::bit_cast<float>(0xFFBFFFFFu));
  // Every exact halfway point between neighbouring halves and bf16s around 1.
  for (uint32_t b = 0x3F800000u; b < 0x3F800000u + 0x10000u; b += 0x1000u) {
    f.push_back(std::bit_cast<float>(b));
    f.push_back(std::bit_cast<float>(b | 0x8000u));
  }
  for (size_t n : {f.size(), size_t{7}, size_t{9}, size_t{0}}) {
    for (const KernelTable* table : SimdTables()) {
      SCOPED_TRACE(std::string(table->name) + " n=" + std::to_string(n));
      std::vector<uint16_t> h(n + 1, 0xBEEF), b(n + 1, 0xBEEF);
      table->from_f32(f.data(), n, DType::kF16, h.data());
      table->from_f32(f.data(), n, DType::kBF16, b.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(h[i], FloatToHalf(f[i])) << std::hex << std::bit_cast<uint32_t>(f[i]);
        ASSERT_EQ(b[i], FloatToBF16(f[i])) << std::hex << std::bit_cast<uint32_t>(f[i]);
      }
      EXPECT_EQ(h[n], 0xBEEF);
      EXPECT_EQ(b[n], 0xBEEF);
      std::vector<float> copy(n + 1, 1.5f), back(n + 1, 2.5f);
      table->from_f32(f.data(), n, DType::kF32, copy.data());
      table->to_f32(copy.data(), DType::kF32, n, back.data());
      EXPECT_EQ(0, std::memcmp(back.data(), f.data(), n * 4));
      EXPECT_EQ(back[n], 2.5f);
    }
  }
}

}  // namespace
}  // namespace tqkv::kernels
