// Picks the kernel table for a SIMD level.
#include "codec/kernels/internal.h"
#include "codec/kernels/kernels.h"
#include "tqkv/convert.h"
#include "tqkv/types.h"

namespace tqkv::kernels {

const KernelTable* Avx2Kernels() {
  // The AVX2 level needs AVX2, FMA and F16C, everything the _avx2.cc files are compiled for.
  if (!SimdLevelSupported(SimdLevel::kAvx2)) return nullptr;
  return &internal::Avx2Table();
}

const KernelTable* Avx512Kernels() {
  if (!SimdLevelSupported(SimdLevel::kAvx512)) return nullptr;
  return &internal::Avx512Table();
}

const KernelTable& KernelsFor(SimdLevel level) {
  if (level == SimdLevel::kAvx512) {
    if (const KernelTable* t = Avx512Kernels()) return *t;
  }
  if (level == SimdLevel::kAvx2) {
    if (const KernelTable* t = Avx2Kernels()) return *t;
  }
  return ScalarKernels();
}

const KernelTable& ActiveKernels() { return KernelsFor(ActiveSimdLevel()); }

}  // namespace tqkv::kernels

namespace tqkv {

void ConvertToFloat(const void* src, DType t, size_t n, float* dst) {
  kernels::ActiveKernels().to_f32(src, t, n, dst);
}
void ConvertFromFloat(const float* src, size_t n, DType t, void* dst) {
  kernels::ActiveKernels().from_f32(src, n, t, dst);
}

}  // namespace tqkv
