// Run-time SIMD level: kernels are picked once from CPU features; tests force each level.
#ifndef TQKV_INCLUDE_TQKV_SIMD_H_
#define TQKV_INCLUDE_TQKV_SIMD_H_

#include <string_view>
#include <vector>

namespace tqkv {

enum class SimdLevel { kScalar = 0, kAvx2 = 1 };

std::string_view SimdLevelName(SimdLevel level);
// The best level this CPU supports (AVX2 needs AVX2, FMA and F16C).
SimdLevel BestSimdLevel();
// Every level this CPU can run, scalar first.
std::vector<SimdLevel> SupportedSimdLevels();
// The level kernels use now: BestSimdLevel() unless forced, or the TQKV_SIMD environment variable
// ("scalar", "avx2") says otherwise.
SimdLevel ActiveSimdLevel();
// Forces a level (clamped to what the CPU supports); for tests and benchmarks. Not thread-safe
// against concurrent kernel calls.
void ForceSimdLevel(SimdLevel level);
void ResetSimdLevel();

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_SIMD_H_
