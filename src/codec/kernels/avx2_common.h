// The AVX2 lane traits (simd_lanes.h) and helpers of the AVX2 kernel files (*_avx2.cc, built with
// -mavx2 -mfma -mf16c): include only from those.
#ifndef TQKV_SRC_CODEC_KERNELS_AVX2_COMMON_H_
#define TQKV_SRC_CODEC_KERNELS_AVX2_COMMON_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "tqkv/types.h"

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

// 8 lanes.
struct Lanes {
  using V = __m256;
  using VI = __m256i;
  using DV = __m256d;
  using S8 = __m256;                     // Sum8's eight accumulators
  static constexpr int kN = 8;
  static constexpr int kDN = 4;          // doubles a DV
  static constexpr int kFwhtRegs = 8;    // FwhtRegs: register stages up to 8 registers
  static constexpr int kEnergyRegs = 0;  // channel energy: sums stay in memory (16 registers)

  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float f) { return _mm256_set1_ps(f); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static V LoadA(const float* p) { return _mm256_load_ps(p); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void StoreA(float* p, V v) { _mm256_store_ps(p, v); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Div(V a, V b) { return _mm256_div_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }  // a * b + c, one rounding

  // In-register FWHT stages h = 1, 2, 4. For lane i the reference computes a + b (low) or a - b
  // (high); here fma(self, +-1, partner): the product is exact, so one rounding of b + a or
  // a + (-b), which equal a + b and a - b bit for bit (NaN payloads aside).
  [[gnu::always_inline]] static V FwhtIn(V x) {
    const V s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const V s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const V s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    x = _mm256_fmadd_ps(x, s1, _mm256_permute_ps(x, 0xB1));
    x = _mm256_fmadd_ps(x, s2, _mm256_permute_ps(x, 0x4E));
    x = _mm256_fmadd_ps(x, s4, _mm256_permute2f128_ps(x, x, 0x01));
    return x;
  }

  // Lane l of the result: lane idx[l] of v (idx: kN int32).
  static V Permute(V v, const int32_t* idx) {
    return _mm256_permutevar8x32_ps(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(idx)));
  }
  // Lane l: lane idx[l] of a (idx < kN) or lane idx[l] - kN of b: both permuted (the permute
  // reads the low three bits), bit 3 moved to the sign picks.
  static V Permute2(V a, V b, const int32_t* idx) {
    const __m256i i = _mm256_load_si256(reinterpret_cast<const __m256i*>(idx));
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(a, i), _mm256_permutevar8x32_ps(b, i),
                            _mm256_castsi256_ps(_mm256_slli_epi32(i, 28)));
  }

  // kN elements of dtype kT from element c of row, as to_f32 converts them; back as from_f32.
  template <DType kT>
  static V LoadAs(const void* row, size_t c) {
    if constexpr (kT == DType::kF32) return _mm256_loadu_ps(static_cast<const float*>(row) + c);
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + c));
    if constexpr (kT == DType::kF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  template <DType kT>
  static void StoreAs(void* row, size_t c, V v) {
    if constexpr (kT == DType::kF32) {
      _mm256_storeu_ps(static_cast<float*>(row) + c, v);
    } else {
      auto* dst = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(row) + c);
      if constexpr (kT == DType::kF16) {
        _mm_storeu_si128(dst, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
      } else {
        _mm_storeu_si128(dst, FloatToBF16x8(v));
      }
    }
  }

  // Sum8 (kernels.h): lane k takes i % 8 == k. kSumStep floats a step.
  static constexpr int kSumStep = 8;
  static S8 S8Zero() { return _mm256_setzero_ps(); }
  static S8 AddSquares(S8 acc, V x) { return _mm256_add_ps(acc, _mm256_mul_ps(x, x)); }
  static S8 AddSquaresAt(S8 acc, const float* p) { return AddSquares(acc, Load(p)); }
  // The reference's reduction tree ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
  static float Reduce(S8 acc) {
    const __m128 t = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
  }
  static float Sqrt(float x) { return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(x))); }

  // Doubles: kDN elements of kT from element c, converted exactly.
  template <DType kT>
  static DV LoadAsDouble(const void* row, size_t c) {
    if constexpr (kT == DType::kF32) {
      return _mm256_cvtps_pd(_mm_loadu_ps(static_cast<const float*>(row) + c));
    }
    const __m128i h =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + c));
    if constexpr (kT == DType::kF16) return _mm256_cvtps_pd(_mm_cvtph_ps(h));
    return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16)));
  }
  static DV LoadD(const double* p) { return _mm256_loadu_pd(p); }
  static void StoreD(double* p, DV v) { _mm256_storeu_pd(p, v); }
  static DV AddD(DV a, DV b) { return _mm256_add_pd(a, b); }
  static DV MulD(DV a, DV b) { return _mm256_mul_pd(a, b); }
  // The low and high kDN lanes of v as doubles.
  static void ToDoubles(V v, DV* lo, DV* hi) {
    *lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    *hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
  }

  // Lanes picked by kN int32 indices.
  static V Gather(const float* base, const uint32_t* idx) {
    return _mm256_i32gather_ps(base, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx)), 4);
  }
  // num / den where den > 0 (ordered), else +0 (the division by 1 there, never by den).
  static V DivIfPositive(V num, V den) {
    const V pos = _mm256_cmp_ps(den, _mm256_setzero_ps(), _CMP_GT_OQ);
    return _mm256_and_ps(_mm256_div_ps(num, _mm256_blendv_ps(Set1(1.0f), den, pos)), pos);
  }
};

}  // namespace tqkv::kernels::avx2

#endif  // TQKV_SRC_CODEC_KERNELS_AVX2_COMMON_H_
