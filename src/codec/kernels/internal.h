// Private to the kernel layer: the pieces dispatch.cc and the SIMD files share.
#ifndef TQKV_SRC_CODEC_KERNELS_INTERNAL_H_
#define TQKV_SRC_CODEC_KERNELS_INTERNAL_H_

#include "codec/kernels/kernels.h"

namespace tqkv::kernels::internal {

// Defined in avx2_kernels_avx2.cc (x86-64 builds only); only call when the CPU has AVX2, FMA and
// F16C.
const KernelTable& Avx2Table();
// Defined in avx512_kernels_avx512.cc (x86-64 builds only); only call when
// SimdLevelSupported(SimdLevel::kAvx512).
const KernelTable& Avx512Table();
// Defined in neon_kernels_neon.cc (AArch64 builds only, where NEON is always present).
const KernelTable& NeonTable();

}  // namespace tqkv::kernels::internal

#endif  // TQKV_SRC_CODEC_KERNELS_INTERNAL_H_
