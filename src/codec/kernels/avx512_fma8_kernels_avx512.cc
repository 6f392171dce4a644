// The AVX-512 table with the FWHT's h = 8 stage as an fma (the `avx512-fma8` table): the same
// kernels, bit for bit the same results, one instruction choice apart; faster on Intel, where
// 512-bit adds share the fma ports (docs/lab/simd-avx512.md). dispatch.cc picks it on Intel CPUs.
#define TQKV_AVX512_FMA_STAGE8 1
#include "codec/kernels/avx512_kernels_avx512.cc"  // NOLINT(bugprone-suspicious-include)
