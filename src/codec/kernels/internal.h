// Private to the kernel layer: the pieces dispatch.cc and the SIMD files share.
#ifndef TQKV_SRC_CODEC_KERNELS_INTERNAL_H_
#define TQKV_SRC_CODEC_KERNELS_INTERNAL_H_

#include "codec/kernels/kernels.h"

namespace tqkv::kernels::internal {

// Defined in avx2_kernels_avx2.cc; only call when the CPU has AVX2, FMA and F16C.
const KernelTable& Avx2Table();
// Defined in avx512_kernels_avx512.cc; only call when SimdLevelSupported(SimdLevel::kAvx512).
const KernelTable& Avx512Table();

}  // namespace tqkv::kernels::internal

#endif  // TQKV_SRC_CODEC_KERNELS_INTERNAL_H_
