// AVX-512 (F, BW, VL, DQ) kernels. Every result is bit-identical to ref.cc: the operations and
// their order are the reference's (kernels.h), 16 lanes at a time. What pays here is fewer
// instructions, not wider arithmetic (Zen 4 runs 512-bit float ops as two 256-bit halves):
// quantization is a binary search whose compare masks are the bit planes themselves, centroid
// look-ups are one vpermps/vpermi2ps, bit planes unpack with one masked byte add per plane, and
// split_gather / split_scatter move channels with vcompressps/vexpandps. The rotations, the split
// codecs' fused route and the per-vector loops are the shared templates (simd_*.h) at 16 lanes.
// Shapes not handled here (Haar rotations, more than 5 bits, dims not a multiple of 16) go to the
// AVX2 table, which the CPU also runs. The file is built twice: as is (the `avx512` table) and
// with TQKV_AVX512_FMA_STAGE8 (avx512_fma8_kernels_avx512.cc, the `avx512-fma8` table), which
// differ only in one instruction choice of the FWHT; dispatch.cc picks one per CPU vendor.
#include <immintrin.h>
// gcc 12's AVX-512 intrinsics pass _mm512_undefined_*() as the unused merge operand, which its own
// -Wuninitialized flags once inlined; the operand is never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // gcc's own group
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

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
#include "codec/kernels/simd_rotation.h"
#include "codec/kernels/simd_split.h"
#include "codec/kernels/simd_vectors.h"

#ifndef TQKV_AVX512_FMA_STAGE8
#define TQKV_AVX512_FMA_STAGE8 0
#endif

namespace tqkv::kernels {
namespace {

using L = avx512::Lanes<TQKV_AVX512_FMA_STAGE8 != 0>;

const KernelTable& Avx2() { return internal::Avx2Table(); }

using avx512::FloatTo16;
using avx512::LowMask16;
using internal::LoadNorm;
using internal::Unroll;
using simd::ForwardFn;
using simd::InverseFn;
using simd::kMaxDim;
using simd::kNormBatch;

// ---- element conversions: 16 lanes, the tail under a mask ----

inline __m512 HalfOrBF16ToFloat(__m256i h, bool f16) {
  return f16 ? _mm512_cvtph_ps(h)
             : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
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
    _mm512_storeu_ps(dst + i, HalfOrBF16ToFloat(h, f16));
  }
  if (i < n) {
    const __mmask16 k = LowMask16(n - i);
    _mm512_mask_storeu_ps(dst + i, k, HalfOrBF16ToFloat(_mm256_maskz_loadu_epi16(k, s + i), f16));
  }
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
        csum = L::AddSquares(csum, c);
      }
    }
#pragma GCC unroll 8
    for (int p = 0; p < kBits; ++p) StoreBytes(planes + p * pb + j0 / 8, 2 * regs, words[p]);
  }
  return plan.norm_correction ? L::Reduce(csum) : 0.0f;
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


struct VecCoder;
// One vector to out as dtype, key means added first (mean null: none; a = scale * mean). vbuf,
// obuf: aligned scratch.
using DecodeToFn = void (*)(const SubsetPlan&, const VecCoder&, const uint8_t* norm_in,
                            const uint8_t* planes, float* vbuf, float* obuf, const float* mean,
                            float scale, void* out, DType dtype);

// One subset's per-call state (simd_split.h); forward is the route through memory (Kronecker,
// Hadamard beyond 256).
struct VecCoder : simd::VecCoderBase<VecCoder, Tables, ForwardFn, InverseFn> {
  DecodeToFn decode_to;
};


template <int kBits>
void EncodeVecGeneric(const SubsetPlan& plan, const VecCoder& c, const float* xv, float norm,
                      float* z, uint8_t* norm_out, uint8_t* planes) {
  if (simd::EncodeDegenerate(plan, norm, norm_out, planes)) return;
  c.forward(plan, xv, plan.enc_scale / norm, z);
  simd::StoreEncodedNorm<L>(plan, norm, QuantizePack<kBits>(plan, c.t, z, planes), norm_out);
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
      csum = L::AddSquares(csum, cv);
    }
    if constexpr (r % 4 == 3 || r == N - 1) {  // four registers make 8 bytes of each plane
#pragma GCC unroll 8
      for (int p = 0; p < kBits; ++p) {
        StoreBytes(planes + p * kPb + 8 * (r / 4), 2 * (r % 4 + 1), words[p]);
        words[p] = 0;
      }
    }
  });
  return plan.norm_correction ? L::Reduce(csum) : 0.0f;
}

// Hadamard kinds with m = 16 R: rotation, scale and quantization without leaving the registers.
template <int kBits, int R, int kTwo>
void EncodeVecHadamard(const SubsetPlan& plan, const VecCoder& c, const float* xv, float norm,
                       float*, uint8_t* norm_out, uint8_t* planes) {
  if (simd::EncodeDegenerate(plan, norm, norm_out, planes)) return;
  __m512 v[R];
  simd::HadamardRegs<L, R, kTwo>(plan, xv, v);
  const __m512 s = _mm512_set1_ps(plan.enc_scale / norm);
  const float csum = QuantizeRegs<kBits, R>(plan, c, v, s, planes);
  simd::StoreEncodedNorm<L>(plan, norm, csum, norm_out);
}

// Kronecker with q = kQ blocks of B = 16 R (q R <= 16 registers): the blocks' signed FWHTs, the
// q x q mix (KronMix's fmas in order), scale and quantization in registers.
template <int kBits, int R, int kQ>
void EncodeVecKron(const SubsetPlan& plan, const VecCoder& c, const float* xv, float norm, float*,
                   uint8_t* norm_out, uint8_t* planes) {
  if (simd::EncodeDegenerate(plan, norm, norm_out, planes)) return;
  constexpr int N = kQ * R;
  __m512 v[N];
  simd::KronRegs<L, R, kQ>(plan, xv, [&](int a, const __m512* acc) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) v[a * R + r] = acc[r];
  });
  // One multiply by enc_scale / norm, as KronForward's.
  const __m512 s = _mm512_set1_ps(plan.enc_scale / norm);
  const float csum = QuantizeRegs<kBits, N>(plan, c, v, s, planes);
  simd::StoreEncodedNorm<L>(plan, norm, csum, norm_out);
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
  simd::FwhtRegs<L, R>(v);
  if (plan.rotation == RotationKind::kHadamard2) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) v[r] = _mm512_mul_ps(v[r], _mm512_loadu_ps(plan.signs2 + 16 * r));
    simd::FwhtRegs<L, R>(v);
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
    simd::FwhtRegs<L, R>(acc);
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
  c->forward = simd::PickForwardFn<L>(p);
  c->inverse = simd::PickInverseFn<L>(p);
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
    simd::Norms<L>(xs, cnt, plan.dim, norms);
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
  simd::Whiten<L>(x, x_stride, n, d, channel, mean, scale, rows, norms, w, w_stride);
}

void UnitMoments(const float* x, size_t x_stride, size_t n, size_t d, double* s1, double* s2,
                 size_t* count, float* largest) {
  if (d % 16 != 0) return Avx2().unit_moments(x, x_stride, n, d, s1, s2, count, largest);
  simd::UnitMoments<L>(x, x_stride, n, d, s1, s2, count, largest);
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

// ---- split codecs fused per vector (simd_split.h); the rest to the AVX2 table ----

struct Coders {
  using L = ::tqkv::kernels::L;
  using VecCoder = ::tqkv::kernels::VecCoder;
  static void Init(const SubsetPlan& p, VecCoder* c) { InitVecCoder(p, c); }
  static bool Fusable(const SubsetPlan& p) { return Vectorised(p); }
};

void SplitEncode(const SplitPlan& sp, const void* x, DType dtype, size_t x_stride, size_t n,
                 const uint8_t* mask, uint8_t* code, size_t code_stride) {
  if (simd::SplitEncode<Coders>(sp, x, dtype, x_stride, n, mask, code, code_stride)) return;
  Avx2().split_encode(sp, x, dtype, x_stride, n, mask, code, code_stride);
}

void SplitDecode(const SplitPlan& sp, const uint8_t* code, size_t code_stride, size_t n,
                 const uint8_t* mask, void* x, DType dtype, size_t x_stride) {
  if (simd::SplitDecode<Coders>(sp, code, code_stride, n, mask, x, dtype, x_stride)) return;
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
    simd::PrefetchRows(src, pitch, v0 + 2 * kNormBatch, n, m * DTypeSize(kT));
    for (size_t b = 0; b < cnt; ++b) {
      const uint8_t* row = src + (v0 + b) * pitch;
      for (size_t j = 0; j < m; j += 16) L::StoreA(xb[b] + j, L::LoadAs<kT>(row, j));
      xs[b] = xb[b];
    }
    simd::Norms<L>(xs, cnt, m, norms);
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


// ---- channel energy, mean-removed keys, the transform codec's assembly ----

void ChannelEnergy(const void* x, DType dtype, size_t n, size_t stride, size_t d,
                   double* energy) {
  simd::ChannelEnergy<L>(Avx2(), x, dtype, n, stride, d, energy);
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
                                 simd::AddScaled<L>, EncodeFrom, DecodeTo, GatherAffine,
                                 internal::Avx512Dequantize, internal::Avx512TransformAssemble,
                                 internal::Avx512TransformDecode, EncodeUnit, Whiten,
                                 UnitMoments};
  return table;
}
}  // namespace internal

}  // namespace tqkv::kernels
