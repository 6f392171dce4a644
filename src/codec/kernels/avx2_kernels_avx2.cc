// AVX2 + FMA + F16C kernels. Every result is bit-identical to ref.cc: same operations in the same
// order, only several lanes at a time.
#include <immintrin.h>

#include <cstring>

#include "codec/kernels/internal.h"
#include "codec/kernels/kernels.h"

namespace tqkv::kernels {
namespace {

void ToF32(const void* src, DType dtype, size_t n, float* dst) {
  size_t i = 0;
  if (dtype == DType::kF32) {
    std::memmove(dst, src, n * sizeof(float));
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  if (dtype == DType::kF16) {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
    }
  }
  ScalarKernels().to_f32(s + i, dtype, n - i, dst + i);
}

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

void FromF32(const float* src, size_t n, DType dtype, void* dst) {
  size_t i = 0;
  if (dtype == DType::kF32) {
    std::memmove(dst, src, n * sizeof(float));
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  if (dtype == DType::kF16) {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), FloatToBF16x8(_mm256_loadu_ps(src + i)));
    }
  }
  ScalarKernels().from_f32(src + i, n - i, dtype, d + i);
}

void Encode(const SubsetPlan& plan, const float* x, size_t x_stride, size_t n, uint8_t* norm_out,
            uint8_t* planes_out, size_t code_stride) {
  ScalarKernels().encode(plan, x, x_stride, n, norm_out, planes_out, code_stride);
}

void Decode(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
            size_t code_stride, size_t n, float* out, size_t out_stride) {
  ScalarKernels().decode(plan, norm_in, planes_in, code_stride, n, out, out_stride);
}

}  // namespace

namespace internal {
const KernelTable& Avx2Table() {
  static const KernelTable table{"avx2", ToF32, FromF32, Encode, Decode};
  return table;
}
}  // namespace internal

}  // namespace tqkv::kernels
