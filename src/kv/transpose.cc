#include "kv/transpose.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tqkv {

void Transpose16Reference(const uint16_t* src, size_t src_stride, uint16_t* dst,
                          size_t dst_stride, size_t rows, size_t cols) {
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) dst[c * dst_stride + r] = src[r * src_stride + c];
  }
}

#if defined(__SSE2__)
namespace {

// One 8x8 tile: eight rows of eight elements in, eight columns out (three rounds of unpacks).
inline void Tile8x8(const uint16_t* src, size_t ss, uint16_t* dst, size_t ds) {
  __m128i r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * ss));
  const __m128i a0 = _mm_unpacklo_epi16(r[0], r[1]), a1 = _mm_unpackhi_epi16(r[0], r[1]);
  const __m128i a2 = _mm_unpacklo_epi16(r[2], r[3]), a3 = _mm_unpackhi_epi16(r[2], r[3]);
  const __m128i a4 = _mm_unpacklo_epi16(r[4], r[5]), a5 = _mm_unpackhi_epi16(r[4], r[5]);
  const __m128i a6 = _mm_unpacklo_epi16(r[6], r[7]), a7 = _mm_unpackhi_epi16(r[6], r[7]);
  const __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);
  const __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);
  const __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);
  const __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
  const __m128i out[8] = {_mm_unpacklo_epi64(b0, b4), _mm_unpackhi_epi64(b0, b4),
                          _mm_unpacklo_epi64(b1, b5), _mm_unpackhi_epi64(b1, b5),
                          _mm_unpacklo_epi64(b2, b6), _mm_unpackhi_epi64(b2, b6),
                          _mm_unpacklo_epi64(b3, b7), _mm_unpackhi_epi64(b3, b7)};
  for (int i = 0; i < 8; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i * ds), out[i]);
}

}  // namespace
#endif

void Transpose16(const uint16_t* src, size_t src_stride, uint16_t* dst, size_t dst_stride,
                 size_t rows, size_t cols) {
#if defined(__SSE2__)
  const size_t r8 = rows / 8 * 8, c8 = cols / 8 * 8;
  for (size_t r = 0; r < r8; r += 8) {
    for (size_t c = 0; c < c8; c += 8) {
      Tile8x8(src + r * src_stride + c, src_stride, dst + c * dst_stride + r, dst_stride);
    }
  }
  // The edges (rows or columns past the last whole tile) element by element.
  if (c8 < cols) Transpose16Reference(src + c8, src_stride, dst + c8 * dst_stride, dst_stride,
                                      r8, cols - c8);
  if (r8 < rows) Transpose16Reference(src + r8 * src_stride, src_stride, dst + r8, dst_stride,
                                      rows - r8, cols);
#else
  Transpose16Reference(src, src_stride, dst, dst_stride, rows, cols);
#endif
}

}  // namespace tqkv
