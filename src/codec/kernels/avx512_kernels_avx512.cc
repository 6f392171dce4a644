// AVX-512 (F, BW, VL, DQ) kernels. Every result is bit-identical to ref.cc: the operations and
// their order are the reference's (kernels.h), 16 lanes at a time. What pays here is fewer
// instructions, not wider arithmetic (Zen 4 runs 512-bit float ops as two 256-bit halves):
// quantization is a binary search whose compare masks are the bit planes themselves, centroid
// look-ups are one vpermps/vpermi2ps, bit planes unpack with one masked byte add per plane, and
// the split codecs gather and scatter channels with vcompressps/vexpandps.
// Shapes not handled here (Haar rotations, more than 5 bits, dims not a multiple of 16) go to the
// AVX2 table, which the CPU also runs. The file is built twice: as is (the `avx512` table) and
// with TQKV_AVX512_FMA_STAGE8 (avx512_fma8_kernels_avx512.cc, the `avx512-fma8` table), which
// differ only in one instruction choice of the FWHT; dispatch.cc picks one per CPU vendor.
#include <immintrin.h>
// gcc 12's AVX-512 intrinsics pass _mm512_undefined_*() as the unused merge operand, which its own
// -Wuninitialized flags once inlined; the operand is never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

// Built with -mf16c: the norm helpers of internal.h convert in hardware.
#define TQKV_KERNELS_F16C 1
#include "codec/kernels/avx512_common.h"
#include "codec/kernels/internal.h"
#include "codec/kernels/kernels.h"

namespace tqkv::kernels {
namespace {

const KernelTable& Avx2() { return internal::Avx2Table(); }

using avx512::FloatToBF16x16;
using avx512::LowMask16;
using internal::Unroll;

// ---- element conversions: 16 lanes, the tail under a mask ----

inline __m512 HalfToFloat16(__m256i h) { return _mm512_cvtph_ps(h); }
inline __m512 BF16ToFloat16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

void ToF32(const void* src, DType dtype, size_t n, float* dst) {
  if (dtype == DType::kF32) {
    std::memmove(dst, src, n * sizeof(float));
    return;
  }
  if (dtype != DType::kF16 && dtype != DType::kBF16) return Avx2().to_f32(src, dtype, n, dst);
  const auto* s = static_cast<const uint16_t*>(src);
  const bool f16 = dtype == DType::kF16;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    _mm512_storeu_ps(dst + i, f16 ? HalfToFloat16(h) : BF16ToFloat16(h));
  }
  if (i < n) {
    const __mmask16 k = LowMask16(n - i);
    const __m256i h = _mm256_maskz_loadu_epi16(k, s + i);
    _mm512_mask_storeu_ps(dst + i, k, f16 ? HalfToFloat16(h) : BF16ToFloat16(h));
  }
}

inline __m256i FloatTo16(__m512 v, bool f16) {
  return f16 ? _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : FloatToBF16x16(v);
}

void FromF32(const float* src, size_t n, DType dtype, void* dst) {
  if (dtype == DType::kF32) {
    std::memmove(dst, src, n * sizeof(float));
    return;
  }
  if (dtype != DType::kF16 && dtype != DType::kBF16) return Avx2().from_f32(src, n, dtype, dst);
  auto* d = static_cast<uint16_t*>(dst);
  const bool f16 = dtype == DType::kF16;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        FloatTo16(_mm512_loadu_ps(src + i), f16));
  }
  if (i < n) {
    const __mmask16 k = LowMask16(n - i);
    _mm256_mask_storeu_epi16(d + i, k, FloatTo16(_mm512_maskz_loadu_ps(k, src + i), f16));
  }
}

// ---- encode / decode ----
//
// Shapes handled here: dim a multiple of 16 up to kMaxDim, 1..5 bits, Hadamard kinds (dim a power
// of two) and Kronecker with blocks of 16 or more. Each vector goes through 64-byte aligned stack
// buffers, so everything stays in registers or L1.

constexpr size_t kMaxDim = 1024;
constexpr int kMaxBits = 5;

bool Vectorised(const SubsetPlan& p) {
  if (p.dim == 0 || p.dim % 16 != 0 || p.dim > kMaxDim || p.bits < 1 || p.bits > kMaxBits) {
    return false;
  }
  if (p.rotation == RotationKind::kKronecker) {
    return p.haar != nullptr && p.haar_t != nullptr && p.signs1 != nullptr && p.block >= 16 &&
           p.block % 16 == 0 && p.dim % p.block == 0;
  }
  if (p.rotation != RotationKind::kHadamard && p.rotation != RotationKind::kHadamard2) return false;
  return (p.dim & (p.dim - 1)) == 0;
}

// The reference's reduction tree ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
inline float ReduceSum8(__m256 acc) {
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}

// Adds the 16 squares of sq (elements 16r..16r+15) to Sum8's eight accumulators: the low half
// (elements 16r..16r+7) first, then the high half, so lane k still takes i % 8 == k in order of i.
inline __m256 AddSum8(__m256 acc, __m512 sq) {
  acc = _mm256_add_ps(acc, _mm512_castps512_ps256(sq));
  return _mm256_add_ps(acc, _mm512_extractf32x8_ps(sq, 1));
}

inline float Sum8Squares(const float* v, size_t m) {
  __m256 acc = _mm256_setzero_ps();
  for (size_t i = 0; i < m; i += 16) {
    const __m512 x = _mm512_loadu_ps(v + i);
    acc = AddSum8(acc, _mm512_mul_ps(x, x));
  }
  return ReduceSum8(acc);
}

// In-register FWHT stages h = 1, 2, 4, 8. For lane i the reference computes a + b (low) or a - b
// (high); here fma(self, +-1, partner): the product is exact, so one rounding of b + a or a + (-b),
// which equal a + b and a - b bit for bit (NaN payloads aside), as in the AVX2 table.
[[gnu::always_inline]] inline __m512 FwhtIn16(__m512 x) {
  const __m512 s1 = _mm512_setr_ps(1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1);
  const __m512 s2 = _mm512_setr_ps(1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1);
  const __m512 s4 = _mm512_setr_ps(1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1);
  x = _mm512_fmadd_ps(x, s1, _mm512_permute_ps(x, 0xB1));
  x = _mm512_fmadd_ps(x, s2, _mm512_permute_ps(x, 0x4E));
  x = _mm512_fmadd_ps(x, s4, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512 t = _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2));
#if TQKV_AVX512_FMA_STAGE8
  // Stage 8 as the others: Intel's 512-bit adds run on the fma ports, so one op beats two.
  const __m512 s8 = _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1);
  return _mm512_fmadd_ps(x, s8, t);
#else
  // Stage 8 on the adders (a + b low, a - b high, both exact IEEE ops): on Zen 4 they are pipes
  // of their own, and the fma pipes carry the other three stages and the sign multiplies.
  return _mm512_mask_sub_ps(_mm512_add_ps(x, t), static_cast<__mmask16>(0xFF00), t, x);
#endif
}

// Unnormalised FWHT of 16 * R floats held as R registers; beyond 16 registers both halves first,
// then the last stage across them (every element sees the reference's operations in order).
template <int R>
[[gnu::always_inline]] inline void FwhtRegs(__m512* x) {
  if constexpr (R > 16) {
    FwhtRegs<R / 2>(x);
    FwhtRegs<R / 2>(x + R / 2);
#pragma GCC unroll 64
    for (int r = 0; r < R / 2; ++r) {
      const __m512 a = x[r], b = x[r + R / 2];
      x[r] = _mm512_add_ps(a, b);
      x[r + R / 2] = _mm512_sub_ps(a, b);
    }
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) x[r] = FwhtIn16(x[r]);
    avx512::ButterflyStages<R>(x);
  }
}

// Per-call constants: the binary search's probe tables (probe[p][j] = threshold j + 2^p - 1, so
// the probe after a prefix idx is one permute of idx, no index arithmetic), up to 32 centroids in
// two registers, and the search's constants as registers (not rebuilt per vector).
struct Tables {
  __m512 probe[kMaxBits - 1][2];
  __m512 cent[2];
  __m512 first;      // the first probe, threshold 2^(bits-1) - 1, in every lane
  __m512i step[kMaxBits];  // 2^p in every lane
};

void InitTables(const SubsetPlan& p, Tables* t) {
  alignas(64) float cent[32] = {};
  const uint32_t nc = 1u << p.bits;
  for (uint32_t k = 0; k < nc; ++k) cent[k] = p.centroids[k];
  for (int b = 0; b + 1 < kMaxBits; ++b) {
    alignas(64) float probe[32] = {};
    for (uint32_t j = 0; j < 32; ++j) {
      const uint32_t k = j + (1u << b) - 1;
      if (k + 1 < nc) probe[j] = p.thresholds[k];
    }
    for (int r = 0; r < 2; ++r) t->probe[b][r] = _mm512_load_ps(probe + 16 * r);
  }
  for (int r = 0; r < 2; ++r) t->cent[r] = _mm512_load_ps(cent + 16 * r);
  t->first = _mm512_set1_ps(p.thresholds[(nc >> 1) - 1]);
  for (int b = 0; b < kMaxBits; ++b) t->step[b] = _mm512_set1_epi32(1 << b);
}

// The 16 entries of a table register pair picked by idx (0..31; up to 4 bits one register).
template <int kBits>
inline __m512 Lookup16(const __m512* table, __m512i idx) {
  if constexpr (kBits <= 4) {
    return _mm512_permutexvar_ps(idx, table[0]);
  } else {
    return _mm512_permutex2var_ps(table[0], idx, table[1]);
  }
}

// The number of thresholds strictly below each lane of z (ordered compares: NaN counts 0), by
// binary search: thresholds ascend, so with count c the probe at step 2^p is below z exactly when
// bit p of c is set. The compare masks are therefore the lanes' bit planes: plane[p] gets them.
template <int kBits>
[[gnu::always_inline]] inline __m512i Quantize16(const Tables& t, __m512 z, uint32_t* plane) {
  __mmask16 k = _mm512_cmp_ps_mask(t.first, z, _CMP_LT_OQ);
  plane[kBits - 1] = k;
  __m512i idx = _mm512_maskz_mov_epi32(k, t.step[kBits - 1]);
#pragma GCC unroll 4
  for (int p = kBits - 2; p >= 0; --p) {
    k = _mm512_cmp_ps_mask(Lookup16<kBits>(t.probe[p], idx), z, _CMP_LT_OQ);
    plane[p] = k;
    idx = _mm512_mask_add_epi32(idx, k, idx, t.step[p]);
  }
  return idx;
}

// The low nbytes (at most 8) of w, little-endian, as pieces of 8, 4, 2 and 1 bytes: with a
// constant size (the in-register coders) one or two moves, never a loop of byte shifts.
inline void StoreBytes(uint8_t* dst, size_t nbytes, uint64_t w) {
  if (nbytes == 8) {
    std::memcpy(dst, &w, 8);
    return;
  }
  size_t b = 0;
  if (nbytes & 4) {
    const auto v = static_cast<uint32_t>(w);
    std::memcpy(dst, &v, 4);
    b = 4;
  }
  if (nbytes & 2) {
    const auto v = static_cast<uint16_t>(w >> (8 * b));
    std::memcpy(dst + b, &v, 2);
    b += 2;
  }
  if (nbytes & 1) dst[b] = static_cast<uint8_t>(w >> (8 * b));
}

inline uint64_t LoadBytes(const uint8_t* src, size_t nbytes) {
  uint64_t w = 0;
  if (nbytes == 8) {
    std::memcpy(&w, src, 8);
    return w;
  }
  size_t b = 0;
  if (nbytes & 4) {
    uint32_t v;
    std::memcpy(&v, src, 4);
    w = v;
    b = 4;
  }
  if (nbytes & 2) {
    uint16_t v;
    std::memcpy(&v, src + b, 2);
    w |= static_cast<uint64_t>(v) << (8 * b);
    b += 2;
  }
  if (nbytes & 1) w |= static_cast<uint64_t>(src[b]) << (8 * b);
  return w;
}

using internal::LoadNorm;
using internal::StoreNorm;

// Quantizes z (m floats, aligned) and writes the bit planes: register r's compare masks are bytes
// 2r, 2r + 1 of each plane, gathered four registers to a 64-bit word. With norm correction also
// returns Sum8 of the centroids' squares.
template <int kBits>
[[gnu::always_inline]] inline float QuantizePack(const SubsetPlan& plan, const Tables& t,
                                                 const float* z, uint8_t* planes) {
  const size_t m = plan.dim, pb = m / 8;
  __m256 csum = _mm256_setzero_ps();
  for (size_t j0 = 0; j0 < m; j0 += 64) {
    uint64_t words[kBits] = {};
    const size_t regs = std::min<size_t>(4, (m - j0) / 16);
#pragma GCC unroll 4
    for (size_t r = 0; r < regs; ++r) {
      uint32_t plane[kBits];
      const __m512i idx = Quantize16<kBits>(t, _mm512_load_ps(z + j0 + 16 * r), plane);
#pragma GCC unroll 8
      for (int p = 0; p < kBits; ++p) words[p] |= static_cast<uint64_t>(plane[p]) << (16 * r);
      if (plan.norm_correction) {
        const __m512 c = Lookup16<kBits>(t.cent, idx);
        csum = AddSum8(csum, _mm512_mul_ps(c, c));
      }
    }
#pragma GCC unroll 8
    for (int p = 0; p < kBits; ++p) StoreBytes(planes + p * pb + j0 / 8, 2 * regs, words[p]);
  }
  return plan.norm_correction ? ReduceSum8(csum) : 0.0f;
}

// ---- rotations: forward into an aligned z (scaled), inverse from an aligned v ----

using ForwardFn = void (*)(const SubsetPlan&, const float*, float, float*);
using InverseFn = void (*)(const SubsetPlan&, const float*, float*);

// z = Fwht(s2 * Fwht(s1 * x)) * scale (Hadamard2) or Fwht(s1 * x) * scale.
// v = Fwht(s2 * Fwht(s1 * x)) (Hadamard2) or Fwht(s1 * x), m = 16 R floats in registers. kTwo:
// Hadamard2 known at compile time (one path, no merge of two through the stack); else p says.
template <int R, int kTwo = -1>
[[gnu::always_inline]] inline void HadamardRegs(const SubsetPlan& p, const float* x, __m512* v) {
#pragma GCC unroll 64
  for (int r = 0; r < R; ++r) {
    v[r] = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * r), _mm512_loadu_ps(p.signs1 + 16 * r));
  }
  FwhtRegs<R>(v);
  if (kTwo == 1 || (kTwo < 0 && p.rotation == RotationKind::kHadamard2)) {
#pragma GCC unroll 64
    for (int r = 0; r < R; ++r) v[r] = _mm512_mul_ps(v[r], _mm512_loadu_ps(p.signs2 + 16 * r));
    FwhtRegs<R>(v);
  }
}

template <int R>
void HadamardForward(const SubsetPlan& p, const float* x, float scale, float* z) {
  __m512 v[R];
  HadamardRegs<R>(p, x, v);
  const __m512 s = _mm512_set1_ps(scale);
#pragma GCC unroll 64
  for (int r = 0; r < R; ++r) _mm512_store_ps(z + 16 * r, _mm512_mul_ps(v[r], s));
}

// out = s1 * Fwht(s2 * Fwht(v)) (Hadamard2) or s1 * Fwht(v).
template <int R>
void HadamardInverse(const SubsetPlan& p, const float* v_in, float* out) {
  __m512 v[R];
#pragma GCC unroll 64
  for (int r = 0; r < R; ++r) v[r] = _mm512_load_ps(v_in + 16 * r);
  FwhtRegs<R>(v);
  if (p.rotation == RotationKind::kHadamard2) {
#pragma GCC unroll 64
    for (int r = 0; r < R; ++r) v[r] = _mm512_mul_ps(v[r], _mm512_loadu_ps(p.signs2 + 16 * r));
    FwhtRegs<R>(v);
  }
#pragma GCC unroll 64
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(out + 16 * r, _mm512_mul_ps(v[r], _mm512_loadu_ps(p.signs1 + 16 * r)));
  }
}

// t = Fwht(signs * x) for one Kronecker block of 16 * R floats (t aligned).
template <int R>
void SignedFwhtBlock(const float* x, const float* signs, float* t) {
  __m512 v[R];
#pragma GCC unroll 64
  for (int r = 0; r < R; ++r) {
    v[r] = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * r), _mm512_loadu_ps(signs + 16 * r));
  }
  FwhtRegs<R>(v);
#pragma GCC unroll 64
  for (int r = 0; r < R; ++r) _mm512_store_ps(t + 16 * r, v[r]);
}

// out = signs * Fwht(u) for one block (u aligned).
template <int R>
void FwhtSignedBlock(const float* u, const float* signs, float* out) {
  __m512 v[R];
#pragma GCC unroll 64
  for (int r = 0; r < R; ++r) v[r] = _mm512_load_ps(u + 16 * r);
  FwhtRegs<R>(v);
#pragma GCC unroll 64
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(out + 16 * r, _mm512_mul_ps(v[r], _mm512_loadu_ps(signs + 16 * r)));
  }
}

// y = (M (x) I_B) x, B = 16 * R, mt = M^T (q*q): for output block a, the q fmas of each lane in
// the reference's order (a' ascending, from +0). The result goes to y (scaled by *scale: encode),
// or with `signs`, through the block's FWHT in registers and the sign multiply (decode). kQ > 0
// fixes q at compile time (q = 3: 96 = 3 * 32, 48 = 3 * 16), so the weights stay in registers.
template <int R, int kQ>
inline void KronMixBlocks(const float* mt, const float* x, size_t q_runtime, const float* scale,
                          const float* signs, float* y) {
  const size_t q = kQ > 0 ? static_cast<size_t>(kQ) : q_runtime;
  constexpr int kB = 16 * R;
  constexpr int kChunk = R < 8 ? R : 8;
#pragma GCC unroll 4
  for (size_t a = 0; a < q; ++a) {
    if (signs != nullptr && R <= 8) {  // decode: the whole block in registers
      __m512 acc[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
#pragma GCC unroll 4
      for (size_t a2 = 0; a2 < q; ++a2) {
        const __m512 w = _mm512_set1_ps(mt[a2 * q + a]);
        const float* xb = x + a2 * kB;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(w, _mm512_load_ps(xb + 16 * r), acc[r]);
      }
      FwhtRegs<R>(acc);
      float* yb = y + a * kB;
      const float* sb = signs + a * kB;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        _mm512_storeu_ps(yb + 16 * r, _mm512_mul_ps(acc[r], _mm512_loadu_ps(sb + 16 * r)));
      }
      continue;
    }
    for (int r0 = 0; r0 < R; r0 += kChunk) {
      __m512 acc[kChunk];
#pragma GCC unroll 8
      for (int r = 0; r < kChunk; ++r) acc[r] = _mm512_setzero_ps();
#pragma GCC unroll 4
      for (size_t a2 = 0; a2 < q; ++a2) {
        const __m512 w = _mm512_set1_ps(mt[a2 * q + a]);
        const float* xb = x + a2 * kB + 16 * r0;
#pragma GCC unroll 8
        for (int r = 0; r < kChunk; ++r) {
          acc[r] = _mm512_fmadd_ps(w, _mm512_load_ps(xb + 16 * r), acc[r]);
        }
      }
      if (scale != nullptr) {
        const __m512 s = _mm512_set1_ps(*scale);
#pragma GCC unroll 8
        for (int r = 0; r < kChunk; ++r) acc[r] = _mm512_mul_ps(acc[r], s);
      }
      float* yb = y + a * kB + 16 * r0;
#pragma GCC unroll 8
      for (int r = 0; r < kChunk; ++r) _mm512_store_ps(yb + 16 * r, acc[r]);
    }
  }
}

template <int R, int kQ>
void KronForward(const SubsetPlan& p, const float* x, float scale, float* z) {
  constexpr size_t kB = 16 * R;
  alignas(64) float t[kMaxDim];
  for (size_t j = 0; j < p.dim; j += kB) SignedFwhtBlock<R>(x + j, p.signs1 + j, t + j);
  KronMixBlocks<R, kQ>(p.haar_t, t, p.dim / kB, &scale, nullptr, z);
}

template <int R, int kQ>
void KronInverse(const SubsetPlan& p, const float* v, float* out) {
  constexpr size_t kB = 16 * R;
  if constexpr (R <= 8) {
    KronMixBlocks<R, kQ>(p.haar, v, p.dim / kB, nullptr, p.signs1, out);
  } else {
    alignas(64) float u[kMaxDim];
    KronMixBlocks<R, kQ>(p.haar, v, p.dim / kB, nullptr, nullptr, u);
    for (size_t j = 0; j < p.dim; j += kB) FwhtSignedBlock<R>(u + j, p.signs1 + j, out + j);
  }
}

// Picks F<R> for R = n / 16 registers, n a power of two from 16 to kMaxDim.
template <template <int> class F, typename Fn>
Fn PickByRegs(uint32_t n) {
  switch (n / 16) {
    case 1: return F<1>::kFn;
    case 2: return F<2>::kFn;
    case 4: return F<4>::kFn;
    case 8: return F<8>::kFn;
    case 16: return F<16>::kFn;
    case 32: return F<32>::kFn;
    case 64: return F<64>::kFn;
  }
  return nullptr;
}
template <int R>
struct HadamardForwardOp {
  static constexpr ForwardFn kFn = HadamardForward<R>;
};
template <int R>
struct HadamardInverseOp {
  static constexpr InverseFn kFn = HadamardInverse<R>;
};
template <int R>
struct KronForwardOp {
  static constexpr ForwardFn kFn = KronForward<R, 0>;
};
template <int R>
struct KronInverseOp {
  static constexpr InverseFn kFn = KronInverse<R, 0>;
};
// q = 3 only where 3 * B fits kMaxDim (larger shapes never reach this path).
template <int R>
struct KronForward3Op {
  static constexpr ForwardFn kFn = 48 * R <= kMaxDim ? KronForward<R, 3> : KronForward<R, 0>;
};
template <int R>
struct KronInverse3Op {
  static constexpr InverseFn kFn = 48 * R <= kMaxDim ? KronInverse<R, 3> : KronInverse<R, 0>;
};

ForwardFn PickForwardFn(const SubsetPlan& p) {
  if (p.rotation == RotationKind::kKronecker) {
    if (p.dim == 3 * p.block) return PickByRegs<KronForward3Op, ForwardFn>(p.block);
    return PickByRegs<KronForwardOp, ForwardFn>(p.block);
  }
  return PickByRegs<HadamardForwardOp, ForwardFn>(p.dim);
}
InverseFn PickInverseFn(const SubsetPlan& p) {
  if (p.rotation == RotationKind::kKronecker) {
    if (p.dim == 3 * p.block) return PickByRegs<KronInverse3Op, InverseFn>(p.block);
    return PickByRegs<KronInverseOp, InverseFn>(p.block);
  }
  return PickByRegs<HadamardInverseOp, InverseFn>(p.dim);
}

// One vector's scaled centroids v = c[idx] * a into vbuf (aligned). The planes become index bytes
// 64 at a time (one masked byte add per plane), then 16 indices pick 16 centroids in one permute.
template <int kBits>
void DequantizeVec(const SubsetPlan& plan, const Tables& t, const uint8_t* norm_in,
                   const uint8_t* planes, float* vbuf) {
  const size_t m = plan.dim, pb = m / 8;
  const __m512 av = _mm512_set1_ps(LoadNorm(norm_in, plan.norm_dtype) * plan.dec_scale);
  // Scaling the centroids first gives each lane the same product c[idx] * a.
  const __m512 cent[2] = {_mm512_mul_ps(t.cent[0], av), _mm512_mul_ps(t.cent[1], av)};
  alignas(64) uint8_t idx[64];
  for (size_t j0 = 0; j0 < m; j0 += 64) {
    const size_t nbytes = std::min<size_t>(8, pb - j0 / 8);
    __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int p = 0; p < kBits; ++p) {
      const __mmask64 k = _cvtu64_mask64(LoadBytes(planes + p * pb + j0 / 8, nbytes));
      acc = _mm512_mask_add_epi8(acc, k, acc, _mm512_set1_epi8(static_cast<char>(1 << p)));
    }
    _mm512_store_si512(idx, acc);
    const size_t regs = std::min<size_t>(4, (m - j0) / 16);
#pragma GCC unroll 4
    for (size_t r = 0; r < regs; ++r) {
      const __m512i q =
          _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(idx + 16 * r)));
      _mm512_store_ps(vbuf + j0 + 16 * r, Lookup16<kBits>(cent, q));
    }
  }
}

// ---- per-vector coders ----

// Norms several vectors at a time: each of Sum8's eight lanes is one chain of m / 8 dependent
// adds, so interleaving the chains of kNormBatch vectors keeps the adders busy.
constexpr size_t kNormBatch = 4;

template <int N>
void NormsN(const float* const* x, size_t m, float* norms) {
  __m256 acc[N];
#pragma GCC unroll 4
  for (int v = 0; v < N; ++v) acc[v] = _mm256_setzero_ps();
  for (size_t i = 0; i < m; i += 16) {
#pragma GCC unroll 4
    for (int v = 0; v < N; ++v) {
      const __m512 xv = _mm512_loadu_ps(x[v] + i);
      acc[v] = AddSum8(acc[v], _mm512_mul_ps(xv, xv));
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < N; ++v) norms[v] = _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(ReduceSum8(acc[v]))));
}

// norms[v] = sqrtf(Sum8(x_v^2)) for count (1..kNormBatch) vectors of m floats.
inline void Norms(const float* const* x, size_t count, size_t m, float* norms) {
  switch (count) {
    case 1: return NormsN<1>(x, m, norms);
    case 2: return NormsN<2>(x, m, norms);
    case 3: return NormsN<3>(x, m, norms);
    default: return NormsN<4>(x, m, norms);
  }
}

struct VecCoder;
// One vector x of the plan with its norm: rotation, scale, quantize, pack (z: aligned scratch).
using EncodeVecFn = void (*)(const SubsetPlan&, const VecCoder&, const float* x, float norm,
                             float* z, uint8_t* norm_out, uint8_t* planes);
// One vector back to out (vbuf: aligned scratch).
using DecodeVecFn = void (*)(const SubsetPlan&, const VecCoder&, const uint8_t* norm_in,
                             const uint8_t* planes, float* vbuf, float* out);

// One vector to out as dtype, key means added first (mean null: none; a = scale * mean). vbuf,
// obuf: aligned scratch.
using DecodeToFn = void (*)(const SubsetPlan&, const VecCoder&, const uint8_t* norm_in,
                            const uint8_t* planes, float* vbuf, float* obuf, const float* mean,
                            float scale, void* out, DType dtype);

// One subset's per-call state.
struct VecCoder {
  Tables t;
  ForwardFn forward;  // the route through memory (Kronecker, Hadamard beyond 256)
  InverseFn inverse;
  EncodeVecFn encode;
  DecodeVecFn decode;
  DecodeToFn decode_to;
};

// A zero or non-finite norm: every index 0, stored norm +0 or NaN. True when it was one.
inline bool EncodeDegenerate(const SubsetPlan& plan, float norm, uint8_t* norm_out,
                             uint8_t* planes) {
  if (norm != 0.0f && std::isfinite(norm)) return false;
  StoreNorm(norm == 0.0f ? 0.0f : std::numeric_limits<float>::quiet_NaN(), plan.norm_dtype,
            norm_out);
  std::memset(planes, 0, plan.planes_bytes());
  return true;
}

inline void StoreEncodedNorm(const SubsetPlan& plan, float norm, float csum, uint8_t* norm_out) {
  float stored = norm;
  if (plan.norm_correction) {
    stored = norm * _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(static_cast<float>(plan.dim) / csum)));
  }
  StoreNorm(stored, plan.norm_dtype, norm_out);
}

template <int kBits>
void EncodeVecGeneric(const SubsetPlan& plan, const VecCoder& c, const float* xv, float norm,
                      float* z, uint8_t* norm_out, uint8_t* planes) {
  if (EncodeDegenerate(plan, norm, norm_out, planes)) return;
  c.forward(plan, xv, plan.enc_scale / norm, z);
  StoreEncodedNorm(plan, norm, QuantizePack<kBits>(plan, c.t, z, planes), norm_out);
}

// Quantizes the N registers v (times s) and writes the bit planes (register r: bytes 2r, 2r + 1 of
// each plane); with norm correction returns Sum8 of the centroids' squares.
template <int kBits, int N>
[[gnu::always_inline]] inline float QuantizeRegs(const SubsetPlan& plan, const VecCoder& c,
                                                 const __m512* v, __m512 s, uint8_t* planes) {
  constexpr size_t kPb = 2 * N;
  __m256 csum = _mm256_setzero_ps();
  uint64_t words[kBits] = {};
  Unroll<N>([&](auto rc) {
    constexpr int r = decltype(rc)::value;
    uint32_t plane[kBits];
    const __m512i idx = Quantize16<kBits>(c.t, _mm512_mul_ps(v[r], s), plane);
#pragma GCC unroll 8
    for (int p = 0; p < kBits; ++p) words[p] |= static_cast<uint64_t>(plane[p]) << (16 * (r % 4));
    if (plan.norm_correction) {
      const __m512 cv = Lookup16<kBits>(c.t.cent, idx);
      csum = AddSum8(csum, _mm512_mul_ps(cv, cv));
    }
    if constexpr (r % 4 == 3 || r == N - 1) {  // four registers make 8 bytes of each plane
#pragma GCC unroll 8
      for (int p = 0; p < kBits; ++p) {
        StoreBytes(planes + p * kPb + 8 * (r / 4), 2 * (r % 4 + 1), words[p]);
        words[p] = 0;
      }
    }
  });
  return plan.norm_correction ? ReduceSum8(csum) : 0.0f;
}

// Hadamard kinds with m = 16 R: rotation, scale and quantization without leaving the registers.
template <int kBits, int R, int kTwo>
void EncodeVecHadamard(const SubsetPlan& plan, const VecCoder& c, const float* xv, float norm,
                       float*, uint8_t* norm_out, uint8_t* planes) {
  if (EncodeDegenerate(plan, norm, norm_out, planes)) return;
  __m512 v[R];
  HadamardRegs<R, kTwo>(plan, xv, v);
  const __m512 s = _mm512_set1_ps(plan.enc_scale / norm);
  const float csum = QuantizeRegs<kBits, R>(plan, c, v, s, planes);
  StoreEncodedNorm(plan, norm, csum, norm_out);
}

// Kronecker with q = kQ blocks of B = 16 R (q R <= 16 registers): the blocks' signed FWHTs, the
// q x q mix (KronMix's fmas in order), scale and quantization in registers.
template <int kBits, int R, int kQ>
void EncodeVecKron(const SubsetPlan& plan, const VecCoder& c, const float* xv, float norm, float*,
                   uint8_t* norm_out, uint8_t* planes) {
  if (EncodeDegenerate(plan, norm, norm_out, planes)) return;
  constexpr int N = kQ * R;
  __m512 t[N], v[N];
#pragma GCC unroll 16
  for (int r = 0; r < N; ++r) {
    t[r] = _mm512_mul_ps(_mm512_loadu_ps(xv + 16 * r), _mm512_loadu_ps(plan.signs1 + 16 * r));
  }
#pragma GCC unroll 4
  for (int b = 0; b < kQ; ++b) FwhtRegs<R>(t + b * R);
#pragma GCC unroll 4
  for (int a = 0; a < kQ; ++a) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) v[a * R + r] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int a2 = 0; a2 < kQ; ++a2) {
      const __m512 w = _mm512_set1_ps(plan.haar_t[a2 * kQ + a]);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) v[a * R + r] = _mm512_fmadd_ps(w, t[a2 * R + r], v[a * R + r]);
    }
  }
  // One multiply by enc_scale / norm, as KronForward's.
  const __m512 s = _mm512_set1_ps(plan.enc_scale / norm);
  const float csum = QuantizeRegs<kBits, N>(plan, c, v, s, planes);
  StoreEncodedNorm(plan, norm, csum, norm_out);
}

template <int kBits>
void DecodeVecGeneric(const SubsetPlan& plan, const VecCoder& c, const uint8_t* norm_in,
                      const uint8_t* planes, float* vbuf, float* out) {
  DequantizeVec<kBits>(plan, c.t, norm_in, planes, vbuf);
  c.inverse(plan, vbuf, out);
}

// Hadamard kinds with m = 16 R: planes to index bytes (64 at a time), centroids, inverse rotation
// and signs in registers.
// Planes to index bytes (64 at a time), then the scaled centroids of N registers.
template <int kBits, int N>
[[gnu::always_inline]] inline void CentroidRegs(const SubsetPlan& plan, const VecCoder& c,
                                                const uint8_t* norm_in, const uint8_t* planes,
                                                __m512* v) {
  constexpr size_t kPb = 2 * N;
  const __m512 av = _mm512_set1_ps(LoadNorm(norm_in, plan.norm_dtype) * plan.dec_scale);
  const __m512 cent[2] = {_mm512_mul_ps(c.t.cent[0], av), _mm512_mul_ps(c.t.cent[1], av)};
  Unroll<(N + 3) / 4>([&](auto gc) {
    constexpr int g = decltype(gc)::value;
    constexpr size_t kBytes = std::min<size_t>(8, kPb - 8 * g);
    __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int p = 0; p < kBits; ++p) {
      const __mmask64 k = _cvtu64_mask64(LoadBytes(planes + p * kPb + 8 * g, kBytes));
      acc = _mm512_mask_add_epi8(acc, k, acc, _mm512_set1_epi8(static_cast<char>(1 << p)));
    }
    Unroll<std::min(4, N - 4 * g)>([&](auto rc) {
      constexpr int r = decltype(rc)::value;
      const __m512i q = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(acc, r));
      v[4 * g + r] = Lookup16<kBits>(cent, q);
    });
  });
}

// Hadamard kinds with m = 16 R: the decoded vector in R registers.
template <int kBits, int R>
[[gnu::always_inline]] inline void DecodeRegs(const SubsetPlan& plan, const VecCoder& c,
                                              const uint8_t* norm_in, const uint8_t* planes,
                                              __m512* v) {
  CentroidRegs<kBits, R>(plan, c, norm_in, planes, v);
  FwhtRegs<R>(v);
  if (plan.rotation == RotationKind::kHadamard2) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) v[r] = _mm512_mul_ps(v[r], _mm512_loadu_ps(plan.signs2 + 16 * r));
    FwhtRegs<R>(v);
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) v[r] = _mm512_mul_ps(v[r], _mm512_loadu_ps(plan.signs1 + 16 * r));
}

// Kronecker with q = kQ blocks of 16 R: the decoded vector in kQ R registers (KronMix by Q^T,
// each block's FWHT, the signs).
template <int kBits, int R, int kQ>
[[gnu::always_inline]] inline void KronDecodeRegs(const SubsetPlan& plan, const VecCoder& c,
                                                  const uint8_t* norm_in, const uint8_t* planes,
                                                  __m512* out) {
  constexpr int N = kQ * R;
  __m512 v[N];
  CentroidRegs<kBits, N>(plan, c, norm_in, planes, v);
#pragma GCC unroll 4
  for (int a = 0; a < kQ; ++a) {
    __m512* acc = out + a * R;
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int a2 = 0; a2 < kQ; ++a2) {
      const __m512 w = _mm512_set1_ps(plan.haar[a2 * kQ + a]);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(w, v[a2 * R + r], acc[r]);
    }
    FwhtRegs<R>(acc);
  }
#pragma GCC unroll 16
  for (int r = 0; r < N; ++r) out[r] = _mm512_mul_ps(out[r], _mm512_loadu_ps(plan.signs1 + 16 * r));
}

template <int kBits, int R, int kQ>
void DecodeVecKron(const SubsetPlan& plan, const VecCoder& c, const uint8_t* norm_in,
                   const uint8_t* planes, float*, float* out) {
  __m512 v[kQ * R];
  KronDecodeRegs<kBits, R, kQ>(plan, c, norm_in, planes, v);
#pragma GCC unroll 16
  for (int r = 0; r < kQ * R; ++r) _mm512_storeu_ps(out + 16 * r, v[r]);
}

template <int kBits, int R>
void DecodeVecHadamard(const SubsetPlan& plan, const VecCoder& c, const uint8_t* norm_in,
                       const uint8_t* planes, float*, float* out) {
  __m512 v[R];
  DecodeRegs<kBits, R>(plan, c, norm_in, planes, v);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + 16 * r, v[r]);
}

// Channels c..c+15 of a decoded vector to out: with mean, v + a * mean (the product rounded
// first, as add_scaled), then from_f32's rounding to dtype.
[[gnu::always_inline]] inline void StoreDecoded16(__m512 v, size_t c, const float* mean,
                                                  __m512 a, void* out, DType dtype) {
  if (mean != nullptr) v = _mm512_add_ps(v, _mm512_mul_ps(a, _mm512_loadu_ps(mean + c)));
  if (dtype == DType::kF32) {
    _mm512_storeu_ps(static_cast<float*>(out) + c, v);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + c),
                        FloatTo16(v, dtype == DType::kF16));
  }
}

template <int kBits, int R>
void DecodeVecHadamardTo(const SubsetPlan& plan, const VecCoder& c, const uint8_t* norm_in,
                         const uint8_t* planes, float*, float*, const float* mean, float scale,
                         void* out, DType dtype) {
  __m512 v[R];
  DecodeRegs<kBits, R>(plan, c, norm_in, planes, v);
  const __m512 a = _mm512_set1_ps(scale);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) StoreDecoded16(v[r], 16 * r, mean, a, out, dtype);
}

template <int kBits, int R, int kQ>
void DecodeVecKronTo(const SubsetPlan& plan, const VecCoder& c, const uint8_t* norm_in,
                     const uint8_t* planes, float*, float*, const float* mean, float scale,
                     void* out, DType dtype) {
  __m512 v[kQ * R];
  KronDecodeRegs<kBits, R, kQ>(plan, c, norm_in, planes, v);
  const __m512 a = _mm512_set1_ps(scale);
#pragma GCC unroll 16
  for (int r = 0; r < kQ * R; ++r) StoreDecoded16(v[r], 16 * r, mean, a, out, dtype);
}

template <int kBits>
void DecodeVecGenericTo(const SubsetPlan& plan, const VecCoder& c, const uint8_t* norm_in,
                        const uint8_t* planes, float* vbuf, float* obuf, const float* mean,
                        float scale, void* out, DType dtype) {
  DequantizeVec<kBits>(plan, c.t, norm_in, planes, vbuf);
  c.inverse(plan, vbuf, obuf);
  const __m512 a = _mm512_set1_ps(scale);
  for (size_t j = 0; j < plan.dim; j += 16) {
    StoreDecoded16(_mm512_load_ps(obuf + j), j, mean, a, out, dtype);
  }
}

// Hadamard vectors of up to 256 floats stay in registers; the rest goes through memory.
template <int kBits>
void PickCoders(const SubsetPlan& p, VecCoder* c) {
  c->encode = EncodeVecGeneric<kBits>;
  c->decode = DecodeVecGeneric<kBits>;
  c->decode_to = DecodeVecGenericTo<kBits>;
  if (p.rotation == RotationKind::kKronecker) {
    // q = 3 (the split presets' rest: 48, 96, 192 channels) in registers.
    if (p.dim != 3 * p.block) return;
    const auto pick_kron = [c](auto rc) {
      constexpr int R = decltype(rc)::value;
      c->encode = EncodeVecKron<kBits, R, 3>;
      c->decode = DecodeVecKron<kBits, R, 3>;
      c->decode_to = DecodeVecKronTo<kBits, R, 3>;
    };
    switch (p.block) {
      case 16: return pick_kron(std::integral_constant<int, 1>{});
      case 32: return pick_kron(std::integral_constant<int, 2>{});
      case 64: return pick_kron(std::integral_constant<int, 4>{});
    }
    return;
  }
  if (p.dim > 256) return;
  const auto pick = [&p, c](auto rc) {
    constexpr int R = decltype(rc)::value;
    c->encode = p.rotation == RotationKind::kHadamard2 ? EncodeVecHadamard<kBits, R, 1>
                                                        : EncodeVecHadamard<kBits, R, 0>;
    c->decode = DecodeVecHadamard<kBits, R>;
    c->decode_to = DecodeVecHadamardTo<kBits, R>;
  };
  switch (p.dim / 16) {
    case 1: return pick(std::integral_constant<int, 1>{});
    case 2: return pick(std::integral_constant<int, 2>{});
    case 4: return pick(std::integral_constant<int, 4>{});
    case 8: return pick(std::integral_constant<int, 8>{});
    case 16: return pick(std::integral_constant<int, 16>{});
  }
}

void InitVecCoder(const SubsetPlan& p, VecCoder* c) {
  using PickFn = void (*)(const SubsetPlan&, VecCoder*);
  static constexpr PickFn kPick[kMaxBits] = {PickCoders<1>, PickCoders<2>, PickCoders<3>,
                                             PickCoders<4>, PickCoders<5>};
  InitTables(p, &c->t);
  c->forward = PickForwardFn(p);
  c->inverse = PickInverseFn(p);
  kPick[p.bits - 1](p, c);
}

void Encode(const SubsetPlan& plan, const float* x, size_t x_stride, size_t n, uint8_t* norm_out,
            uint8_t* planes_out, size_t code_stride) {
  if (!Vectorised(plan)) {
    return Avx2().encode(plan, x, x_stride, n, norm_out, planes_out, code_stride);
  }
  VecCoder c;
  InitVecCoder(plan, &c);
  alignas(64) float z[kMaxDim];
  for (size_t v0 = 0; v0 < n; v0 += kNormBatch) {
    const size_t cnt = std::min(kNormBatch, n - v0);
    const float* xs[kNormBatch];
    float norms[kNormBatch];
    for (size_t b = 0; b < cnt; ++b) xs[b] = x + (v0 + b) * x_stride;
    Norms(xs, cnt, plan.dim, norms);
    for (size_t b = 0; b < cnt; ++b) {
      const size_t v = v0 + b;
      c.encode(plan, c, xs[b], norms[b], z, norm_out + v * code_stride,
               planes_out + v * code_stride);
    }
  }
}

void EncodeUnit(const SubsetPlan& plan, const float* x, size_t x_stride, size_t n,
                uint8_t* planes_out, size_t code_stride) {
  if (!Vectorised(plan)) return Avx2().encode_unit(plan, x, x_stride, n, planes_out, code_stride);
  VecCoder c;
  InitVecCoder(plan, &c);
  alignas(64) float z[kMaxDim];
  uint8_t norm[4];  // not stored
  for (size_t v = 0; v < n; ++v) {
    c.encode(plan, c, x + v * x_stride, 1.0f, z, norm, planes_out + v * code_stride);
  }
}

void Whiten(const float* x, size_t x_stride, size_t n, size_t d, const uint32_t* channel,
            const float* mean, const float* scale, size_t rows, float* norms, float* w,
            size_t w_stride) {
  if (d % 16 != 0) {
    return Avx2().whiten(x, x_stride, n, d, channel, mean, scale, rows, norms, w, w_stride);
  }
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
  for (size_t i0 = 0; i0 < n; i0 += kNormBatch) {
    const size_t cnt = std::min(kNormBatch, n - i0);
    const float* xs[kNormBatch];
    for (size_t b = 0; b < cnt; ++b) xs[b] = x + (i0 + b) * x_stride;
    Norms(xs, cnt, d, norms + i0);
    for (size_t b = 0; b < cnt; ++b) {
      const __m512 nv = _mm512_set1_ps(norms[i0 + b]);
      float* wv = w + (i0 + b) * w_stride;
      for (size_t r = 0; r < rows; r += 16) {
        const __mmask16 k = rows - r >= 16 ? __mmask16{0xFFFF} : (__mmask16{1} << (rows - r)) - 1;
        const __m512i c = _mm512_maskz_loadu_epi32(k, channel + r);
        const __m512 u = _mm512_div_ps(_mm512_mask_i32gather_ps(zero, k, c, xs[b], 4), nv);
        const __m512 s = _mm512_maskz_loadu_ps(k, scale + r);
        const __mmask16 pos = _mm512_cmp_ps_mask(s, zero, _CMP_GT_OQ);  // the divisor 1 elsewhere
        const __m512 q = _mm512_div_ps(_mm512_sub_ps(u, _mm512_maskz_loadu_ps(k, mean + r)),
                                       _mm512_mask_blend_ps(pos, one, s));
        _mm512_mask_storeu_ps(wv + r, k, _mm512_maskz_mov_ps(pos, q));
      }
    }
  }
}

void UnitMoments(const float* x, size_t x_stride, size_t n, size_t d, double* s1, double* s2,
                 size_t* count, float* largest) {
  if (d % 16 != 0) return Avx2().unit_moments(x, x_stride, n, d, s1, s2, count, largest);
  for (size_t i0 = 0; i0 < n; i0 += kNormBatch) {
    const size_t cnt = std::min(kNormBatch, n - i0);
    const float* xs[kNormBatch];
    float norms[kNormBatch];
    for (size_t b = 0; b < cnt; ++b) xs[b] = x + (i0 + b) * x_stride;
    Norms(xs, cnt, d, norms);
    for (size_t b = 0; b < cnt; ++b) {  // in order: each channel's sums are sequential
      const float norm = norms[b];
      if (!(norm > 0.0f) || !std::isfinite(norm)) continue;
      ++*count;
      *largest = std::max(*largest, norm);
      const __m512 nv = _mm512_set1_ps(norm);
      for (size_t c = 0; c < d; c += 16) {
        const __m512 u = _mm512_div_ps(_mm512_loadu_ps(xs[b] + c), nv);
        const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(u));
        const __m512d hi =
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1)));
        _mm512_storeu_pd(s1 + c, _mm512_add_pd(_mm512_loadu_pd(s1 + c), lo));
        _mm512_storeu_pd(s1 + c + 8, _mm512_add_pd(_mm512_loadu_pd(s1 + c + 8), hi));
        _mm512_storeu_pd(s2 + c, _mm512_add_pd(_mm512_loadu_pd(s2 + c), _mm512_mul_pd(lo, lo)));
        _mm512_storeu_pd(s2 + c + 8,
                         _mm512_add_pd(_mm512_loadu_pd(s2 + c + 8), _mm512_mul_pd(hi, hi)));
      }
    }
  }
}

void Decode(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
            size_t code_stride, size_t n, float* out, size_t out_stride) {
  if (!Vectorised(plan)) {
    return Avx2().decode(plan, norm_in, planes_in, code_stride, n, out, out_stride);
  }
  VecCoder c;
  InitVecCoder(plan, &c);
  alignas(64) float vbuf[kMaxDim];
  for (size_t k = 0; k < n; ++k) {
    c.decode(plan, c, norm_in + k * code_stride, planes_in + k * code_stride, vbuf,
             out + k * out_stride);
  }
}

// ---- split gather / scatter: vcompressps / vexpandps by 16 mask bits ----

// Mask bits of channels 16k.. (at most 16, none at or past d: the mask's bits there are clear).
inline uint32_t MaskBits16(const uint8_t* mask, size_t d, size_t k) {
  const size_t nbytes = (d + 7) / 8;
  uint32_t m = mask[2 * k];
  if (2 * k + 1 < nbytes) m |= static_cast<uint32_t>(mask[2 * k + 1]) << 8;
  return m;
}

// Masked stores and loads: no lane past a vector's channels is touched, so the kSplitSlack
// contract holds whatever the counts.
void SplitGather(const float* x, size_t x_stride, size_t n, const uint8_t* mask, size_t d,
                 float* out0, size_t m0, float* out1, size_t m1) {
  for (size_t i = 0; i < n; ++i) {
    const float* xv = x + i * x_stride;
    float* o0 = out0 + i * m0;
    float* o1 = out1 + i * m1;
    for (size_t c = 0; c < d; c += 16) {
      const __mmask16 valid = LowMask16(d - c);
      const __mmask16 k0 = static_cast<__mmask16>(MaskBits16(mask, d, c / 16));
      const __mmask16 k1 = static_cast<__mmask16>(~k0 & valid);
      const __m512 v = _mm512_maskz_loadu_ps(valid, xv + c);
      const int n0 = __builtin_popcount(k0), n1 = __builtin_popcount(k1);
      _mm512_mask_storeu_ps(o0, LowMask16(n0), _mm512_maskz_compress_ps(k0, v));
      _mm512_mask_storeu_ps(o1, LowMask16(n1), _mm512_maskz_compress_ps(k1, v));
      o0 += n0;
      o1 += n1;
    }
  }
}

void SplitScatter(const float* in0, size_t m0, const float* in1, size_t m1, size_t n,
                  const uint8_t* mask, size_t d, float* x, size_t x_stride) {
  for (size_t i = 0; i < n; ++i) {
    float* xv = x + i * x_stride;
    const float* i0 = in0 + i * m0;
    const float* i1 = in1 + i * m1;
    for (size_t c = 0; c < d; c += 16) {
      const __mmask16 valid = LowMask16(d - c);
      const __mmask16 k0 = static_cast<__mmask16>(MaskBits16(mask, d, c / 16));
      const __mmask16 k1 = static_cast<__mmask16>(~k0 & valid);
      const int n0 = __builtin_popcount(k0), n1 = __builtin_popcount(k1);
      const __m512 a = _mm512_maskz_loadu_ps(LowMask16(n0), i0);
      const __m512 b = _mm512_maskz_loadu_ps(LowMask16(n1), i1);
      const __m512 v = _mm512_mask_expand_ps(_mm512_maskz_expand_ps(k1, b), k0, a);
      _mm512_mask_storeu_ps(xv + c, valid, v);
      i0 += n0;
      i1 += n1;
    }
  }
}

// ---- split codecs fused per vector: gather, both subsets, scatter, all in L1 ----
//
// Vectors whose subsets this file does not handle (or d not a multiple of 16) take the AVX2
// table's split kernels.

constexpr size_t kMaxChunks = 32;  // fused route: d <= 512
constexpr size_t kSlack = 16;      // one whole register past a subset vector

struct SplitMap {
  size_t chunks = 0;
  __mmask16 k0[kMaxChunks], k1[kMaxChunks];
  uint32_t off0[kMaxChunks], off1[kMaxChunks];
  // Scatter: lane l of chunk k takes lane sidx[k][l] of (16 floats at off0, 16 floats at off1),
  // one vpermt2ps (two vexpandps cost more).
  alignas(64) int32_t sidx[kMaxChunks][16];
  // Gather: the lanes of subset 0 (then 1), ascending, first: one vpermps each, which Zen 4 runs
  // faster than vcompressps.
  alignas(64) int32_t gidx0[kMaxChunks][16];
  alignas(64) int32_t gidx1[kMaxChunks][16];
};

void InitSplitMap(const uint8_t* mask, size_t d, SplitMap* map) {
  map->chunks = d / 16;
  uint32_t o0 = 0, o1 = 0;
  for (size_t k = 0; k < map->chunks; ++k) {
    const uint32_t bits = MaskBits16(mask, d, k);
    map->k0[k] = static_cast<__mmask16>(bits);
    map->k1[k] = static_cast<__mmask16>(~bits);
    map->off0[k] = o0;
    map->off1[k] = o1;
    int32_t r0 = 0, r1 = 16;
    for (int l = 0; l < 16; ++l) {
      if ((bits >> l) & 1u) {
        map->gidx0[k][r0] = l;
        map->sidx[k][l] = r0++;
      } else {
        map->gidx1[k][r1 - 16] = l;
        map->sidx[k][l] = r1++;
      }
    }
    for (int l = r0; l < 16; ++l) map->gidx0[k][l] = 0;  // lanes past the subset's: any
    for (int l = r1 - 16; l < 16; ++l) map->gidx1[k][l] = 0;
    o0 += __builtin_popcount(bits);
    o1 += 16 - __builtin_popcount(bits);
  }
}

// Asks for the kNormBatch rows from `first` (of n, pitch bytes apart) that a block ahead will
// read: the hardware prefetcher alone left the gather waiting on memory.
inline void PrefetchRows(const uint8_t* src, size_t pitch, size_t first, size_t n, size_t bytes) {
  const size_t end = std::min(n, first + kNormBatch);
  for (size_t i = first; i < end; ++i) {
    const char* row = reinterpret_cast<const char*>(src + i * pitch);
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(row + o, _MM_HINT_T0);
  }
}

template <DType kT>
inline __m512 Load16AsFloat(const void* row, size_t c) {
  if constexpr (kT == DType::kF32) return _mm512_loadu_ps(static_cast<const float*>(row) + c);
  const __m256i h =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + c));
  if constexpr (kT == DType::kF16) return HalfToFloat16(h);
  return BF16ToFloat16(h);
}
template <DType kT>
inline void Store16FromFloat(void* row, size_t c, __m512 v) {
  if constexpr (kT == DType::kF32) {
    _mm512_storeu_ps(static_cast<float*>(row) + c, v);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(row) + c),
                        FloatTo16(v, kT == DType::kF16));
  }
}

// Whole registers are stored at the running positions; the lanes past the valid ones are
// overwritten by the next chunk or land in the slack.
template <DType kT>
inline void GatherVec(const SplitMap& map, const void* xv, float* out0, float* out1) {
  for (size_t k = 0; k < map.chunks; ++k) {
    const __m512 v = Load16AsFloat<kT>(xv, 16 * k);
    _mm512_storeu_ps(out0 + map.off0[k], _mm512_permutexvar_ps(_mm512_load_si512(map.gidx0[k]), v));
    _mm512_storeu_ps(out1 + map.off1[k], _mm512_permutexvar_ps(_mm512_load_si512(map.gidx1[k]), v));
  }
}

template <DType kT>
inline void ScatterVec(const SplitMap& map, const float* in0, const float* in1, void* xv) {
  for (size_t k = 0; k < map.chunks; ++k) {
    const __m512 a = _mm512_loadu_ps(in0 + map.off0[k]);
    const __m512 b = _mm512_loadu_ps(in1 + map.off1[k]);
    const __m512i idx = _mm512_load_si512(map.sidx[k]);
    Store16FromFloat<kT>(xv, 16 * k, _mm512_permutex2var_ps(a, idx, b));
  }
}

bool FusedRoute(const SplitPlan& sp) {
  const size_t d = sp.sub[0].dim + sp.sub[1].dim;
  return Vectorised(sp.sub[0]) && Vectorised(sp.sub[1]) && d % 16 == 0 && d / 16 <= kMaxChunks;
}

struct FusedSplit {
  VecCoder c[2];
  SplitMap map;
};

void InitFusedSplit(const SplitPlan& sp, const uint8_t* mask, FusedSplit* f) {
  InitVecCoder(sp.sub[0], &f->c[0]);
  InitVecCoder(sp.sub[1], &f->c[1]);
  InitSplitMap(mask, sp.sub[0].dim + sp.sub[1].dim, &f->map);
}

// kNormBatch vectors per step: block b + 1 is gathered before block b is encoded, so the gather's
// overlapping stores have reached L1 when the norms and the encoder load them (a load spanning
// stores still in flight waits for them), and the norms of a block's subset vectors interleave.
template <DType kT>
void SplitEncodeFused(const SplitPlan& sp, const void* x, size_t pitch, size_t n,
                      const uint8_t* mask, uint8_t* code, size_t code_stride) {
  FusedSplit f;
  InitFusedSplit(sp, mask, &f);
  const size_t m0 = sp.sub[0].dim, m1 = sp.sub[1].dim;
  const size_t vec = m0 + m1 + 2 * kSlack;  // one vector's two subsets, each with its slack
  const auto* src = static_cast<const uint8_t*>(x);
  alignas(64) float g[2][kNormBatch * (kMaxChunks * 16 + 2 * kSlack)];
  alignas(64) float z[kMaxDim];
  const auto gather = [&](size_t first, float* buf) {
    const size_t cnt = std::min(kNormBatch, n - first);
    PrefetchRows(src, pitch, first + 2 * kNormBatch, n, (m0 + m1) * DTypeSize(kT));
    for (size_t b = 0; b < cnt; ++b) {
      GatherVec<kT>(f.map, src + (first + b) * pitch, buf + b * vec, buf + b * vec + m0 + kSlack);
    }
  };
  gather(0, g[0]);
  for (size_t i0 = 0, blk = 0; i0 < n; i0 += kNormBatch, ++blk) {
    float* cur = g[blk & 1];
    if (i0 + kNormBatch < n) gather(i0 + kNormBatch, g[(blk & 1) ^ 1]);
    const size_t cnt = std::min(kNormBatch, n - i0);
    const float* x0[kNormBatch];
    const float* x1[kNormBatch];
    for (size_t b = 0; b < cnt; ++b) {
      x0[b] = cur + b * vec;
      x1[b] = cur + b * vec + m0 + kSlack;
    }
    float n0[kNormBatch], n1[kNormBatch];
    Norms(x0, cnt, m0, n0);
    Norms(x1, cnt, m1, n1);
    for (size_t b = 0; b < cnt; ++b) {
      uint8_t* c = code + (i0 + b) * code_stride;
      f.c[0].encode(sp.sub[0], f.c[0], x0[b], n0[b], z, c + sp.norm_offset[0],
                    c + sp.planes_offset[0]);
      f.c[1].encode(sp.sub[1], f.c[1], x1[b], n1[b], z, c + sp.norm_offset[1],
                    c + sp.planes_offset[1]);
    }
  }
}

template <DType kT>
void SplitDecodeFused(const SplitPlan& sp, const uint8_t* code, size_t code_stride, size_t n,
                      const uint8_t* mask, void* x, size_t pitch) {
  FusedSplit f;
  InitFusedSplit(sp, mask, &f);
  const VecCoder& c0 = f.c[0];
  const VecCoder& c1 = f.c[1];
  auto* dst = static_cast<uint8_t*>(x);
  // Vector i is scattered after vector i + 1 is decoded: the scatter's unaligned loads span the
  // inverse rotation's stores.
  alignas(64) float v[kMaxDim];
  alignas(64) float g0[2][kMaxDim + kSlack];
  alignas(64) float g1[2][kMaxDim + kSlack];
  for (size_t i = 0; i < n; ++i) {
    const size_t cur = i & 1;
    const uint8_t* c = code + i * code_stride;
    c0.decode(sp.sub[0], c0, c + sp.norm_offset[0], c + sp.planes_offset[0], v, g0[cur]);
    c1.decode(sp.sub[1], c1, c + sp.norm_offset[1], c + sp.planes_offset[1], v, g1[cur]);
    if (i > 0) ScatterVec<kT>(f.map, g0[cur ^ 1], g1[cur ^ 1], dst + (i - 1) * pitch);
  }
  ScatterVec<kT>(f.map, g0[(n - 1) & 1], g1[(n - 1) & 1], dst + (n - 1) * pitch);
}

void SplitEncode(const SplitPlan& sp, const void* x, DType dtype, size_t x_stride, size_t n,
                 const uint8_t* mask, uint8_t* code, size_t code_stride) {
  const size_t pitch = x_stride * DTypeSize(dtype);
  if (n == 0) return;
  if (FusedRoute(sp)) {
    switch (dtype) {
      case DType::kF16:
        return SplitEncodeFused<DType::kF16>(sp, x, pitch, n, mask, code, code_stride);
      case DType::kBF16:
        return SplitEncodeFused<DType::kBF16>(sp, x, pitch, n, mask, code, code_stride);
      case DType::kF32:
        return SplitEncodeFused<DType::kF32>(sp, x, pitch, n, mask, code, code_stride);
    }
  }
  Avx2().split_encode(sp, x, dtype, x_stride, n, mask, code, code_stride);
}

void SplitDecode(const SplitPlan& sp, const uint8_t* code, size_t code_stride, size_t n,
                 const uint8_t* mask, void* x, DType dtype, size_t x_stride) {
  const size_t pitch = x_stride * DTypeSize(dtype);
  if (n == 0) return;
  if (FusedRoute(sp)) {
    switch (dtype) {
      case DType::kF16:
        return SplitDecodeFused<DType::kF16>(sp, code, code_stride, n, mask, x, pitch);
      case DType::kBF16:
        return SplitDecodeFused<DType::kBF16>(sp, code, code_stride, n, mask, x, pitch);
      case DType::kF32:
        return SplitDecodeFused<DType::kF32>(sp, code, code_stride, n, mask, x, pitch);
    }
  }
  Avx2().split_decode(sp, code, code_stride, n, mask, x, dtype, x_stride);
}

// ---- encode / decode with the dtype conversion fused ----

// Blocks of kNormBatch vectors are converted into an L1 buffer, then normed and encoded as by
// Encode: the input is read once, while the previous block's arithmetic runs.
template <DType kT>
void EncodeFromT(const SubsetPlan& plan, const uint8_t* src, size_t pitch, size_t n,
                 uint8_t* norm_out, uint8_t* planes_out, size_t code_stride) {
  VecCoder c;
  InitVecCoder(plan, &c);
  const size_t m = plan.dim;
  alignas(64) float z[kMaxDim];
  alignas(64) float xb[kNormBatch][kMaxDim];
  for (size_t v0 = 0; v0 < n; v0 += kNormBatch) {
    const size_t cnt = std::min(kNormBatch, n - v0);
    const float* xs[kNormBatch];
    float norms[kNormBatch];
    PrefetchRows(src, pitch, v0 + 2 * kNormBatch, n, m * DTypeSize(kT));
    for (size_t b = 0; b < cnt; ++b) {
      const uint8_t* row = src + (v0 + b) * pitch;
      for (size_t j = 0; j < m; j += 16) _mm512_store_ps(xb[b] + j, Load16AsFloat<kT>(row, j));
      xs[b] = xb[b];
    }
    Norms(xs, cnt, m, norms);
    for (size_t b = 0; b < cnt; ++b) {
      const size_t v = v0 + b;
      c.encode(plan, c, xs[b], norms[b], z, norm_out + v * code_stride,
               planes_out + v * code_stride);
    }
  }
}

void EncodeFrom(const SubsetPlan& plan, const void* x, DType dtype, size_t x_stride, size_t n,
                uint8_t* norm_out, uint8_t* planes_out, size_t code_stride) {
  const auto* src = static_cast<const uint8_t*>(x);
  const size_t pitch = x_stride * DTypeSize(dtype);
  if (Vectorised(plan)) {
    switch (dtype) {
      case DType::kF32:
        return Encode(plan, static_cast<const float*>(x), x_stride, n, norm_out, planes_out,
                      code_stride);
      case DType::kF16:
        return EncodeFromT<DType::kF16>(plan, src, pitch, n, norm_out, planes_out, code_stride);
      case DType::kBF16:
        return EncodeFromT<DType::kBF16>(plan, src, pitch, n, norm_out, planes_out, code_stride);
    }
  }
  EncodeFrom(Avx2(), plan, x, dtype, x_stride, n, norm_out, planes_out, code_stride);
}

void DecodeTo(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
              size_t code_stride, size_t n, const float* mean, const float* scale, void* out,
              DType dtype, size_t out_stride) {
  const bool known = dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
  if (!Vectorised(plan) || !known) {
    return DecodeTo(Avx2(), plan, norm_in, planes_in, code_stride, n, mean, scale, out, dtype,
                    out_stride);
  }
  VecCoder c;
  InitVecCoder(plan, &c);
  auto* dst = static_cast<uint8_t*>(out);
  const size_t pitch = out_stride * DTypeSize(dtype);
  alignas(64) float vbuf[kMaxDim];
  alignas(64) float obuf[kMaxDim];
  for (size_t k = 0; k < n; ++k) {
    c.decode_to(plan, c, norm_in + k * code_stride, planes_in + k * code_stride, vbuf, obuf, mean,
                mean != nullptr ? scale[k] : 0.0f, dst + k * pitch, dtype);
  }
}

// ---- channel energy and mean-removed keys ----

template <DType kT>
inline __m256 Load8AsFloat(const uint8_t* row, size_t c) {
  if constexpr (kT == DType::kF32) return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c));
  if constexpr (kT == DType::kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// energy[c] += double(x)^2 per vector in order; kRows vectors per pass over the accumulators,
// each channel's adds still one vector after the other.
template <DType kT, int kRows>
inline void EnergyRows(const uint8_t* rows, size_t pitch, size_t d, double* energy) {
  for (size_t c = 0; c < d; c += 8) {
    __m512d acc = _mm512_loadu_pd(energy + c);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512d v = _mm512_cvtps_pd(Load8AsFloat<kT>(rows + r * pitch, c));
      acc = _mm512_add_pd(acc, _mm512_mul_pd(v, v));
    }
    _mm512_storeu_pd(energy + c, acc);
  }
}

// d = 8 kBlocks channels: the sums stay in registers for all n vectors.
template <DType kT, int kBlocks>
void EnergyInRegs(const uint8_t* src, size_t n, size_t pitch, double* energy) {
  __m512d acc[kBlocks];
#pragma GCC unroll 16
  for (int b = 0; b < kBlocks; ++b) acc[b] = _mm512_loadu_pd(energy + 8 * b);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* row = src + i * pitch;
#pragma GCC unroll 16
    for (int b = 0; b < kBlocks; ++b) {
      const __m512d v = _mm512_cvtps_pd(Load8AsFloat<kT>(row, 8 * b));
      acc[b] = _mm512_add_pd(acc[b], _mm512_mul_pd(v, v));
    }
  }
#pragma GCC unroll 16
  for (int b = 0; b < kBlocks; ++b) _mm512_storeu_pd(energy + 8 * b, acc[b]);
}

template <DType kT>
void ChannelEnergyT(const uint8_t* src, size_t n, size_t pitch, size_t d, double* energy) {
  if (d == 128) return EnergyInRegs<kT, 16>(src, n, pitch, energy);
  if (d == 64) return EnergyInRegs<kT, 8>(src, n, pitch, energy);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) EnergyRows<kT, 4>(src + i * pitch, pitch, d, energy);
  for (; i < n; ++i) EnergyRows<kT, 1>(src + i * pitch, pitch, d, energy);
}

void ChannelEnergy(const void* x, DType dtype, size_t n, size_t stride, size_t d,
                   double* energy) {
  const auto* src = static_cast<const uint8_t*>(x);
  const size_t pitch = stride * DTypeSize(dtype);
  if (d % 8 != 0) return Avx2().channel_energy(x, dtype, n, stride, d, energy);
  switch (dtype) {
    case DType::kF16:
      return ChannelEnergyT<DType::kF16>(src, n, pitch, d, energy);
    case DType::kBF16:
      return ChannelEnergyT<DType::kBF16>(src, n, pitch, d, energy);
    case DType::kF32:
      return ChannelEnergyT<DType::kF32>(src, n, pitch, d, energy);
  }
  Avx2().channel_energy(x, dtype, n, stride, d, energy);
}

// mul then add, never an fma: the reference rounds the product first. The tail is masked.
void AddScaled(const float* mean, const float* scale, size_t n, size_t d, float* x,
               size_t x_stride) {
  for (size_t i = 0; i < n; ++i) {
    float* xv = x + i * x_stride;
    const __m512 a = _mm512_set1_ps(scale[i]);
    for (size_t j = 0; j < d; j += 16) {
      const __mmask16 k = LowMask16(d - j);
      const __m512 p = _mm512_mul_ps(a, _mm512_maskz_loadu_ps(k, mean + j));
      _mm512_mask_storeu_ps(xv + j, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, xv + j), p));
    }
  }
}

// The transform codec's assembly: gathers 16 lanes at a time (the tail masked); mul, mul, add.
void GatherAffine(const float* row, size_t row_stride, const uint32_t* from, const float* a,
                  const float* b, const float* norms, size_t n, size_t d, float* out,
                  size_t out_stride) {
  for (size_t i = 0; i < n; ++i) {
    const float* r = row + i * row_stride;
    float* o = out + i * out_stride;
    const __m512 nv = _mm512_set1_ps(norms[i]);
    for (size_t c = 0; c < d; c += 16) {
      const __mmask16 k = LowMask16(d - c);
      const __m512i idx = _mm512_maskz_loadu_epi32(k, from + c);
      const __m512 g = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, idx, r, 4);
      const __m512 base = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, a + c), nv);
      const __m512 step = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, b + c), g);
      _mm512_mask_storeu_ps(o + c, k, _mm512_add_ps(base, step));
    }
  }
}

}  // namespace

namespace internal {
#if TQKV_AVX512_FMA_STAGE8
const KernelTable& Avx512FmaStage8Table() {
  static const KernelTable table{"avx512-fma8", ToF32, FromF32, Encode, Decode, SplitGather,
#else
const KernelTable& Avx512Table() {
  static const KernelTable table{"avx512", ToF32, FromF32, Encode, Decode, SplitGather,
#endif
                                 SplitScatter, SplitEncode, SplitDecode, ChannelEnergy,
                                 AddScaled, EncodeFrom, DecodeTo, GatherAffine,
                                 internal::Avx512Dequantize, internal::Avx512TransformAssemble,
                                 internal::Avx512TransformDecode, EncodeUnit, Whiten,
                                 UnitMoments};
  return table;
}
}  // namespace internal

}  // namespace tqkv::kernels
