// Kernel throughput, one thread. bytes/s counts fp16-equivalent bytes (dim * 2 per vector), the
// unit the speed targets use: encode is fp16 -> f32 -> codes, decode is codes -> f32 -> fp16.
//
//   build-kernels/tqkv_micro --benchmark_filter=Kernels
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "codec/kernels/kernels.h"

namespace tqkv::kernels {
namespace {

constexpr size_t kVectors = 4096;  // 1 MiB of fp16 at d = 128: beyond L2, like a real KV block
constexpr size_t kChunk = 32;      // vectors converted per step, so the f32 scratch stays in L1

struct BenchPlan {
  std::vector<float> signs1, signs2, haar, haar_t, centroids, thresholds;
  SubsetPlan plan;
};

BenchPlan MakePlan(uint32_t dim, uint32_t bits, RotationKind rot) {
  BenchPlan b;
  std::mt19937 rng(1);
  for (uint32_t i = 0; i < dim; ++i) {
    b.signs1.push_back(rng() & 1 ? 1.0f : -1.0f);
    b.signs2.push_back(rng() & 1 ? 1.0f : -1.0f);
  }
  if (rot == RotationKind::kHaar) {  // any dense matrix costs the same; orthogonality is not needed
    std::normal_distribution<float> g(0.0f, 1.0f / std::sqrt(static_cast<float>(dim)));
    b.haar.resize(size_t{dim} * dim);
    for (auto& v : b.haar) v = g(rng);
    b.haar_t.resize(b.haar.size());
    for (uint32_t r = 0; r < dim; ++r) {
      for (uint32_t c = 0; c < dim; ++c)
        b.haar_t[size_t{c} * dim + r] = b.haar[size_t{r} * dim + c];
    }
  }
  const uint32_t levels = 1u << bits;
  for (uint32_t k = 0; k < levels; ++k) {  // evenly spaced over +-2.5 sigma
    b.centroids.push_back(-2.5f +
                          5.0f * (static_cast<float>(k) + 0.5f) / static_cast<float>(levels));
  }
  for (uint32_t k = 0; k + 1 < levels; ++k) {
    b.thresholds.push_back(0.5f * (b.centroids[k] + b.centroids[k + 1]));
  }
  const double m = dim;
  SubsetPlan& p = b.plan;
  p.dim = dim;
  p.bits = bits;
  p.rotation = rot;
  p.signs1 = b.signs1.data();
  p.signs2 = b.signs2.data();
  p.haar = b.haar.empty() ? nullptr : b.haar.data();
  p.haar_t = b.haar_t.empty() ? nullptr : b.haar_t.data();
  p.centroids = b.centroids.data();
  p.thresholds = b.thresholds.data();
  p.enc_scale = rot == RotationKind::kHaar        ? static_cast<float>(std::sqrt(m))
                : rot == RotationKind::kHadamard2 ? static_cast<float>(1 / std::sqrt(m))
                                                  : 1.0f;
  p.dec_scale = rot == RotationKind::kHaar        ? static_cast<float>(1 / std::sqrt(m))
                : rot == RotationKind::kHadamard2 ? static_cast<float>(1 / (m * std::sqrt(m)))
                                                  : static_cast<float>(1 / m);
  return b;
}

// 0 scalar, 1 avx2, 2 avx512 (the build this CPU's vendor gets), 3 the other AVX-512 build; null
// where this CPU lacks the level.
const KernelTable* TableFor(int level) {
  if (level == 0) return &ScalarKernels();
  if (level == 1) return Avx2Kernels();
  const std::vector<const KernelTable*> v = Avx512KernelVariants();
  const size_t i = level == 2 ? 0 : 1;
  return i < v.size() ? v[i] : nullptr;
}

std::vector<uint16_t> RandomHalves(size_t n) {
  std::mt19937 rng(2);
  std::normal_distribution<float> g;
  std::vector<uint16_t> h(n);
  for (auto& v : h) v = FloatToHalf(g(rng));
  return h;
}

// Args: level (as TableFor), dim, bits, rotation kind.
void BM_KernelsEncode(benchmark::State& state) {
  const KernelTable* table = TableFor(static_cast<int>(state.range(0)));
  if (!table) return state.SkipWithError("SIMD level not available");
  const uint32_t dim = static_cast<uint32_t>(state.range(1));
  BenchPlan b = MakePlan(dim, static_cast<uint32_t>(state.range(2)),
                         static_cast<RotationKind>(state.range(3)));
  const std::vector<uint16_t> in = RandomHalves(kVectors * dim);
  const size_t stride = 4 + b.plan.planes_bytes();
  std::vector<uint8_t> codes(kVectors * stride);
  std::vector<float> scratch(kChunk * dim);
  for (auto _ : state) {
    for (size_t v = 0; v < kVectors; v += kChunk) {
      table->to_f32(&in[v * dim], DType::kF16, kChunk * dim, scratch.data());
      table->encode(b.plan, scratch.data(), dim, kChunk, &codes[v * stride], &codes[v * stride + 4],
                    stride);
    }
    benchmark::DoNotOptimize(codes.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kVectors * dim * 2));
  state.SetLabel(table->name);
}

void BM_KernelsDecode(benchmark::State& state) {
  const KernelTable* table = TableFor(static_cast<int>(state.range(0)));
  if (!table) return state.SkipWithError("SIMD level not available");
  const uint32_t dim = static_cast<uint32_t>(state.range(1));
  BenchPlan b = MakePlan(dim, static_cast<uint32_t>(state.range(2)),
                         static_cast<RotationKind>(state.range(3)));
  const std::vector<uint16_t> in = RandomHalves(kVectors * dim);
  const size_t stride = 4 + b.plan.planes_bytes();
  std::vector<uint8_t> codes(kVectors * stride);
  std::vector<float> scratch(kChunk * dim);
  for (size_t v = 0; v < kVectors; v += kChunk) {
    ScalarKernels().to_f32(&in[v * dim], DType::kF16, kChunk * dim, scratch.data());
    ScalarKernels().encode(b.plan, scratch.data(), dim, kChunk, &codes[v * stride],
                           &codes[v * stride + 4], stride);
  }
  std::vector<uint16_t> out(kVectors * dim);
  for (auto _ : state) {
    for (size_t v = 0; v < kVectors; v += kChunk) {
      table->decode(b.plan, &codes[v * stride], &codes[v * stride + 4], stride, kChunk,
                    scratch.data(), dim);
      table->from_f32(scratch.data(), kChunk * dim, DType::kF16, &out[v * dim]);
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kVectors * dim * 2));
  state.SetLabel(table->name);
}

// Conversions alone, cache-resident (64 KiB of fp16).
void BM_KernelsHalfToFloat(benchmark::State& state) {
  const KernelTable* table = TableFor(static_cast<int>(state.range(0)));
  if (!table) return state.SkipWithError("SIMD level not available");
  const std::vector<uint16_t> in = RandomHalves(32768);
  std::vector<float> out(in.size());
  for (auto _ : state) {
    table->to_f32(in.data(), DType::kF16, in.size(), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * in.size() * 2));
  state.SetLabel(table->name);
}

void BM_KernelsFloatToHalf(benchmark::State& state) {
  const KernelTable* table = TableFor(static_cast<int>(state.range(0)));
  if (!table) return state.SkipWithError("SIMD level not available");
  std::vector<float> in(32768);
  const std::vector<uint16_t> h = RandomHalves(in.size());
  for (size_t i = 0; i < in.size(); ++i) in[i] = HalfToFloat(h[i]) * 1.001f;
  std::vector<uint16_t> out(in.size());
  for (auto _ : state) {
    table->from_f32(in.data(), in.size(), DType::kF16, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * in.size() * 2));
  state.SetLabel(table->name);
}

void CodecArgs(benchmark::internal::Benchmark* b) {
  const int64_t hd = static_cast<int64_t>(RotationKind::kHadamard);
  const int64_t hd2 = static_cast<int64_t>(RotationKind::kHadamard2);
  const int64_t haar = static_cast<int64_t>(RotationKind::kHaar);
  b->ArgNames({"simd", "dim", "bits", "rot"});
  for (int64_t level : {0, 1, 2}) b->Args({level, 128, 3, hd});  // the headline case
  for (int64_t level : {1, 2, 3}) {  // AVX2 against both AVX-512 builds, shape by shape
    for (int64_t bits : {1, 2, 4, 5, 8}) b->Args({level, 128, bits, hd});
    b->Args({level, 128, 3, hd2});
    b->Args({level, 64, 3, hd});
    b->Args({level, 64, 4, hd});
    b->Args({level, 256, 3, hd});
    b->Args({level, 96, 3, haar});
    b->Args({level, 128, 3, haar});
  }
}

BENCHMARK(BM_KernelsEncode)->Apply(CodecArgs);
BENCHMARK(BM_KernelsDecode)->Apply(CodecArgs);
BENCHMARK(BM_KernelsHalfToFloat)->Arg(0)->Arg(1)->Arg(2);
BENCHMARK(BM_KernelsFloatToHalf)->Arg(0)->Arg(1)->Arg(2);

}  // namespace
}  // namespace tqkv::kernels
