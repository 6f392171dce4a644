// AVX2 kernels of the transform codec's assembly (docs/codec.md §11): gather_affine and
// transform_assemble of the AVX2 table, eight vectors at a time as the lanes of transposed
// columns. Bit-identical to ref.cc, as every table.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "codec/kernels/internal.h"
#include "codec/kernels/kernels.h"

namespace tqkv::kernels {
namespace {

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
constexpr size_t kMaxCols = 256;
using Columns = float[kMaxCols][8];  // [p]: row position p of 8 vectors

// Row positions in use, rounded up to whole registers; 0 when the fast path cannot take them.
size_t UsedColumns(size_t row_stride, const uint32_t* from, size_t d, const TransformBlock* blocks,
                   size_t nblocks) {
  size_t used = 0;
  for (size_t c = 0; c < d; ++c) used = std::max<size_t>(used, from[c] + size_t{1});
  for (size_t k = 0; k < nblocks; ++k) used = std::max(used, blocks[k].offset + blocks[k].dim);
  const size_t cols = (used + 7) / 8 * 8;
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

// out[i][c] = a[c] * norms[i] + b[c] * tr[from[c]][i] for the 8 vectors.
void AffineOut(const Columns& tr, const uint32_t* from, const float* a, const float* b,
               const float* norms, size_t d, float* o, size_t out_stride) {
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
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(o + i * out_stride + c0, x[i]);
  }
  for (size_t c = c0; c < d; ++c) {  // the tail, as the reference computes it
    for (size_t i = 0; i < 8; ++i) {
      const float base = a[c] * norms[i];
      const float step = b[c] * tr[from[c]][i];
      o[i * out_stride + c] = base + step;
    }
  }
}

// RotateColumns for a block of kM <= 32 positions, held in registers (spilled as the compiler sees fit).
template <uint32_t kM>
void RotateColumnsInRegisters(const TransformBlock& blk, Columns& tr) {
  float(*t)[8] = tr + blk.offset;
  __m256 v[kM];
#pragma GCC unroll 32
  for (uint32_t j = 0; j < kM; ++j) v[j] = _mm256_load_ps(t[j]);
#pragma GCC unroll 8
  for (uint32_t h = 1; h < kM; h <<= 1) {
#pragma GCC unroll 32
    for (uint32_t j = 0; j < kM; ++j) {
      if (j & h) continue;
      const __m256 x = v[j], y = v[j + h];
      v[j] = _mm256_add_ps(x, y);
      v[j + h] = _mm256_sub_ps(x, y);
    }
  }
#pragma GCC unroll 32
  for (uint32_t j = 0; j < kM; ++j) {
    _mm256_store_ps(t[j], _mm256_mul_ps(v[j], _mm256_broadcast_ss(blk.signs + j)));
  }
}

// Fwht(v) * signs of one block, each lane a vector: the reference's stages and pairs.
void RotateColumns(const TransformBlock& blk, Columns& tr) {
  if (blk.dim == 8) return RotateColumnsInRegisters<8>(blk, tr);
  if (blk.dim == 16) return RotateColumnsInRegisters<16>(blk, tr);
  if (blk.dim == 32) return RotateColumnsInRegisters<32>(blk, tr);
  float(*t)[8] = tr + blk.offset;
  const uint32_t m = blk.dim;
  for (uint32_t h = 1; h < m; h <<= 1) {
    for (uint32_t i = 0; i < m; i += 2 * h) {
      for (uint32_t j = i; j < i + h; ++j) {
        const __m256 x = _mm256_load_ps(t[j]), y = _mm256_load_ps(t[j + h]);
        _mm256_store_ps(t[j], _mm256_add_ps(x, y));
        _mm256_store_ps(t[j + h], _mm256_sub_ps(x, y));
      }
    }
  }
  for (uint32_t j = 0; j < m; ++j) {
    _mm256_store_ps(t[j], _mm256_mul_ps(_mm256_load_ps(t[j]), _mm256_broadcast_ss(blk.signs + j)));
  }
}

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
      AffineOut(tr, from, a, b, norms + i0, d, out + i0 * out_stride, out_stride);
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
      for (size_t k = 0; k < nblocks; ++k) RotateColumns(blocks[k], tr);
      AffineOut(tr, from, a, b, norms + i0, d, out + i0 * out_stride, out_stride);
    }
  }
  if (i0 < n) {
    ref::TransformAssemble(row + i0 * row_stride, row_stride, blocks, nblocks, from, a, b,
                           norms + i0, n - i0, d, out + i0 * out_stride, out_stride);
  }
}

}  // namespace internal

}  // namespace tqkv::kernels
