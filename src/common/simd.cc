#include "tqkv/simd.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace tqkv {
namespace {

struct CpuLevels {
  bool avx2 = false;
  bool avx512 = false;
  bool neon = false;
};

CpuLevels DetectCpu() {
  CpuLevels l;
#if defined(__x86_64__) || defined(__i386__)
  // cpuid directly: clang 14's __builtin_cpu_supports does not know "f16c".
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return l;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
             f16c = c & (1u << 29);
  if (!(fma && osxsave && avx && f16c)) return l;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0x6u) != 0x6u) return l;  // the OS saves XMM and YMM state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return l;
  l.avx2 = b & (1u << 5);
  const bool f = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30), vl = b & (1u << 31);
  // XCR0 bits 5-7: the OS saves the opmask registers, the upper halves of ZMM0-15 and ZMM16-31.
  const bool os_zmm = (xcr0_lo & 0xE0u) == 0xE0u;
  l.avx512 = l.avx2 && f && dq && bw && vl && os_zmm;
#elif defined(__aarch64__)
  l.neon = true;  // Advanced SIMD is mandatory on AArch64
#endif
  return l;
}

const CpuLevels& Cpu() {
  static const CpuLevels levels = DetectCpu();
  return levels;
}

SimdLevel InitialLevel() {
  const char* env = std::getenv("TQKV_SIMD");
  if (env == nullptr || *env == '\0') return BestSimdLevel();
  const auto level = ParseSimdLevel(env);
  if (level && SimdLevelSupported(*level)) return *level;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    std::fprintf(stderr, "tqkv: warning: %s; using %s\n", SimdEnvironmentStatus().message().c_str(),
                 std::string(SimdLevelName(BestSimdLevel())).c_str());
  }
  return BestSimdLevel();
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
    case SimdLevel::kAvx512: return "avx512";
    case SimdLevel::kNeon: return "neon";
  }
  return "unknown";
}

std::optional<SimdLevel> ParseSimdLevel(std::string_view name) {
  for (SimdLevel l : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kNeon}) {
    if (name == SimdLevelName(l)) return l;
  }
  return std::nullopt;
}

bool SimdLevelSupported(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return true;
    case SimdLevel::kAvx2: return Cpu().avx2;
    case SimdLevel::kAvx512: return Cpu().avx512;
    case SimdLevel::kNeon: return Cpu().neon;
  }
  return false;
}

std::vector<SimdLevel> SupportedSimdLevels() {
  std::vector<SimdLevel> levels{SimdLevel::kScalar};
  for (SimdLevel l : {SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kNeon}) {
    if (SimdLevelSupported(l)) levels.push_back(l);
  }
  return levels;
}

SimdLevel BestSimdLevel() {
  static const SimdLevel best = SupportedSimdLevels().back();
  return best;
}

std::string SupportedSimdLevelNames() {
  std::string s;
  for (SimdLevel l : SupportedSimdLevels()) {
    if (!s.empty()) s += ", ";
    s += SimdLevelName(l);
  }
  return s;
}

Status SimdEnvironmentStatus() {
  const char* env = std::getenv("TQKV_SIMD");
  if (env == nullptr || *env == '\0') return Status::Ok();
  const auto level = ParseSimdLevel(env);
  if (!level) {
    return Status::InvalidArgument("TQKV_SIMD=" + std::string(env) +
                                   " is not a SIMD level (this CPU supports: " +
                                   SupportedSimdLevelNames() + ")");
  }
  if (!SimdLevelSupported(*level)) {
    return Status::InvalidArgument("TQKV_SIMD=" + std::string(env) +
                                   ": this CPU does not support it (supported: " +
                                   SupportedSimdLevelNames() + ")");
  }
  return Status::Ok();
}

SimdLevel ActiveSimdLevel() { return static_cast<SimdLevel>(ActiveStorage().load()); }

Status ForceSimdLevel(SimdLevel level) {
  if (!SimdLevelSupported(level)) {
    return Status::InvalidArgument("SIMD level " + std::string(SimdLevelName(level)) +
                                   " is not supported by this CPU (supported: " +
                                   SupportedSimdLevelNames() + ")");
  }
  ActiveStorage().store(static_cast<int>(level));
  return Status::Ok();
}

void ResetSimdLevel() { ActiveStorage().store(static_cast<int>(InitialLevel())); }

}  // namespace tqkv
