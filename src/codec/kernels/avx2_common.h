// Helpers shared by the AVX2 kernel files (*_avx2.cc, built with -mavx2 -mfma -mf16c): include
// only from those.
#ifndef TQKV_SRC_CODEC_KERNELS_AVX2_COMMON_H_
#define TQKV_SRC_CODEC_KERNELS_AVX2_COMMON_H_

#include <immintrin.h>

namespace tqkv::kernels::avx2 {

// Same rounding as FloatToBF16: nearest even, NaN keeps its top bits with the quiet bit set.
inline __m128i FloatToBF16x8(__m256 f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
  const __m256i packed = _mm256_packus_epi32(r, r);  // values fit 16 bits: no saturation
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

}  // namespace tqkv::kernels::avx2

#endif  // TQKV_SRC_CODEC_KERNELS_AVX2_COMMON_H_
