// Helpers shared by the AVX-512 kernel files (*_avx512.cc, built with -mavx512f/bw/vl/dq):
// include only from those.
#ifndef TQKV_SRC_CODEC_KERNELS_AVX512_COMMON_H_
#define TQKV_SRC_CODEC_KERNELS_AVX512_COMMON_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace tqkv::kernels::avx512 {

inline __mmask16 LowMask16(size_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// Same rounding as FloatToBF16: nearest even, NaN keeps its top bits with the quiet bit set.
inline __m256i FloatToBF16x16(__m512 f) {
  const __m512i x = _mm512_castps_si512(f);
  const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F800000));
  const __m512i hi = _mm512_srli_epi32(x, 16);
  const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  const __m512i r = _mm512_mask_or_epi32(rounded, is_nan, hi, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);  // values fit 16 bits
}

// FWHT stages h = 1 .. kN/2 across kN registers (register j pairs with j + h): the reference's
// adds and subtracts, stage by stage.
template <int kN>
[[gnu::always_inline]] inline void ButterflyStages(__m512* v) {
#pragma GCC unroll 8
  for (int h = 1; h < kN; h <<= 1) {
#pragma GCC unroll 32
    for (int j = 0; j < kN; ++j) {
      if (j & h) continue;
      const __m512 a = v[j], b = v[j + h];
      v[j] = _mm512_add_ps(a, b);
      v[j + h] = _mm512_sub_ps(a, b);
    }
  }
}

}  // namespace tqkv::kernels::avx512

#endif  // TQKV_SRC_CODEC_KERNELS_AVX512_COMMON_H_
