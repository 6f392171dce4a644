#include "tqkv/simd.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace tqkv {
namespace {

bool CpuHasAvx2() {
#if defined(__x86_64__) || defined(__i386__)
  // cpuid directly: clang 14's __builtin_cpu_supports does not know "f16c".
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
             f16c = c & (1u << 29);
  if (!(fma && osxsave && avx && f16c)) return false;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0x6u) != 0x6u) return false;  // the OS saves XMM and YMM state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return b & (1u << 5);  // AVX2
#else
  return false;
#endif
}

SimdLevel InitialLevel() {
  SimdLevel best = BestSimdLevel();
  if (const char* env = std::getenv("TQKV_SIMD")) {
    if (std::strcmp(env, "scalar") == 0) return SimdLevel::kScalar;
  }
  return best;
}

std::atomic<int>& ActiveStorage() {
  static std::atomic<int> level{static_cast<int>(InitialLevel())};
  return level;
}

}  // namespace

std::string_view SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return "scalar";
    case SimdLevel::kAvx2: return "avx2";
  }
  return "unknown";
}

SimdLevel BestSimdLevel() {
  static const SimdLevel best = CpuHasAvx2() ? SimdLevel::kAvx2 : SimdLevel::kScalar;
  return best;
}

std::vector<SimdLevel> SupportedSimdLevels() {
  std::vector<SimdLevel> levels{SimdLevel::kScalar};
  if (BestSimdLevel() >= SimdLevel::kAvx2) levels.push_back(SimdLevel::kAvx2);
  return levels;
}

SimdLevel ActiveSimdLevel() { return static_cast<SimdLevel>(ActiveStorage().load()); }

void ForceSimdLevel(SimdLevel level) {
  if (level > BestSimdLevel()) level = BestSimdLevel();
  ActiveStorage().store(static_cast<int>(level));
}

void ResetSimdLevel() { ActiveStorage().store(static_cast<int>(InitialLevel())); }

}  // namespace tqkv
