// Google Highway against the hand-written kernels: tq3/tq4 decode of Hadamard vectors (m = 128)
// to fp16, the restore's hot path, written once with Highway ops and compiled for its AVX2 and
// AVX-512 targets (dynamic dispatch, each target forced in turn). Built with the micro benchmarks
// when CMake finds Highway (Debian libhwy-dev); docs/lab/simd-avx512.md has the figures.
//
//   build/tqkv_micro --benchmark_filter='DecodeF16'
//
// Every Highway run first checks its output against the scalar reference bit for bit.
// Only the x86 targets compared here, besides the baseline Highway always builds.
#define HWY_WANT_AVX3_DL 1
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "highway_decode_bench.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstdint>
#include <cstring>

#ifndef TQKV_HIGHWAY_DECODE_BENCH_ONCE
#define TQKV_HIGHWAY_DECODE_BENCH_ONCE
namespace tqkv::hwybench {
constexpr size_t kDim = 128;
}  // namespace tqkv::hwybench
#endif

HWY_BEFORE_NAMESPACE();
namespace tqkv::hwybench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL

// One lane sign per FWHT stage h = 1, 2, 4, 8 inside a register: -1 where lane & h.
HWY_ALIGN constexpr float kStageSigns[4][16] = {
    {1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1},
    {1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1},
    {1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1},
    {1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1}};

// n vectors (code i at codes + i * stride: f32 norm, then kBits planes of 16 bytes) to fp16:
// v = centroid[idx] * (norm * dec_scale), Fwht(v), times signs: the reference's operations in its
// order (the in-register stages as fma(x, +-1, partner), exact as in the hand-written tables).
template <int kBits>
void DecodeF16T(const float* centroids, const float* signs1, float dec_scale,
                const uint8_t* codes, size_t stride, size_t n, uint16_t* out) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  using V = hn::Vec<decltype(d)>;
  constexpr size_t N = hn::MaxLanes(d);
  constexpr size_t R = kDim / N;
  constexpr bool kTwoTables = (size_t{1} << kBits) > N;  // tq4 on 8 lanes
  static_assert(N == 8 || N == 16, "x86 targets only");
  const V s1 = hn::Load(d, kStageSigns[0]), s2 = hn::Load(d, kStageSigns[1]);
  const V s4 = hn::Load(d, kStageSigns[2]), s8 = hn::Load(d, kStageSigns[3]);
  constexpr int kIdxBits = kTwoTables ? 3 : kBits;
  for (size_t k = 0; k < n; ++k) {
    const uint8_t* code = codes + k * stride;
    float norm;
    std::memcpy(&norm, code, 4);
    const V a = hn::Set(d, norm * dec_scale);
    const V t0 = hn::Mul(hn::LoadU(d, centroids), a);  // centroids: padded to 16 floats
    const V t1 = kTwoTables ? hn::Mul(hn::LoadU(d, centroids + N), a) : t0;
    const uint8_t* planes = code + 4;
    V v[R];
    HWY_UNROLL(16)
    for (size_t r = 0; r < R; ++r) {
      auto idx = hn::Zero(di);
      HWY_UNROLL(4)
      for (int p = 0; p < kIdxBits; ++p) {
        const auto m = hn::LoadMaskBits(di, planes + p * (kDim / 8) + r * (N / 8));
        idx = hn::Add(idx, hn::IfThenElseZero(m, hn::Set(di, 1 << p)));
      }
      const auto ix = hn::IndicesFromVec(d, idx);
      V c = hn::TableLookupLanes(t0, ix);
      if constexpr (kTwoTables) {
        const auto hi = hn::LoadMaskBits(d, planes + 3 * (kDim / 8) + r * (N / 8));
        c = hn::IfThenElse(hi, hn::TableLookupLanes(t1, ix), c);
      }
      c = hn::MulAdd(c, s1, hn::Shuffle2301(c));
      c = hn::MulAdd(c, s2, hn::Shuffle1032(c));
      c = hn::MulAdd(c, s4, hn::SwapAdjacentBlocks(c));
      if constexpr (N == 16) c = hn::MulAdd(c, s8, hn::ConcatLowerUpper(d, c, c));
      v[r] = c;
    }
    HWY_UNROLL(4)
    for (size_t h = 1; h < R; h <<= 1) {
      HWY_UNROLL(16)
      for (size_t r = 0; r < R; ++r) {
        if (r & h) continue;
        const V x = v[r], y = v[r + h];
        v[r] = hn::Add(x, y);
        v[r + h] = hn::Sub(x, y);
      }
    }
    auto* o = reinterpret_cast<hwy::float16_t*>(out + k * kDim);
    HWY_UNROLL(16)
    for (size_t r = 0; r < R; ++r) {
      hn::StoreU(hn::DemoteTo(dh, hn::Mul(v[r], hn::LoadU(d, signs1 + r * N))), dh, o + r * N);
    }
  }
}

void DecodeF16(int bits, const float* centroids, const float* signs1, float dec_scale,
               const uint8_t* codes, size_t stride, size_t n, uint16_t* out) {
  if (bits == 3) return DecodeF16T<3>(centroids, signs1, dec_scale, codes, stride, n, out);
  DecodeF16T<4>(centroids, signs1, dec_scale, codes, stride, n, out);
}
#else
// The baseline target is never measured (the benchmark forces the x86 targets above).
void DecodeF16(int, const float*, const float*, float, const uint8_t*, size_t, size_t,
               uint16_t*) {}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace tqkv::hwybench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "codec/kernels/kernels.h"

namespace tqkv::hwybench {
HWY_EXPORT(DecodeF16);

namespace {

using kernels::KernelTable;
using kernels::SubsetPlan;

constexpr size_t kVectors = 4096;  // 1 MiB of fp16 out, as tqkv_micro's kernel benchmarks

struct Data {
  std::vector<float> signs1, centroids, thresholds;
  SubsetPlan plan;
  std::vector<uint8_t> codes;
  size_t stride = 0;
  std::vector<uint16_t> want;  // the scalar reference's fp16 output
};

Data MakeData(uint32_t bits) {
  Data b;
  std::mt19937 rng(1);
  for (size_t i = 0; i < kDim; ++i) b.signs1.push_back(rng() & 1 ? 1.0f : -1.0f);
  const uint32_t levels = 1u << bits;
  for (uint32_t k = 0; k < levels; ++k) {
    b.centroids.push_back(-2.5f + 5.0f * (k + 0.5f) / static_cast<float>(levels));
  }
  for (uint32_t k = 0; k + 1 < levels; ++k) {
    b.thresholds.push_back(0.5f * (b.centroids[k] + b.centroids[k + 1]));
  }
  b.centroids.resize(16, 0.0f);  // a whole register for the Highway loads
  SubsetPlan& p = b.plan;
  p.dim = kDim;
  p.bits = bits;
  p.rotation = RotationKind::kHadamard;
  p.signs1 = b.signs1.data();
  p.centroids = b.centroids.data();
  p.thresholds = b.thresholds.data();
  p.dec_scale = 1.0f / kDim;
  b.stride = 4 + p.planes_bytes();
  b.codes.resize(kVectors * b.stride);
  std::normal_distribution<float> g;
  std::vector<float> x(kVectors * kDim);
  for (auto& v : x) v = g(rng);
  kernels::ScalarKernels().encode(p, x.data(), kDim, kVectors, b.codes.data(), b.codes.data() + 4,
                                  b.stride);
  b.want.resize(kVectors * kDim);
  kernels::DecodeTo(kernels::ScalarKernels(), p, b.codes.data(), b.codes.data() + 4, b.stride,
                    kVectors, nullptr, nullptr, b.want.data(), DType::kF16, kDim);
  return b;
}

// Args: Highway target (0 AVX2, 1 AVX3 = AVX-512 F/BW/DQ/VL, 2 AVX3_DL), bits.
void BM_HighwayDecodeF16(benchmark::State& state) {
  static constexpr int64_t kTargets[] = {HWY_AVX2, HWY_AVX3, HWY_AVX3_DL};
  const int64_t target = kTargets[state.range(0)];
  if ((hwy::SupportedTargets() & target) == 0) return state.SkipWithError("target not supported");
  hwy::SetSupportedTargetsForTest(target);
  const Data b = MakeData(static_cast<uint32_t>(state.range(1)));
  std::vector<uint16_t> out(kVectors * kDim);
  const auto run = [&] {
    HWY_DYNAMIC_DISPATCH(DecodeF16)(static_cast<int>(b.plan.bits), b.centroids.data(),
                                    b.signs1.data(), b.plan.dec_scale, b.codes.data(), b.stride,
                                    kVectors, out.data());
  };
  run();
  const bool same = out == b.want;
  if (!same && std::getenv("TQKV_HWY_DEBUG")) {
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i] != b.want[i]) {
        std::fprintf(stderr, "first difference at %zu: %04x vs %04x\n", i, out[i], b.want[i]);
        break;
      }
    }
  }
  if (!same) {
    hwy::SetSupportedTargetsForTest(0);
    return state.SkipWithError("output differs from the scalar reference");
  }
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kVectors * kDim * 2));
  state.SetLabel(std::string(hwy::TargetName(target)) + ", bit-identical");
  hwy::SetSupportedTargetsForTest(0);
}

// The hand-written tables' decode to fp16 (kernels::DecodeTo: the restore's call). Arg 0: avx2,
// 1: avx512, 2: avx512-fma8.
void BM_TableDecodeF16(benchmark::State& state) {
  const KernelTable* table = nullptr;
  if (state.range(0) == 0) {
    table = kernels::Avx2Kernels();
  } else {
    const char* want = state.range(0) == 1 ? "avx512" : "avx512-fma8";
    for (const KernelTable* t : kernels::Avx512KernelVariants()) {
      if (std::string(t->name) == want) table = t;
    }
  }
  if (!table) return state.SkipWithError("SIMD level not available");
  const Data b = MakeData(static_cast<uint32_t>(state.range(1)));
  std::vector<uint16_t> out(kVectors * kDim);
  for (auto _ : state) {
    kernels::DecodeTo(*table, b.plan, b.codes.data(), b.codes.data() + 4, b.stride, kVectors,
                      nullptr, nullptr, out.data(), DType::kF16, kDim);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  if (out != b.want) return state.SkipWithError("output differs from the scalar reference");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kVectors * kDim * 2));
  state.SetLabel(table->name);
}

BENCHMARK(BM_HighwayDecodeF16)->ArgNames({"hwy", "bits"})->ArgsProduct({{0, 1, 2}, {3, 4}});
BENCHMARK(BM_TableDecodeF16)->ArgNames({"simd", "bits"})->ArgsProduct({{0, 1, 2}, {3, 4}});

}  // namespace
}  // namespace tqkv::hwybench
#endif  // HWY_ONCE
