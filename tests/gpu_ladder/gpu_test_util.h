// Shared by tests/gpu_ladder (CPU side, label gpu_ladder) and tests/gpu (device, label gpu).
#ifndef TQKV_TESTS_GPU_LADDER_GPU_TEST_UTIL_H_
#define TQKV_TESTS_GPU_LADDER_GPU_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tqkv/types.h"

namespace tqkv::gpu_test {

// Every codec the GPU kernels must reproduce: all presets and the norm/rotation variants.
inline const std::vector<std::string>& KernelSpecs() {
  static const std::vector<std::string> specs = {
      "tq1", "tq2", "tq3", "tq4", "tq5", "tq8", "tq2.5", "tq3.5",
      "tq3,norm=f16", "tq3,nc=1", "tq2.5,norm=f16,nc=1", "tq:b=3,rot=hd2", "tq:b=3,rot=haar",
      "tq:b=4,split=5@6", "tq:b=2,split=1/2@3,rot=haar"};
  return specs;
}
inline const std::vector<uint32_t>& KernelHeadDims() {
  static const std::vector<uint32_t> dims = {64, 128, 256};
  return dims;
}

// n vectors of d floats: a pseudo-Gaussian with per-channel scales (a few outlier channels), plus
// edge vectors at fixed rows: 1 all zeros, 2 with a NaN, 3 with an inf, 4 tiny (sum of squares
// underflows), 5 huge (f16 max).
inline std::vector<float> TestVectors(size_t n, uint32_t d, uint64_t seed) {
  std::vector<float> x(n * d);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  auto uni = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(s >> 40) / 16777216.0f - 0.5f;
  };
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t c = 0; c < d; ++c) {
      const float scale = (c % 13 == 3) ? 8.0f : 1.0f + 0.01f * static_cast<float>(c % 7);
      x[i * d + c] = (uni() + uni() + uni() + uni()) * scale;
    }
  }
  auto row = [&](size_t r) { return r < n ? &x[r * d] : nullptr; };
  if (float* r = row(1)) std::fill(r, r + d, 0.0f);
  if (float* r = row(2)) r[d / 3] = std::nanf("");
  if (float* r = row(3)) r[d - 1] = INFINITY;
  if (float* r = row(4)) std::fill(r, r + d, 1e-30f);
  if (float* r = row(5)) std::fill(r, r + d, 65504.0f);
  return x;
}

// TestVectors for a norm=f16 codec, whose Encode refuses a norm of 65520 or more (f16 stores it
// as inf): rows 3 (an inf element) and 5 (every element 65504) get a norm of 32752 instead, half
// the range, so the norm correction (nc=1) of a coarse code stays below it too.
inline std::vector<float> TestVectorsFor(DType norm_dtype, size_t n, uint32_t d, uint64_t seed) {
  std::vector<float> x = TestVectors(n, d, seed);
  if (norm_dtype != DType::kF16) return x;
  if (n > 3) x[3 * d + d - 1] = 30000.0f;
  if (n > 5) std::fill(&x[5 * d], &x[5 * d] + d, 32752.0f / std::sqrt(static_cast<float>(d)));
  return x;
}

inline std::vector<uint16_t> ToHalf(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = FloatToHalf(x[i]);
  return h;
}

}  // namespace tqkv::gpu_test

#endif  // TQKV_TESTS_GPU_LADDER_GPU_TEST_UTIL_H_
