#include "tqkv/simd.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace tqkv {
namespace {

bool CpuHasAvx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
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
