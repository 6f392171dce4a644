// AVX2 kernels of the transform codec (docs/codec.md §11): gather_affine, transform_assemble and
// transform_decode of the AVX2 table, eight vectors at a time as the lanes of transposed
// columns. Bit-identical to ref.cc, as every table.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "codec/kernels/avx2_common.h"
#include "codec/kernels/internal.h"
#include "codec/kernels/kernels.h"
#include "codec/kernels/simd_transform.h"

namespace tqkv::kernels {
namespace {

using L = avx2::Lanes;
using internal::Unroll;
using simd::kMaxCols;
using Columns = simd::Columns<L>;
using Words = simd::Words<L>;

// r[k] lane i <- r[i] lane k.
inline void Transpose8x8(__m256* r) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// One vector the plain way: scalar loads into a buffer, then whole registers.
void GatherAffineOne(const float* r, const uint32_t* from, const float* a, const float* b,
                     float norm, size_t d, float* o) {
  constexpr size_t kChunk = 64;
  alignas(32) float t[kChunk];
  const __m256 nv = _mm256_set1_ps(norm);
  size_t c0 = 0;
  for (; c0 + 8 <= d; c0 += kChunk) {
    const size_t len = std::min(kChunk, (d - c0) & ~size_t{7});
    for (size_t c = 0; c < len; ++c) t[c] = r[from[c0 + c]];
    for (size_t c = 0; c < len; c += 8) {
      const __m256 base = _mm256_mul_ps(_mm256_loadu_ps(a + c0 + c), nv);
      const __m256 step = _mm256_mul_ps(_mm256_loadu_ps(b + c0 + c), _mm256_load_ps(t + c));
      _mm256_storeu_ps(o + c0 + c, _mm256_add_ps(base, step));
    }
    if (len < kChunk) {
      c0 += len;
      break;
    }
  }
  if (c0 < d) {  // the tail, as the reference computes it
    ref::GatherAffine(r, 0, from + c0, a + c0, b + c0, &norm, 1, d - c0, o + c0, 0);
  }
}

// The transform codec's assembly (gather_affine, transform_assemble): eight vectors at a time are
// transposed so that a row position is one register (lane i: vector i); a block's Hadamard
// rotation is then adds and subtracts of whole registers, the permutation the choice of register,
// and the results transpose back. On Zen 3 this beat vpgatherdd, scalar loads and one rotation
// call per block and vector (docs/lab/kl.md). Rows whose positions in use do not fill whole
// registers within row_stride, and the last n % 8 vectors, go one vector at a time.
// Row positions in use, rounded up to whole registers; 0 when the fast path cannot take them.
size_t UsedColumns(size_t row_stride, const uint32_t* from, size_t d, const TransformBlock* blocks,
                   size_t nblocks) {
  const size_t cols = (internal::RowPositionsUsed(from, d, blocks, nblocks) + 7) / 8 * 8;
  return cols <= row_stride && cols <= kMaxCols ? cols : 0;
}

void ColumnsIn(const float* r, size_t row_stride, size_t cols, Columns& tr) {
  for (size_t q = 0; q < cols; q += 8) {
    __m256 v[8];
    for (int i = 0; i < 8; ++i) v[i] = _mm256_loadu_ps(r + i * row_stride + q);
    Transpose8x8(v);
    for (int k = 0; k < 8; ++k) _mm256_store_ps(tr[q + k], v[k]);
  }
}

// ---- transform_decode: the indices straight from 8 codes into columns (avx512_transform's
// design at eight lanes) ----


// Bytes 0..code_bytes-1 of codes 0..cnt-1 (the rest 0), transposed by dwords.
void TransposeWords(const uint8_t* code, size_t code_stride, size_t code_bytes, size_t cnt,
                    Words& w) {
  for (size_t q = 0; 32 * q < code_bytes; ++q) {
    const size_t len = std::min<size_t>(32, code_bytes - 32 * q);
    __m256 v[8];
    for (size_t i = 0; i < 8; ++i) {
      const uint8_t* src = code + i * code_stride + 32 * q;
      if (i < cnt && len == 32) {
        v[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(src));
      } else {  // nothing read past the code's last byte
        alignas(32) uint8_t tail[32] = {};
        if (i < cnt) std::memcpy(tail, src, len);
        v[i] = _mm256_load_ps(reinterpret_cast<const float*>(tail));
      }
    }
    Transpose8x8(v);
    for (int j = 0; j < 8; ++j) _mm256_store_ps(reinterpret_cast<float*>(w[8 * q + j]), v[j]);
  }
}

// Block columns t[j] = centroid[idx_j] * (norm * dec_scale), lanes the 8 codes (nv their norms):
// dequantize's product. Bit j % 8 of byte j / 8 of plane p, shifted to bit p, OR'ed into idx.
template <int kBits>
void DequantizeColumnsBits(const SubsetPlan& plan, size_t planes_offset, const Words& w,
                           __m256 nv, float (*t)[8]) {
  const __m256 av = _mm256_mul_ps(nv, _mm256_set1_ps(plan.dec_scale));
  alignas(32) float cent[16] = {};
  for (uint32_t k = 0; k < (1u << kBits) && k < 16; ++k) cent[k] = plan.centroids[k];
  const __m256 c0 = _mm256_load_ps(cent), c1 = _mm256_load_ps(cent + 8);
  const size_t pb = plan.dim / 8;
  for (size_t byte = 0; byte < pb; ++byte) {
    __m256i src[kBits];
#pragma GCC unroll 8
    for (int p = 0; p < kBits; ++p) {  // the byte at bits 0..7 of each lane
      const size_t at = planes_offset + p * pb + byte;
      src[p] = _mm256_srl_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(w[at / 4])),
                                _mm_cvtsi32_si128(static_cast<int>(8 * (at % 4))));
    }
    Unroll<8>([&](auto tc) {
      constexpr int kT = decltype(tc)::value;
      __m256i idx = _mm256_and_si256(_mm256_srli_epi32(src[0], kT), _mm256_set1_epi32(1));
      Unroll<kBits - 1>([&](auto pc) {
        constexpr int kP = decltype(pc)::value + 1;
        const __m256i bit = kT >= kP ? _mm256_srli_epi32(src[kP], kT >= kP ? kT - kP : 0)
                                     : _mm256_slli_epi32(src[kP], kT < kP ? kP - kT : 0);
        idx = _mm256_or_si256(idx, _mm256_and_si256(bit, _mm256_set1_epi32(1 << kP)));
      });
      __m256 c;
      if constexpr (kBits <= 3) {
        c = _mm256_permutevar8x32_ps(c0, idx);
      } else if constexpr (kBits == 4) {  // bit 3 (moved to the sign) picks the upper eight
        c = _mm256_blendv_ps(_mm256_permutevar8x32_ps(c0, idx), _mm256_permutevar8x32_ps(c1, idx),
                             _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
      } else {
        c = _mm256_i32gather_ps(plan.centroids, idx, 4);
      }
      _mm256_store_ps(t[8 * byte + kT], _mm256_mul_ps(c, av));
    });
  }
}

// Eight channels of one vector as kT to dst (element c).
template <DType kT>
[[gnu::always_inline]] inline void Store8As(__m256 v, uint8_t* dst, size_t c) {
  if constexpr (kT == DType::kF32) {
    _mm256_storeu_ps(reinterpret_cast<float*>(dst) + c, v);
  } else {
    const __m128i h =
        kT == DType::kF16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : avx2::FloatToBF16x8(v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(reinterpret_cast<uint16_t*>(dst) + c), h);
  }
}

// out[i][c] = a[c] * norms[i] + b[c] * tr[from[c]][i], then (mean not null) + scale[i] * mean[c]
// (the product rounded, as add_scaled), as kT for vectors i < cnt: vector i at o + i * pitch
// bytes.
template <DType kT>
void AffineOutAs(const Columns& tr, const uint32_t* from, const float* a, const float* b,
                 const float* norms, size_t cnt, size_t d, const float* mean, const float* scale,
                 uint8_t* o, size_t pitch) {
  const __m256 nv = _mm256_loadu_ps(norms);
  size_t c0 = 0;
  for (; c0 + 8 <= d; c0 += 8) {
    __m256 x[8];
    for (int k = 0; k < 8; ++k) {
      const __m256 base = _mm256_mul_ps(_mm256_broadcast_ss(a + c0 + k), nv);
      const __m256 step =
          _mm256_mul_ps(_mm256_broadcast_ss(b + c0 + k), _mm256_load_ps(tr[from[c0 + k]]));
      x[k] = _mm256_add_ps(base, step);
    }
    Transpose8x8(x);
    if (mean != nullptr) {
      const __m256 mv = _mm256_loadu_ps(mean + c0);
      for (size_t i = 0; i < cnt; ++i) {
        x[i] = _mm256_add_ps(x[i], _mm256_mul_ps(_mm256_set1_ps(scale[i]), mv));
      }
    }
    for (size_t i = 0; i < cnt; ++i) Store8As<kT>(x[i], o + i * pitch, c0);
  }
  for (size_t c = c0; c < d; ++c) {  // the tail, as the reference and from_f32 compute it
    for (size_t i = 0; i < cnt; ++i) {
      const float base = a[c] * norms[i];
      const float step = b[c] * tr[from[c]][i];
      float x = base + step;
      if (mean != nullptr) x = x + scale[i] * mean[c];
      uint8_t* dst = o + i * pitch;
      if constexpr (kT == DType::kF32) {
        std::memcpy(dst + 4 * c, &x, 4);
      } else {
        const uint16_t h = kT == DType::kF16 ? FloatToHalf(x) : FloatToBF16(x);
        std::memcpy(dst + 2 * c, &h, 2);
      }
    }
  }
}

struct Transform {
  using L = avx2::Lanes;
  static void WordsIn(const uint8_t* code, size_t code_stride, size_t code_bytes, size_t cnt,
                      Words& w) {
    TransposeWords(code, code_stride, code_bytes, cnt, w);
  }
  template <int kBits>
  static void DequantizeColumns(const SubsetPlan& plan, size_t planes_offset, const Words& w,
                                __m256 nv, float (*t)[8]) {
    DequantizeColumnsBits<kBits>(plan, planes_offset, w, nv, t);
  }
  template <DType kT>
  static void AffineOut(const Columns& tr, const uint32_t* from, const float* a, const float* b,
                        const float* norms, size_t cnt, size_t d, const float* mean,
                        const float* scale, uint8_t* o, size_t pitch) {
    AffineOutAs<kT>(tr, from, a, b, norms, cnt, d, mean, scale, o, pitch);
  }
};

}  // namespace

namespace internal {

void Avx2GatherAffine(const float* row, size_t row_stride, const uint32_t* from, const float* a,
                      const float* b, const float* norms, size_t n, size_t d, float* out,
                      size_t out_stride) {
  const size_t cols = UsedColumns(row_stride, from, d, nullptr, 0);
  size_t i0 = 0;
  if (cols > 0) {
    alignas(32) Columns tr;
    for (; i0 + 8 <= n; i0 += 8) {
      ColumnsIn(row + i0 * row_stride, row_stride, cols, tr);
      AffineOutAs<DType::kF32>(tr, from, a, b, norms + i0, 8, d, nullptr, nullptr,
                               reinterpret_cast<uint8_t*>(out + i0 * out_stride), 4 * out_stride);
    }
  }
  for (size_t i = i0; i < n; ++i) {
    GatherAffineOne(row + i * row_stride, from, a, b, norms[i], d, out + i * out_stride);
  }
}

void Avx2TransformAssemble(float* row, size_t row_stride, const TransformBlock* blocks,
                           size_t nblocks, const uint32_t* from, const float* a, const float* b,
                           const float* norms, size_t n, size_t d, float* out,
                           size_t out_stride) {
  const size_t cols = UsedColumns(row_stride, from, d, blocks, nblocks);
  size_t i0 = 0;
  if (cols > 0) {
    alignas(32) Columns tr;
    for (; i0 + 8 <= n; i0 += 8) {
      ColumnsIn(row + i0 * row_stride, row_stride, cols, tr);
      for (size_t k = 0; k < nblocks; ++k) simd::RotateColumns<L>(blocks[k], tr);
      AffineOutAs<DType::kF32>(tr, from, a, b, norms + i0, 8, d, nullptr, nullptr,
                               reinterpret_cast<uint8_t*>(out + i0 * out_stride), 4 * out_stride);
    }
  }
  if (i0 < n) {
    ref::TransformAssemble(row + i0 * row_stride, row_stride, blocks, nblocks, from, a, b,
                           norms + i0, n - i0, d, out + i0 * out_stride, out_stride);
  }
}

bool Avx2TransformDecode(const uint8_t* code, size_t code_stride,
                         const TransformCodeBlock* code_blocks, const TransformBlock* blocks,
                         size_t nblocks, const uint32_t* from, const float* a, const float* b,
                         const float* norms, size_t n, size_t d, const float* mean,
                         const float* scale, void* out, DType dtype, size_t out_stride) {
  return simd::TransformDecode<Transform>(code, code_stride, code_blocks, blocks, nblocks, from, a,
                                          b, norms, n, d, mean, scale, out, dtype, out_stride);
}

}  // namespace internal

}  // namespace tqkv::kernels
