// Private to the kernel layer: the pieces dispatch.cc and the SIMD files share.
#ifndef TQKV_SRC_CODEC_KERNELS_INTERNAL_H_
#define TQKV_SRC_CODEC_KERNELS_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "codec/kernels/kernels.h"
#include "tqkv/types.h"
#if defined(TQKV_KERNELS_F16C)
#include <immintrin.h>
#endif

namespace tqkv::kernels::internal {

// Defined in avx2_kernels_avx2.cc (x86-64 builds only); only call when the CPU has AVX2, FMA and
// F16C.
const KernelTable& Avx2Table();
// Defined in avx512_kernels_avx512.cc (x86-64 builds only); only call when
// SimdLevelSupported(SimdLevel::kAvx512).
const KernelTable& Avx512Table();
// The same kernels built with the FWHT's h = 8 stage as an fma (avx512_fma8_kernels_avx512.cc).
const KernelTable& Avx512FmaStage8Table();
// Defined in neon_kernels_neon.cc (AArch64 builds only, where NEON is always present).
const KernelTable& NeonTable();
// The AVX2 table's gather_affine, transform_assemble and transform_decode
// (avx2_transform_avx2.cc).
void Avx2GatherAffine(const float* row, size_t row_stride, const uint32_t* from, const float* a,
                      const float* b, const float* norms, size_t n, size_t d, float* out,
                      size_t out_stride);
void Avx2TransformAssemble(float* row, size_t row_stride, const TransformBlock* blocks,
                           size_t nblocks, const uint32_t* from, const float* a, const float* b,
                           const float* norms, size_t n, size_t d, float* out, size_t out_stride);
bool Avx2TransformDecode(const uint8_t* code, size_t code_stride,
                         const TransformCodeBlock* code_blocks, const TransformBlock* blocks,
                         size_t nblocks, const uint32_t* from, const float* a, const float* b,
                         const float* norms, size_t n, size_t d, const float* mean,
                         const float* scale, void* out, DType dtype, size_t out_stride);
// Both AVX-512 tables' dequantize, transform_assemble and transform_decode
// (avx512_transform_avx512.cc, built once).
void Avx512Dequantize(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
                      size_t code_stride, size_t n, float* out, size_t out_stride);
void Avx512TransformAssemble(float* row, size_t row_stride, const TransformBlock* blocks,
                             size_t nblocks, const uint32_t* from, const float* a, const float* b,
                             const float* norms, size_t n, size_t d, float* out,
                             size_t out_stride);
bool Avx512TransformDecode(const uint8_t* code, size_t code_stride,
                           const TransformCodeBlock* code_blocks, const TransformBlock* blocks,
                           size_t nblocks, const uint32_t* from, const float* a, const float* b,
                           const float* norms, size_t n, size_t d, const float* mean,
                           const float* scale, void* out, DType dtype, size_t out_stride);

// A vector's stored norm (f32, or f16 rounded to nearest even), as every table writes and reads
// it. `static`: each SIMD file gets its own copy, compiled for its instruction set, which the
// linker never merges with another file's. The x86 SIMD files (built with -mf16c) define
// TQKV_KERNELS_F16C and convert in hardware, the same bits as types.h's conversions, which the
// reference and the other files use.
static inline void StoreNorm(float norm, DType dtype, uint8_t* out) {
  if (dtype == DType::kF16) {
#if defined(TQKV_KERNELS_F16C)
    const uint16_t h = static_cast<uint16_t>(
        _mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(norm), _MM_FROUND_TO_NEAREST_INT), 0));
#else
    const uint16_t h = FloatToHalf(norm);
#endif
    std::memcpy(out, &h, 2);
  } else {
    std::memcpy(out, &norm, 4);
  }
}

static inline float LoadNorm(const uint8_t* in, DType dtype) {
  if (dtype == DType::kF16) {
    uint16_t h;
    std::memcpy(&h, in, 2);
#if defined(TQKV_KERNELS_F16C)
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
#else
    return HalfToFloat(h);
#endif
  }
  float f;
  std::memcpy(&f, in, 4);
  return f;
}

// Calls f(std::integral_constant<int, i>) for i = 0..N-1: register indices and shift counts as
// constants (lane extracts and immediate shifts take them), every step inlined. `static` as above.
template <typename F, int... I>
[[gnu::always_inline]] static inline void UnrollImpl(F& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F>
[[gnu::always_inline]] static inline void Unroll(F&& f) {
  UnrollImpl(f, std::make_integer_sequence<int, N>{});
}

// The transform assembly's row positions in use: past every from[c] and every block. `static` as
// above.
static inline size_t RowPositionsUsed(const uint32_t* from, size_t d, const TransformBlock* blocks,
                                      size_t nblocks) {
  size_t used = 0;
  for (size_t c = 0; c < d; ++c) used = std::max<size_t>(used, from[c] + size_t{1});
  for (size_t k = 0; k < nblocks; ++k) used = std::max(used, blocks[k].offset + blocks[k].dim);
  return used;
}

// transform_decode's blocks (the AVX2 and AVX-512 ones): *code_bytes = the code bytes their
// planes reach. False when a block's plan does not match it (dim) or is not whole bytes of
// 1..8-bit planes. `static` as above.
static inline bool TransformDecodeBlocks(const TransformCodeBlock* code_blocks,
                                         const TransformBlock* blocks, size_t nblocks,
                                         size_t* code_bytes) {
  size_t bytes = 0;
  bool ok = true;
  for (size_t k = 0; k < nblocks; ++k) {
    const SubsetPlan& p = *code_blocks[k].plan;
    ok = ok && p.dim == blocks[k].dim && p.dim % 8 == 0 && p.bits >= 1 && p.bits <= 8;
    bytes = std::max(bytes, code_blocks[k].planes_offset + size_t{p.bits} * p.dim / 8);
  }
  *code_bytes = bytes;
  return ok;
}

// split_gather's walk (kernels.h): for every vector, step(8 floats at xv + 8k, mask byte k, its
// subset 0 floats, its subset 1 floats) for the whole mask bytes k < `whole` (at most d / 8), the
// outputs then advanced by the byte's set and clear bits, and the channels past them one by one.
// `static` as above (a table's steps are its own instructions).
template <class Step>
static inline void SplitGatherWalk(const float* x, size_t x_stride, size_t n, const uint8_t* mask,
                                   size_t d, size_t whole, float* out0, size_t m0, float* out1,
                                   size_t m1, Step&& step) {
  for (size_t i = 0; i < n; ++i) {
    const float* xv = x + i * x_stride;
    float* o0 = out0 + i * m0;
    float* o1 = out1 + i * m1;
    for (size_t k = 0; k < whole; ++k) {
      const uint8_t mb = mask[k];
      step(xv + 8 * k, mb, o0, o1);
      const int cnt = __builtin_popcount(mb);
      o0 += cnt;
      o1 += 8 - cnt;
    }
    for (size_t c = 8 * whole; c < d; ++c) {
      if ((mask[c / 8] >> (c % 8)) & 1u) {
        *o0++ = xv[c];
      } else {
        *o1++ = xv[c];
      }
    }
  }
}

// split_scatter's walk, the inverse: step(8 floats to write at xv + 8k, mask byte k, subset 0
// floats, subset 1 floats).
template <class Step>
static inline void SplitScatterWalk(const float* in0, size_t m0, const float* in1, size_t m1,
                                    size_t n, const uint8_t* mask, size_t d, size_t whole,
                                    float* x, size_t x_stride, Step&& step) {
  for (size_t i = 0; i < n; ++i) {
    float* xv = x + i * x_stride;
    const float* i0 = in0 + i * m0;
    const float* i1 = in1 + i * m1;
    for (size_t k = 0; k < whole; ++k) {
      const uint8_t mb = mask[k];
      step(xv + 8 * k, mb, i0, i1);
      const int cnt = __builtin_popcount(mb);
      i0 += cnt;
      i1 += 8 - cnt;
    }
    for (size_t c = 8 * whole; c < d; ++c) xv[c] = ((mask[c / 8] >> (c % 8)) & 1u) ? *i0++ : *i1++;
  }
}

// Split movement by mask byte, for the 256 bytes: the lanes whose bit is set, ascending (then
// padding), those whose bit is clear, each lane's rank among its kind, and 0xFF where its bit is
// set; every lane as kW bytes (kW = 1: lane numbers; 4: the byte numbers of a float, for byte
// shuffles).
template <int kW>
struct SplitLut {
  uint8_t set[256][8 * kW];
  uint8_t unset[256][8 * kW];
  uint8_t rank[256][8 * kW];
  uint8_t sel[256][8 * kW];
};

template <int kW>
static const SplitLut<kW>& SplitLutOf() {
  static const SplitLut<kW> lut = [] {
    SplitLut<kW> t{};
    for (int mb = 0; mb < 256; ++mb) {
      int a = 0, b = 0;
      for (int l = 0; l < 8; ++l) {
        const bool set = (mb >> l) & 1;
        const int rank = set ? a++ : b++;
        uint8_t* dst = set ? t.set[mb] : t.unset[mb];
        for (int k = 0; k < kW; ++k) {
          dst[kW * rank + k] = static_cast<uint8_t>(kW * l + k);
          t.rank[mb][kW * l + k] = static_cast<uint8_t>(kW * rank + k);
          t.sel[mb][kW * l + k] = set ? 0xFF : 0x00;
        }
      }
    }
    return t;
  }();
  return lut;
}

}  // namespace tqkv::kernels::internal

#endif  // TQKV_SRC_CODEC_KERNELS_INTERNAL_H_
