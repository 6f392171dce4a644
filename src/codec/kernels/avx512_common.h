// The AVX-512 lane traits (simd_lanes.h) and helpers of the AVX-512 kernel files (*_avx512.cc,
// built with -mavx512f/bw/vl/dq): include only from those.
#ifndef TQKV_SRC_CODEC_KERNELS_AVX512_COMMON_H_
#define TQKV_SRC_CODEC_KERNELS_AVX512_COMMON_H_

#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "tqkv/types.h"

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

inline __m256i FloatTo16(__m512 v, bool f16) {
  return f16 ? _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : FloatToBF16x16(v);
}

// 16 lanes. kFma8: the FWHT's h = 8 stage as an fma (the `avx512-fma8` table) or on the adders;
// a template parameter, so the two builds of avx512_kernels_avx512.cc instantiate the shared
// templates under different names.
template <bool kFma8>
struct Lanes {
  using V = __m512;
  using VI = __m512i;
  using DV = __m512d;
  using S8 = __m256;                      // Sum8's eight accumulators
  static constexpr int kN = 16;
  static constexpr int kDN = 8;           // doubles a DV
  static constexpr int kFwhtRegs = 16;    // FwhtRegs: register stages up to 16 registers
  static constexpr int kEnergyRegs = 16;  // channel energy: up to 16 DV sums held in registers

  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float f) { return _mm512_set1_ps(f); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static V LoadA(const float* p) { return _mm512_load_ps(p); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void StoreA(float* p, V v) { _mm512_store_ps(p, v); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Div(V a, V b) { return _mm512_div_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }  // a * b + c, one rounding

  // In-register FWHT stages h = 1, 2, 4, 8. For lane i the reference computes a + b (low) or
  // a - b (high); here fma(self, +-1, partner): the product is exact, so one rounding of b + a or
  // a + (-b), which equal a + b and a - b bit for bit (NaN payloads aside).
  [[gnu::always_inline]] static V FwhtIn(V x) {
    const V s1 = _mm512_setr_ps(1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1);
    const V s2 = _mm512_setr_ps(1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1);
    const V s4 = _mm512_setr_ps(1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1);
    x = _mm512_fmadd_ps(x, s1, _mm512_permute_ps(x, 0xB1));
    x = _mm512_fmadd_ps(x, s2, _mm512_permute_ps(x, 0x4E));
    x = _mm512_fmadd_ps(x, s4, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
    const V t = _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2));
    if constexpr (kFma8) {
      // Stage 8 as the others: Intel's 512-bit adds run on the fma ports, so one op beats two.
      const V s8 = _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1);
      return _mm512_fmadd_ps(x, s8, t);
    } else {
      // Stage 8 on the adders (a + b low, a - b high, both exact IEEE ops): on Zen 4 they are
      // pipes of their own, and the fma pipes carry the other three stages and the sign multiplies.
      return _mm512_mask_sub_ps(_mm512_add_ps(x, t), static_cast<__mmask16>(0xFF00), t, x);
    }
  }

  // Lane l of the result: lane idx[l] of v (idx: kN int32).
  static V Permute(V v, const int32_t* idx) {
    return _mm512_permutexvar_ps(_mm512_load_si512(idx), v);
  }
  // Lane l: lane idx[l] of a (idx < kN) or lane idx[l] - kN of b.
  static V Permute2(V a, V b, const int32_t* idx) {
    return _mm512_permutex2var_ps(a, _mm512_load_si512(idx), b);
  }

  // kN elements of dtype kT from element c of row, as to_f32 converts them; back as from_f32.
  template <DType kT>
  static V LoadAs(const void* row, size_t c) {
    if constexpr (kT == DType::kF32) return _mm512_loadu_ps(static_cast<const float*>(row) + c);
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + c));
    if constexpr (kT == DType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  template <DType kT>
  static void StoreAs(void* row, size_t c, V v) {
    if constexpr (kT == DType::kF32) {
      _mm512_storeu_ps(static_cast<float*>(row) + c, v);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(row) + c),
                          FloatTo16(v, kT == DType::kF16));
    }
  }

  // Sum8 (kernels.h): 16 squares are elements 16r..16r+15, the low half first, so lane k still
  // takes i % 8 == k in order of i. kSumStep floats a step.
  static constexpr int kSumStep = 16;
  static S8 S8Zero() { return _mm256_setzero_ps(); }
  static S8 AddSquares(S8 acc, V x) {
    const V sq = _mm512_mul_ps(x, x);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(sq));
    return _mm256_add_ps(acc, _mm512_extractf32x8_ps(sq, 1));
  }
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
      return _mm512_cvtps_pd(_mm256_loadu_ps(static_cast<const float*>(row) + c));
    }
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + c));
    if constexpr (kT == DType::kF16) return _mm512_cvtps_pd(_mm256_cvtph_ps(h));
    return _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  static DV LoadD(const double* p) { return _mm512_loadu_pd(p); }
  static void StoreD(double* p, DV v) { _mm512_storeu_pd(p, v); }
  static DV AddD(DV a, DV b) { return _mm512_add_pd(a, b); }
  static DV MulD(DV a, DV b) { return _mm512_mul_pd(a, b); }
  // The low and high kDN lanes of v as doubles.
  static void ToDoubles(V v, DV* lo, DV* hi) {
    *lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    *hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }

  // Lanes picked by kN int32 indices.
  static V Gather(const float* base, const uint32_t* idx) {
    return _mm512_i32gather_ps(_mm512_loadu_si512(idx), base, 4);
  }
  // num / den where den > 0 (ordered), else +0 (the division by 1 there, never by den).
  static V DivIfPositive(V num, V den) {
    const __mmask16 pos = _mm512_cmp_ps_mask(den, _mm512_setzero_ps(), _CMP_GT_OQ);
    return _mm512_maskz_mov_ps(pos, _mm512_div_ps(num, _mm512_mask_blend_ps(pos, Set1(1.0f), den)));
  }
};

}  // namespace tqkv::kernels::avx512

#endif  // TQKV_SRC_CODEC_KERNELS_AVX512_COMMON_H_
