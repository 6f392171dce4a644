// Run-time SIMD level: kernels are picked once from CPU features; tests force each level.
#ifndef TQKV_INCLUDE_TQKV_SIMD_H_
#define TQKV_INCLUDE_TQKV_SIMD_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/status.h"

namespace tqkv {

// The numbers are names, not ranks: kNeon and the x86 levels never run on the same CPU, so
// "supported" is membership in SupportedSimdLevels(), never a comparison of values.
enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kNeon = 3 };

// "scalar", "avx2", "avx512", "neon".
std::string_view SimdLevelName(SimdLevel level);
// The inverse of SimdLevelName (exact, lower case); nullopt for any other text.
std::optional<SimdLevel> ParseSimdLevel(std::string_view name);
// Whether this CPU (and OS) runs the level: x86 AVX2 needs AVX2, FMA, F16C and the OS saving YMM
// state; AVX-512 needs that plus AVX-512 F, BW, VL, DQ and the OS saving ZMM and opmask state;
// NEON is every aarch64 CPU. Scalar always.
bool SimdLevelSupported(SimdLevel level);
// Every level this CPU can run, scalar first, then in order of preference.
std::vector<SimdLevel> SupportedSimdLevels();
// The preferred supported level (the last of SupportedSimdLevels()).
SimdLevel BestSimdLevel();
// "scalar, avx2, avx512": SupportedSimdLevels() for messages.
std::string SupportedSimdLevelNames();

// The TQKV_SIMD environment variable: OK when unset, empty, or naming a supported level;
// InvalidArgument (naming the supported levels) for an unknown name or a level this CPU lacks.
// The command-line tool refuses to run on an error; the library then keeps BestSimdLevel() and
// says so once on stderr.
Status SimdEnvironmentStatus();

// The level kernels use now: the one TQKV_SIMD names, or BestSimdLevel(), unless forced.
SimdLevel ActiveSimdLevel();
// Forces a level for tests and benchmarks. A level this CPU cannot run is refused
// (InvalidArgument) and the active level stays as it was: nothing silently runs another level.
// Not thread-safe against concurrent kernel calls.
Status ForceSimdLevel(SimdLevel level);
// Back to the level of ActiveSimdLevel() before any ForceSimdLevel.
void ResetSimdLevel();

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_SIMD_H_
