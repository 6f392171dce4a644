// Picks the kernel table for a SIMD level.
#include <vector>

#include "codec/kernels/internal.h"
#include "codec/kernels/kernels.h"
#include "tqkv/types.h"

namespace tqkv::kernels {

// Each SIMD file is compiled only for its architecture (cmake/TqkvSimdSources.cmake), so each
// table exists only there.
const KernelTable* Avx2Kernels() {
#if defined(__x86_64__)
  // The AVX2 level needs AVX2, FMA and F16C, everything the _avx2.cc files are compiled for.
  if (!SimdLevelSupported(SimdLevel::kAvx2)) return nullptr;
  return &internal::Avx2Table();
#else
  return nullptr;
#endif
}

std::vector<const KernelTable*> Avx512KernelVariants() {
#if defined(__x86_64__)
  if (!SimdLevelSupported(SimdLevel::kAvx512)) return {};
  // Intel cores run 512-bit adds on their fma ports, Zen 4 on pipes of their own (measured:
  // docs/lab/simd-avx512.md); other vendors take the Zen 4 choice.
  static const bool intel = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") != 0;
  }();
  if (intel) return {&internal::Avx512FmaStage8Table(), &internal::Avx512Table()};
  return {&internal::Avx512Table(), &internal::Avx512FmaStage8Table()};
#else
  return {};
#endif
}

const KernelTable* Avx512Kernels() {
  static const KernelTable* const table = [] {
    const std::vector<const KernelTable*> v = Avx512KernelVariants();
    return v.empty() ? nullptr : v.front();
  }();
  return table;
}

const KernelTable* NeonKernels() {
#if defined(__aarch64__)
  return &internal::NeonTable();  // Advanced SIMD is mandatory on AArch64
#else
  return nullptr;
#endif
}

const KernelTable& KernelsFor(SimdLevel level) {
  if (level == SimdLevel::kAvx512) {
    if (const KernelTable* t = Avx512Kernels()) return *t;
  }
  if (level == SimdLevel::kAvx2) {
    if (const KernelTable* t = Avx2Kernels()) return *t;
  }
  if (level == SimdLevel::kNeon) {
    if (const KernelTable* t = NeonKernels()) return *t;
  }
  return ScalarKernels();
}

const KernelTable& ActiveKernels() { return KernelsFor(ActiveSimdLevel()); }

}  // namespace tqkv::kernels
