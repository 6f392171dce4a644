// AVX-512 kernels of the transform codec's fused route (docs/codec.md §11): dequantize and
// transform_assemble of both AVX-512 tables, 16 vectors at a time as the lanes of transposed
// columns (the AVX2 file's design, one zmm per row position). Bit-identical to ref.cc, as every
// table. Built once: the FWHT here is adds and subtracts, so the tables' fma choice is moot.
#include <immintrin.h>
// gcc 12's AVX-512 intrinsics pass _mm512_undefined_*() as the unused merge operand (see
// avx512_kernels_avx512.cc).
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // gcc's own group
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cstring>

// Built with -mf16c: the norm helpers of internal.h convert in hardware.
#define TQKV_KERNELS_F16C 1
#include "codec/kernels/avx512_common.h"
#include "codec/kernels/internal.h"
#include "codec/kernels/kernels.h"
#include "codec/kernels/simd_transform.h"

namespace tqkv::kernels {
namespace {

using L = avx512::Lanes<false>;  // the FWHT here is adds and subtracts: no fma choice
using avx512::FloatToBF16x16;
using avx512::LowMask16;
using internal::Unroll;
using simd::kMaxCols;
using Columns = simd::Columns<L>;
using Words = simd::Words<L>;

// ---- dequantize: v[j] = centroid[idx[j]] * a, 16 positions a register ----

constexpr uint32_t kMaxBits = 5;  // up to 32 centroids in two registers

// Each plane's bits are the lanes of a masked add (16 positions, the mask loaded straight from
// the plane): the indices without an unpack to bytes. A block of 8 is one half register.
template <uint32_t kBits, bool kHalf>
void DequantizeBits(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
                    size_t code_stride, size_t n, float* out, size_t out_stride) {
  alignas(64) float cent[32] = {};
  for (uint32_t k = 0; k < (1u << kBits); ++k) cent[k] = plan.centroids[k];
  const __m512 c0 = _mm512_load_ps(cent), c1 = _mm512_load_ps(cent + 16);
  const size_t m = plan.dim, pb = m / 8;
  for (size_t k = 0; k < n; ++k) {
    const uint8_t* planes = planes_in + k * code_stride;
    float* o = out + k * out_stride;
    const float a = internal::LoadNorm(norm_in + k * code_stride, plan.norm_dtype) * plan.dec_scale;
    const __m512 av = _mm512_set1_ps(a);
    // Scaling the centroids first gives each lane the same product c[idx] * a.
    const __m512 s0 = _mm512_mul_ps(c0, av);
    const __m512 s1 = kBits > 4 ? _mm512_mul_ps(c1, av) : s0;
    for (size_t j0 = 0; j0 < m; j0 += 16) {
      __m512i idx = _mm512_setzero_si512();
#pragma GCC unroll 5
      for (uint32_t p = 0; p < kBits; ++p) {
        const uint8_t* src = planes + p * pb + j0 / 8;
        uint16_t w = src[0];
        if constexpr (!kHalf) std::memcpy(&w, src, 2);
        const __mmask16 bits = _cvtu32_mask16(w);
        idx = _mm512_mask_add_epi32(idx, bits, idx, _mm512_set1_epi32(1 << p));
      }
      const __m512 v = kBits <= 4 ? _mm512_permutexvar_ps(idx, s0)
                                  : _mm512_permutex2var_ps(s0, idx, s1);
      if constexpr (kHalf) {
        _mm256_storeu_ps(o + j0, _mm512_castps512_ps256(v));
      } else {
        _mm512_storeu_ps(o + j0, v);
      }
    }
  }
}

// ---- transform_assemble ----

// r[k] lane i <- r[i] lane k.
[[gnu::always_inline]] inline void Transpose16x16(__m512* r) {
  __m512 t[16], s[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // s[4g + k], 128-bit lane L: column 4L + k of rows 4g..4g+3.
#pragma GCC unroll 4
  for (int g = 0; g < 16; g += 4) {
    s[g] = _mm512_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // lo[h][k]: columns k, 4 + k of rows 8h..8h+7 (lanes: rows 8h.., the next column, rows 8h+4..);
  // hi[h][k]: columns 8 + k, 12 + k.
  __m512 lo[2][4], hi[2][4];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      lo[h][k] = _mm512_shuffle_f32x4(s[8 * h + k], s[8 * h + 4 + k], _MM_SHUFFLE(1, 0, 1, 0));
      hi[h][k] = _mm512_shuffle_f32x4(s[8 * h + k], s[8 * h + 4 + k], _MM_SHUFFLE(3, 2, 3, 2));
    }
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm512_shuffle_f32x4(lo[0][k], lo[1][k], _MM_SHUFFLE(2, 0, 2, 0));
    r[4 + k] = _mm512_shuffle_f32x4(lo[0][k], lo[1][k], _MM_SHUFFLE(3, 1, 3, 1));
    r[8 + k] = _mm512_shuffle_f32x4(hi[0][k], hi[1][k], _MM_SHUFFLE(2, 0, 2, 0));
    r[12 + k] = _mm512_shuffle_f32x4(hi[0][k], hi[1][k], _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// Row positions in use (every block's and every from[c]), rounded up to whole registers; 0 when
// more than kMaxCols.
size_t UsedColumns(const uint32_t* from, size_t d, const TransformBlock* blocks, size_t nblocks,
                   size_t* used_out) {
  const size_t used = internal::RowPositionsUsed(from, d, blocks, nblocks);
  *used_out = used;
  const size_t cols = (used + 15) / 16 * 16;
  return cols <= kMaxCols ? cols : 0;
}

// Rows 0..cnt-1 (cnt <= 16) into columns; positions past `used` and rows past cnt read as 0
// (masked loads: nothing past a row's used positions or the last row is touched).
void ColumnsIn(const float* r, size_t row_stride, size_t used, size_t cols, size_t cnt,
               Columns& tr) {
  for (size_t q = 0; q < cols; q += 16) {
    const __mmask16 k = LowMask16(used - q);
    __m512 v[16];
    if (cnt == 16) {
#pragma GCC unroll 16
      for (size_t i = 0; i < 16; ++i) v[i] = _mm512_maskz_loadu_ps(k, r + i * row_stride + q);
    } else {
      for (size_t i = 0; i < 16; ++i) {
        v[i] = i < cnt ? _mm512_maskz_loadu_ps(k, r + i * row_stride + q) : _mm512_setzero_ps();
      }
    }
    Transpose16x16(v);
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) _mm512_store_ps(tr[q + j], v[j]);
  }
}

// Channels c0..c0+len-1 (len <= 16) of 16 vectors, transposed: x[i] lane k = a[c] * norms[i] +
// b[c] * tr[from[c]][i] for c = c0 + k (0 past len). Products rounded, then the sum, as ref.cc.
template <bool kFull>
[[gnu::always_inline]] inline void Affine16(const Columns& tr, const uint32_t* from,
                                            const float* a, const float* b, __m512 nv, size_t len,
                                            __m512* x) {
#pragma GCC unroll 16
  for (size_t k = 0; k < 16; ++k) {
    if (kFull || k < len) {
      const __m512 base = _mm512_mul_ps(_mm512_set1_ps(a[k]), nv);
      const __m512 step = _mm512_mul_ps(_mm512_set1_ps(b[k]), _mm512_load_ps(tr[from[k]]));
      x[k] = _mm512_add_ps(base, step);
    } else {
      x[k] = _mm512_setzero_ps();
    }
  }
  Transpose16x16(x);
}

// Channels c..c+15 of one vector (lanes under km) as from_f32 writes them to dst (element c).
template <DType kT>
[[gnu::always_inline]] inline void StoreAs(__m512 v, __mmask16 km, uint8_t* dst, size_t c) {
  if constexpr (kT == DType::kF32) {
    _mm512_mask_storeu_ps(reinterpret_cast<float*>(dst) + c, km, v);
  } else {
    const __m256i h =
        kT == DType::kF16 ? _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : FloatToBF16x16(v);
    _mm256_mask_storeu_epi16(reinterpret_cast<uint16_t*>(dst) + c, km, h);
  }
}

// out[i][c] for vectors i < cnt and channels c < d, then (mean not null) + scale[i] * mean[c]
// (the product rounded, as add_scaled), as kT: vector i at o + i * pitch bytes.
template <DType kT>
void AffineOut(const Columns& tr, const uint32_t* from, const float* a, const float* b,
               const float* norms, size_t cnt, size_t d, const float* mean, const float* scale,
               uint8_t* o, size_t pitch) {
  const __m512 nv = _mm512_maskz_loadu_ps(LowMask16(cnt), norms);
  __m512 x[16];
  for (size_t c0 = 0; c0 < d; c0 += 16) {
    const size_t len = std::min<size_t>(16, d - c0);
    const __mmask16 km = LowMask16(len);
    if (len == 16) {
      Affine16<true>(tr, from + c0, a + c0, b + c0, nv, 16, x);
    } else {
      Affine16<false>(tr, from + c0, a + c0, b + c0, nv, len, x);
    }
    if (mean != nullptr) {
      const __m512 mv = _mm512_maskz_loadu_ps(km, mean + c0);
      for (size_t i = 0; i < cnt; ++i) {
        x[i] = _mm512_add_ps(x[i], _mm512_mul_ps(_mm512_set1_ps(scale[i]), mv));
      }
    }
    if (cnt == 16 && len == 16) {
#pragma GCC unroll 16
      for (size_t i = 0; i < 16; ++i) StoreAs<kT>(x[i], km, o + i * pitch, c0);
    } else {
      for (size_t i = 0; i < cnt; ++i) StoreAs<kT>(x[i], km, o + i * pitch, c0);
    }
  }
}

// ---- transform_decode: the indices straight from 16 codes into columns ----

// Bytes 0..code_bytes-1 of codes 0..cnt-1 (the rest 0), transposed by dwords.
void TransposeWords(const uint8_t* code, size_t code_stride, size_t code_bytes, size_t cnt,
                    Words& w) {
  for (size_t q = 0; 64 * q < code_bytes; ++q) {
    const size_t len = std::min<size_t>(64, code_bytes - 64 * q);
    const __mmask64 k = _cvtu64_mask64(len == 64 ? ~uint64_t{0} : (uint64_t{1} << len) - 1);
    __m512 v[16];
    for (size_t i = 0; i < 16; ++i) {
      const uint8_t* src = code + i * code_stride + 64 * q;
      v[i] = i < cnt ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi8(k, src)) : _mm512_setzero_ps();
    }
    Transpose16x16(v);
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) _mm512_store_ps(reinterpret_cast<float*>(w[16 * q + j]), v[j]);
  }
}

// Block columns t[j] = centroid[idx_j] * (norm * dec_scale), lanes the 16 codes (nv their norms):
// dequantize's product. Bit j % 8 of byte j / 8 of plane p, shifted to bit p, OR'ed into idx.
template <int kBits>
void DequantizeColumnsBits(const SubsetPlan& plan, size_t planes_offset, const Words& w,
                           __m512 nv, float (*t)[16]) {
  const __m512 av = _mm512_mul_ps(nv, _mm512_set1_ps(plan.dec_scale));
  alignas(64) float cent[32] = {};
  for (uint32_t k = 0; k < (1u << kBits) && k < 32; ++k) cent[k] = plan.centroids[k];
  const __m512 c0 = _mm512_load_ps(cent), c1 = _mm512_load_ps(cent + 16);
  const size_t pb = plan.dim / 8;
  for (size_t byte = 0; byte < pb; ++byte) {
    __m512i src[kBits];
#pragma GCC unroll 8
    for (int p = 0; p < kBits; ++p) {  // the byte at bits 0..7 of each lane
      const size_t at = planes_offset + p * pb + byte;
      src[p] = _mm512_srl_epi32(_mm512_load_si512(w[at / 4]), _mm_cvtsi32_si128(8 * (at % 4)));
    }
    Unroll<8>([&](auto tc) {
      constexpr int kT = decltype(tc)::value;
      __m512i idx = _mm512_and_si512(_mm512_srli_epi32(src[0], kT), _mm512_set1_epi32(1));
      Unroll<kBits - 1>([&](auto pc) {
        constexpr int kP = decltype(pc)::value + 1;
        const __m512i bit = kT >= kP ? _mm512_srli_epi32(src[kP], kT >= kP ? kT - kP : 0)
                                     : _mm512_slli_epi32(src[kP], kT < kP ? kP - kT : 0);
        idx = _mm512_ternarylogic_epi32(idx, bit, _mm512_set1_epi32(1 << kP), 0xF8);  // a | b & c
      });
      __m512 c;
      if constexpr (kBits <= 4) {
        c = _mm512_permutexvar_ps(idx, c0);
      } else if constexpr (kBits == 5) {
        c = _mm512_permutex2var_ps(c0, idx, c1);
      } else {
        c = _mm512_i32gather_ps(idx, plan.centroids, 4);
      }
      _mm512_store_ps(t[8 * byte + kT], _mm512_mul_ps(c, av));
    });
  }
}

struct Transform {
  using L = ::tqkv::kernels::L;
  static void WordsIn(const uint8_t* code, size_t code_stride, size_t code_bytes, size_t cnt,
                      Words& w) {
    TransposeWords(code, code_stride, code_bytes, cnt, w);
  }
  template <int kBits>
  static void DequantizeColumns(const SubsetPlan& plan, size_t planes_offset, const Words& w,
                                __m512 nv, float (*t)[16]) {
    DequantizeColumnsBits<kBits>(plan, planes_offset, w, nv, t);
  }
  template <DType kT>
  static void AffineOut(const Columns& tr, const uint32_t* from, const float* a, const float* b,
                        const float* norms, size_t cnt, size_t d, const float* mean,
                        const float* scale, uint8_t* o, size_t pitch) {
    ::tqkv::kernels::AffineOut<kT>(tr, from, a, b, norms, cnt, d, mean, scale, o, pitch);
  }
};

}  // namespace

namespace internal {

void Avx512Dequantize(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
                      size_t code_stride, size_t n, float* out, size_t out_stride) {
  if (plan.dim == 0 || (plan.dim % 16 != 0 && plan.dim != 8) || plan.bits < 1 ||
      plan.bits > kMaxBits) {
    return Avx2Table().dequantize(plan, norm_in, planes_in, code_stride, n, out, out_stride);
  }
  using Fn =
      void (*)(const SubsetPlan&, const uint8_t*, const uint8_t*, size_t, size_t, float*, size_t);
  static constexpr Fn kByBits[2][kMaxBits] = {
      {DequantizeBits<1, false>, DequantizeBits<2, false>, DequantizeBits<3, false>,
       DequantizeBits<4, false>, DequantizeBits<5, false>},
      {DequantizeBits<1, true>, DequantizeBits<2, true>, DequantizeBits<3, true>,
       DequantizeBits<4, true>, DequantizeBits<5, true>}};
  kByBits[plan.dim == 8][plan.bits - 1](plan, norm_in, planes_in, code_stride, n, out, out_stride);
}

void Avx512TransformAssemble(float* row, size_t row_stride, const TransformBlock* blocks,
                             size_t nblocks, const uint32_t* from, const float* a, const float* b,
                             const float* norms, size_t n, size_t d, float* out,
                             size_t out_stride) {
  size_t used = 0;
  const size_t cols = UsedColumns(from, d, blocks, nblocks, &used);
  if (cols == 0) {
    return Avx2TransformAssemble(row, row_stride, blocks, nblocks, from, a, b, norms, n, d, out,
                                 out_stride);
  }
  alignas(64) Columns tr;
  for (size_t i0 = 0; i0 < n; i0 += 16) {
    const size_t cnt = std::min<size_t>(16, n - i0);
    ColumnsIn(row + i0 * row_stride, row_stride, used, cols, cnt, tr);
    for (size_t k = 0; k < nblocks; ++k) simd::RotateColumns<L>(blocks[k], tr);
    AffineOut<DType::kF32>(tr, from, a, b, norms + i0, cnt, d, nullptr, nullptr,
                           reinterpret_cast<uint8_t*>(out + i0 * out_stride), 4 * out_stride);
  }
}

bool Avx512TransformDecode(const uint8_t* code, size_t code_stride,
                           const TransformCodeBlock* code_blocks, const TransformBlock* blocks,
                           size_t nblocks, const uint32_t* from, const float* a, const float* b,
                           const float* norms, size_t n, size_t d, const float* mean,
                           const float* scale, void* out, DType dtype, size_t out_stride) {
  return simd::TransformDecode<Transform>(code, code_stride, code_blocks, blocks, nblocks, from, a,
                                          b, norms, n, d, mean, scale, out, dtype, out_stride);
}

}  // namespace internal

}  // namespace tqkv::kernels
