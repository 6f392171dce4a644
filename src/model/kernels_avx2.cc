// AVX2 + FMA + F16C versions of the model kernels. Bit-identical to the scalar references in
// kernels.cc: integer block sums are exact, float operations are the same multiplies and adds in
// the same order (no fused multiply-add: -ffp-contract=off, and no _mm*_fmadd_* here).
#include <immintrin.h>

#include <cmath>
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
  return kType == GgmlType::kQ4_0   ? sizeof(BlockQ4_0)
         : kType == GgmlType::kQ4_1 ? sizeof(BlockQ4_1)
                                    : sizeof(BlockQ8_0);
}

// Integer products of one weight block with one token's activations (before offsets).
template <GgmlType kType>
inline __m256i BlockProducts(__m256i w, __m256i w_abs, const int8_t* aq) {
  const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq));
  if constexpr (kType == GgmlType::kQ8_0) {
    return DotU8S8(w_abs, _mm256_sign_epi8(av, w));
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
void QuantDotAvx2(const uint8_t* w_row, const BlockQ8x4* acts, size_t nblocks, size_t n_tokens,
                  float* out, size_t out_stride) {
  constexpr size_t kBB = BlockBytes<kType>();
  for (size_t t = 0; t < n_tokens; t += 4) {
    const BlockQ8x4* a = acts + (t / 4) * nblocks;
    if (n_tokens - t == 1) {  // one token (decode): lane 0 only, same scalar float operations
      float acc1 = 0.0f;
      for (size_t b = 0; b < nblocks; ++b) {
        const uint8_t* blk = w_row + b * kBB;
        const __m256i w = LoadWeights<kType>(blk);
        const __m256i w_abs = kType == GgmlType::kQ8_0 ? _mm256_sign_epi8(w, w) : w;
        int32_t isum = Sum1(BlockProducts<kType>(w, w_abs, a[b].qs[0]));
        if constexpr (kType == GgmlType::kQ4_0) isum -= 8 * a[b].sum[0];
        acc1 = acc1 + static_cast<float>(isum) * (LoadHalf(blk) * a[b].d[0]);
        if constexpr (kType == GgmlType::kQ4_1) acc1 = acc1 + LoadHalf(blk + 2) * a[b].ds[0];
      }
      out[t * out_stride] = acc1;
      break;
    }
    __m128 acc = _mm_setzero_ps();
    for (size_t b = 0; b < nblocks; ++b) {
      const uint8_t* blk = w_row + b * kBB;
      const __m256i w = LoadWeights<kType>(blk);
      const __m256i w_abs = kType == GgmlType::kQ8_0 ? _mm256_sign_epi8(w, w) : w;
      const BlockQ8x4& ab = a[b];
      __m128i isum =
          Sum4(BlockProducts<kType>(w, w_abs, ab.qs[0]), BlockProducts<kType>(w, w_abs, ab.qs[1]),
               BlockProducts<kType>(w, w_abs, ab.qs[2]), BlockProducts<kType>(w, w_abs, ab.qs[3]));
      const __m128 da = _mm_loadu_ps(ab.d);
      const __m128 dw = _mm_set1_ps(LoadHalf(blk));
      if constexpr (kType == GgmlType::kQ4_0) {
        const __m128i asum = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ab.sum));
        isum = _mm_sub_epi32(isum, _mm_slli_epi32(asum, 3));
      }
      acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(dw, da)));
      if constexpr (kType == GgmlType::kQ4_1) {
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_set1_ps(LoadHalf(blk + 2)), _mm_loadu_ps(ab.ds)));
      }
    }
    float r[4];
    _mm_storeu_ps(r, acc);
    const size_t valid = n_tokens - t < 4 ? n_tokens - t : 4;
    for (size_t i = 0; i < valid; ++i) out[(t + i) * out_stride] = r[i];
  }
}

// One block of 32 weights dequantized into 4 x 8 floats (elements 0..31), the same multiply and
// add per element as DequantBlockRef.
template <GgmlType kType>
inline void DequantBlockAvx2(const uint8_t* blk, __m256 out[4]) {
  const __m256 dw = _mm256_set1_ps(LoadHalf(blk));
  if constexpr (kType == GgmlType::kQ8_0) {
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
    out[0] = _mm256_mul_ps(dw, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0)));
    out[1] = _mm256_mul_ps(dw, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8))));
    out[2] = _mm256_mul_ps(dw, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1)));
    out[3] = _mm256_mul_ps(dw, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8))));
  } else {
    const __m128i raw =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (kType == GgmlType::kQ4_1 ? 4 : 2)));
    __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(0x0F));                     // elements 0..15
    __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F));  // 16..31
    if constexpr (kType == GgmlType::kQ4_0) {
      lo = _mm_sub_epi8(lo, _mm_set1_epi8(8));
      hi = _mm_sub_epi8(hi, _mm_set1_epi8(8));
    }
    const __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    const __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    const __m256 f2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    const __m256 f3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
    if constexpr (kType == GgmlType::kQ4_0) {
      out[0] = _mm256_mul_ps(dw, f0);
      out[1] = _mm256_mul_ps(dw, f1);
      out[2] = _mm256_mul_ps(dw, f2);
      out[3] = _mm256_mul_ps(dw, f3);
    } else {
      const __m256 mw = _mm256_set1_ps(LoadHalf(blk + 2));
      out[0] = _mm256_add_ps(_mm256_mul_ps(dw, f0), mw);
      out[1] = _mm256_add_ps(_mm256_mul_ps(dw, f1), mw);
      out[2] = _mm256_add_ps(_mm256_mul_ps(dw, f2), mw);
      out[3] = _mm256_add_ps(_mm256_mul_ps(dw, f3), mw);
    }
  }
}

// ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) of the 8 lanes.
inline float Reduce8Avx2(__m256 acc) {
  float l[8];
  _mm256_storeu_ps(l, acc);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// Up to 4 tokens at a time share each dequantized block; every token keeps its own 8 lane
// accumulators, updated in element order like QuantDotF32Ref.
template <GgmlType kType>
void QuantDotF32Avx2(const uint8_t* w_row, size_t nblocks, const float* x, size_t x_stride,
                     size_t n_tokens, float* out, size_t out_stride) {
  constexpr size_t kBB = BlockBytes<kType>();
  size_t t = 0;
  for (; t + 4 <= n_tokens; t += 4) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    const float* x0 = x + t * x_stride;
    for (size_t b = 0; b < nblocks; ++b) {
      __m256 w[4];
      DequantBlockAvx2<kType>(w_row + b * kBB, w);
      for (int i = 0; i < 4; ++i) {
        const float* xb = x0 + i * x_stride + b * 32;
        for (int k = 0; k < 4; ++k) {
          acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(w[k], _mm256_loadu_ps(xb + 8 * k)));
        }
      }
    }
    for (int i = 0; i < 4; ++i) out[(t + i) * out_stride] = Reduce8Avx2(acc[i]);
  }
  for (; t < n_tokens; ++t) {
    __m256 acc = _mm256_setzero_ps();
    const float* xt = x + t * x_stride;
    for (size_t b = 0; b < nblocks; ++b) {
      __m256 w[4];
      DequantBlockAvx2<kType>(w_row + b * kBB, w);
      for (int k = 0; k < 4; ++k) {
        acc = _mm256_add_ps(acc, _mm256_mul_ps(w[k], _mm256_loadu_ps(xt + b * 32 + 8 * k)));
      }
    }
    out[t * out_stride] = Reduce8Avx2(acc);
  }
}

void QuantizeX4Avx2(const float* x, size_t stride, size_t n_tokens, size_t elems, BlockQ8x4* out) {
  const size_t nb = elems / kQkBlock;
  std::memset(out, 0, nb * sizeof(BlockQ8x4));
  const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  for (size_t t = 0; t < n_tokens && t < 4; ++t) {
    for (size_t b = 0; b < nb; ++b) {
      const float* xb = x + t * stride + b * kQkBlock;
      __m256 v[4];
      __m256 mx = _mm256_setzero_ps();
      for (int k = 0; k < 4; ++k) {
        v[k] = _mm256_loadu_ps(xb + 8 * k);
        mx = _mm256_max_ps(_mm256_and_ps(v[k], sign_mask), mx);  // NaN lanes keep mx
      }
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
      const float amax = _mm_cvtss_f32(m4);
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const __m256 idv = _mm256_set1_ps(id);
      __m256i q[4];
      for (int k = 0; k < 4; ++k) {
        __m256 s = _mm256_mul_ps(v[k], idv);
        s = _mm256_max_ps(s, lo);  // NaN -> -127 (max returns the second operand)
        s = _mm256_min_ps(s, hi);
        q[k] = _mm256_cvtps_epi32(s);  // round to nearest even
      }
      const __m256i sum32 =
          _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
      const int32_t sum = Sum1(sum32);
      // Pack 32 int32 -> 32 int8 in element order.
      const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);  // lanes interleaved per 128 bits
      const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
      __m256i p = _mm256_packs_epi16(p01, p23);
      p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs[t]), p);
      out[b].d[t] = d;
      out[b].sum[t] = sum;
      out[b].ds[t] = d * static_cast<float>(sum);
    }
  }
}

float DotF16Avx2(const uint16_t* w, const float* x, size_t n);

// out[r] = DotF16(k + r * stride, x, n): eight rows at a time, each reduced in the scalar order.
void DotF16RowsAvx2(const uint16_t* k, size_t stride, size_t n_rows, const float* x, size_t n,
                    float* out) {
  size_t r = 0;
  if (n % 8 == 0) {
    for (; r + 8 <= n_rows; r += 8) {
      __m256 acc[8];
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
      for (size_t i = 0; i < n; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        for (int j = 0; j < 8; ++j) {
          const __m256 kv = _mm256_cvtph_ps(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(k + (r + j) * stride + i)));
          acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(kv, xv));
        }
      }
      // hadd pairs lanes (0+1, 2+3) then ((0+1)+(2+3)) within each 128-bit half; the final add
      // joins the halves: exactly ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) per row.
      const __m256 h01 = _mm256_hadd_ps(acc[0], acc[1]);
      const __m256 h23 = _mm256_hadd_ps(acc[2], acc[3]);
      const __m256 h45 = _mm256_hadd_ps(acc[4], acc[5]);
      const __m256 h67 = _mm256_hadd_ps(acc[6], acc[7]);
      const __m256 g0 = _mm256_hadd_ps(h01, h23);  // rows 0..3: low half l0..3, high half l4..7
      const __m256 g1 = _mm256_hadd_ps(h45, h67);  // rows 4..7
      const __m256 lo = _mm256_permute2f128_ps(g0, g1, 0x20);
      const __m256 hi = _mm256_permute2f128_ps(g0, g1, 0x31);
      _mm256_storeu_ps(out + r, _mm256_add_ps(lo, hi));
    }
  }
  for (; r < n_rows; ++r) out[r] = DotF16Avx2(k + r * stride, x, n);
}

template <int kVecs>
inline void WeightedSumColumns(const float* p, const uint16_t* v, size_t stride, size_t n_rows,
                               float* out) {
  __m256 acc[kVecs];
  for (int j = 0; j < kVecs; ++j) acc[j] = _mm256_setzero_ps();
  for (size_t r = 0; r < n_rows; ++r) {
    const __m256 pr = _mm256_set1_ps(p[r]);
    const uint16_t* vr = v + r * stride;
    for (int j = 0; j < kVecs; ++j) {
      const __m256 vf =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vr + 8 * j)));
      acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(pr, vf));
    }
  }
  for (int j = 0; j < kVecs; ++j) _mm256_storeu_ps(out + 8 * j, acc[j]);
}

void WeightedSumF16Avx2(const float* p, const uint16_t* v, size_t stride, size_t n_rows, size_t n,
                        float* out) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) WeightedSumColumns<8>(p, v + i, stride, n_rows, out + i);
  for (; i + 32 <= n; i += 32) WeightedSumColumns<4>(p, v + i, stride, n_rows, out + i);
  for (; i + 8 <= n; i += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (size_t r = 0; r < n_rows; ++r) {
      const __m256 vf =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + r * stride + i)));
      acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(p[r]), vf));
    }
    _mm256_storeu_ps(out + i, acc);
  }
  for (; i < n; ++i) {
    float acc = 0.0f;
    for (size_t r = 0; r < n_rows; ++r) acc = acc + p[r] * _cvtsh_ss(v[r * stride + i]);
    out[i] = acc;
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
    const __m256 wf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
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

// ExpNeg of 8 lanes, the same operations as the scalar ExpNeg (kernels.cc).
inline __m256 ExpNeg8(__m256 x) {
  const __m256 valid = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_GE_OQ);  // NaN: false
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Hi)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Lo)));
  __m256 p = _mm256_set1_ps(kExpC6);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kExpC5));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kExpC4));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kExpC3));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kExpC2));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_and_ps(n, valid)), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), valid);
}

void SoftmaxAvx2(float* s, size_t n, float scale) {
  const __m256 sc = _mm256_set1_ps(scale);
  __m256 mxv = _mm256_set1_ps(-INFINITY);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_div_ps(_mm256_loadu_ps(s + i), sc);
    _mm256_storeu_ps(s + i, v);
    mxv = _mm256_max_ps(v, mxv);
  }
  float m8[8];
  _mm256_storeu_ps(m8, mxv);
  float mx = -INFINITY;
  for (int j = 0; j < 8; ++j) mx = m8[j] > mx ? m8[j] : mx;
  for (; i < n; ++i) {
    s[i] = s[i] / scale;
    mx = s[i] > mx ? s[i] : mx;
  }
  const __m256 mv = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = ExpNeg8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
    _mm256_storeu_ps(s + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float l[8];
  _mm256_storeu_ps(l, acc);
  for (; i < n; ++i) {
    s[i] = ExpNeg(s[i] - mx);
    l[i % 8] = l[i % 8] + s[i];
  }
  const float sum = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  const __m256 sv = _mm256_set1_ps(sum);
  i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, _mm256_div_ps(_mm256_loadu_ps(s + i), sv));
  for (; i < n; ++i) s[i] = s[i] / sum;
}

}  // namespace

const ModelKernels& Avx2ModelKernels() {
  static const ModelKernels k = {
      SimdLevel::kAvx2,
      QuantizeX4Avx2,
      QuantDotAvx2<GgmlType::kQ4_0>,
      QuantDotAvx2<GgmlType::kQ4_1>,
      QuantDotAvx2<GgmlType::kQ8_0>,
      QuantDotF32Avx2<GgmlType::kQ4_0>,
      QuantDotF32Avx2<GgmlType::kQ4_1>,
      QuantDotF32Avx2<GgmlType::kQ8_0>,
      DotF32Avx2,
      DotF16Avx2,
      DotBF16Avx2,
      DotF16RowsAvx2,
      WeightedSumF16Avx2,
      SoftmaxAvx2,
  };
  return k;
}

}  // namespace tqkv::model
