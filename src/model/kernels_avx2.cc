// AVX2 + FMA + F16C versions of the model kernels. Bit-identical to the scalar references in
// kernels.cc: integer block sums are exact, float operations are the same multiplies and adds in
// the same order (no fused multiply-add: -ffp-contract=off, and no _mm*_fmadd_* here).
#include <immintrin.h>

#include <cstring>

#include "model/kernels.h"
#include "tqkv/types.h"

namespace tqkv::model {
namespace {

inline float LoadHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 32 weights of a q4 block as unsigned bytes 0..15, element order 0..31.
inline __m256i UnpackNibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F));
  return _mm256_set_m128i(hi, lo);
}

// Eight int32 partial sums of u8 x s8 products (|products| small enough: no saturation).
inline __m256i DotU8S8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// The four exact totals of p0..p3 (each 8 x int32), in lanes 0..3.
inline __m128i Sum4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

inline int32_t Sum1(__m256i p) {
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
  const __m128i s2 = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xB1)));
}

template <GgmlType kType>
constexpr size_t BlockBytes() {
  return kType == GgmlType::kQ4_0 ? sizeof(BlockQ4_0)
         : kType == GgmlType::kQ4_1 ? sizeof(BlockQ4_1)
                                    : sizeof(BlockQ8_0);
}

// Integer dot of one weight block with one activation block (raw sum of w * a, before offsets).
template <GgmlType kType>
inline __m256i BlockProducts(__m256i w, const BlockQ8Act& a) {
  const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs));
  if constexpr (kType == GgmlType::kQ8_0) {
    return DotU8S8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(av, w));
  } else {
    return DotU8S8(w, av);
  }
}

template <GgmlType kType>
inline __m256i LoadWeights(const uint8_t* blk) {
  if constexpr (kType == GgmlType::kQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  } else {
    return UnpackNibbles(blk + (kType == GgmlType::kQ4_1 ? 4 : 2));
  }
}

template <GgmlType kType>
void QuantDotAvx2(const uint8_t* w_row, const BlockQ8Act* acts, size_t act_stride, size_t nblocks,
                  size_t n_tokens, float* out, size_t out_stride) {
  constexpr size_t kBB = BlockBytes<kType>();
  size_t t = 0;
  for (; t + 4 <= n_tokens; t += 4) {
    const BlockQ8Act* a0 = acts + t * act_stride;
    const BlockQ8Act* a1 = a0 + act_stride;
    const BlockQ8Act* a2 = a1 + act_stride;
    const BlockQ8Act* a3 = a2 + act_stride;
    __m128 acc = _mm_setzero_ps();
    for (size_t b = 0; b < nblocks; ++b) {
      const uint8_t* blk = w_row + b * kBB;
      const __m256i w = LoadWeights<kType>(blk);
      __m128i isum = Sum4(BlockProducts<kType>(w, a0[b]), BlockProducts<kType>(w, a1[b]),
                          BlockProducts<kType>(w, a2[b]), BlockProducts<kType>(w, a3[b]));
      const __m128 da = _mm_set_ps(a3[b].d, a2[b].d, a1[b].d, a0[b].d);
      const __m128 dw = _mm_set1_ps(LoadHalf(blk));
      if constexpr (kType == GgmlType::kQ4_0) {
        const __m128i asum = _mm_set_epi32(a3[b].sum, a2[b].sum, a1[b].sum, a0[b].sum);
        isum = _mm_sub_epi32(isum, _mm_slli_epi32(asum, 3));
      }
      acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(dw, da)));
      if constexpr (kType == GgmlType::kQ4_1) {
        const __m128i asum = _mm_set_epi32(a3[b].sum, a2[b].sum, a1[b].sum, a0[b].sum);
        const __m128 mw = _mm_set1_ps(LoadHalf(blk + 2));
        acc = _mm_add_ps(acc, _mm_mul_ps(mw, _mm_mul_ps(da, _mm_cvtepi32_ps(asum))));
      }
    }
    float r[4];
    _mm_storeu_ps(r, acc);
    for (int i = 0; i < 4; ++i) out[(t + i) * out_stride] = r[i];
  }
  for (; t < n_tokens; ++t) {
    const BlockQ8Act* a = acts + t * act_stride;
    float acc = 0.0f;
    for (size_t b = 0; b < nblocks; ++b) {
      const uint8_t* blk = w_row + b * kBB;
      int32_t isum = Sum1(BlockProducts<kType>(LoadWeights<kType>(blk), a[b]));
      const float dw = LoadHalf(blk);
      if constexpr (kType == GgmlType::kQ4_0) isum -= 8 * a[b].sum;
      acc = acc + static_cast<float>(isum) * (dw * a[b].d);
      if constexpr (kType == GgmlType::kQ4_1) {
        acc = acc + LoadHalf(blk + 2) * (a[b].d * static_cast<float>(a[b].sum));
      }
    }
    out[t * out_stride] = acc;
  }
}

float DotF32Avx2(const float* a, const float* b, size_t n) {
  __m256 acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  }
  float l[8];
  _mm256_storeu_ps(l, acc);
  for (; i < n; ++i) l[i % 8] = l[i % 8] + a[i] * b[i];
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

float DotF16Avx2(const uint16_t* w, const float* x, size_t n) {
  __m256 acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 wf =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
    acc = _mm256_add_ps(acc, _mm256_mul_ps(wf, _mm256_loadu_ps(x + i)));
  }
  float l[8];
  _mm256_storeu_ps(l, acc);
  for (; i < n; ++i) l[i % 8] = l[i % 8] + _cvtsh_ss(w[i]) * x[i];
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

float DotBF16Avx2(const uint16_t* w, const float* x, size_t n) {
  __m256 acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i wi = _mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i))), 16);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_castsi256_ps(wi), _mm256_loadu_ps(x + i)));
  }
  float l[8];
  _mm256_storeu_ps(l, acc);
  for (; i < n; ++i) l[i % 8] = l[i % 8] + BF16ToFloat(w[i]) * x[i];
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

void AxpyF16Avx2(float a, const uint16_t* v, float* out, size_t n) {
  const __m256 av = _mm256_set1_ps(a);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 vf =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i)));
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_mul_ps(av, vf)));
  }
  for (; i < n; ++i) out[i] = out[i] + a * _cvtsh_ss(v[i]);
}

}  // namespace

const ModelKernels& Avx2ModelKernels() {
  static const ModelKernels k = {
      SimdLevel::kAvx2,  QuantDotAvx2<GgmlType::kQ4_0>, QuantDotAvx2<GgmlType::kQ4_1>,
      QuantDotAvx2<GgmlType::kQ8_0>, DotF32Avx2, DotF16Avx2, DotBF16Avx2, AxpyF16Avx2,
  };
  return k;
}

}  // namespace tqkv::model
