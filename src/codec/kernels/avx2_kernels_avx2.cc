// AVX2 + FMA + F16C kernels. Every result is bit-identical to ref.cc: same operations in the same
// order, only several lanes at a time.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

// Built with -mf16c: the norm helpers of internal.h convert in hardware.
#define TQKV_KERNELS_F16C 1
#include "codec/kernels/avx2_common.h"
#include "codec/kernels/internal.h"
#include "codec/kernels/kernels.h"

namespace tqkv::kernels {
namespace {

using avx2::FloatToBF16x8;

void ToF32(const void* src, DType dtype, size_t n, float* dst) {
  size_t i = 0;
  if (dtype == DType::kF32) {
    std::memmove(dst, src, n * sizeof(float));
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  if (dtype == DType::kF16) {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
    }
  }
  ScalarKernels().to_f32(s + i, dtype, n - i, dst + i);
}

void FromF32(const float* src, size_t n, DType dtype, void* dst) {
  size_t i = 0;
  if (dtype == DType::kF32) {
    std::memmove(dst, src, n * sizeof(float));
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  if (dtype == DType::kF16) {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), FloatToBF16x8(_mm256_loadu_ps(src + i)));
    }
  }
  ScalarKernels().from_f32(src + i, n - i, dtype, d + i);
}

// ---- encode / decode ----
//
// Shapes handled here: dim a multiple of 8 up to kMaxDim (Hadamard kinds also need a power of two).
// Each vector goes load -> norm -> rotate -> scale -> quantize -> pack through 32-byte aligned
// stack buffers, so everything stays in registers or L1.

constexpr size_t kMaxDim = 1024;

bool Vectorised(const SubsetPlan& p) {
  if (p.dim == 0 || p.dim % 8 != 0 || p.dim > kMaxDim || p.bits < 1 || p.bits > 8) return false;
  if (p.rotation == RotationKind::kHaar) return p.haar != nullptr && p.haar_t != nullptr;
  if (p.rotation == RotationKind::kKronecker) {  // dim % 8 == 0, so B >= 8: whole registers
    return p.haar != nullptr && p.haar_t != nullptr && p.signs1 != nullptr && p.block != 0 &&
           p.dim % p.block == 0;
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

// Sum8 of m floats at an aligned or unaligned pointer, m a multiple of 8: lane k takes i % 8 == k.
inline float Sum8Squares(const float* v, size_t m) {
  __m256 acc = _mm256_setzero_ps();
  for (size_t i = 0; i < m; i += 8) {
    const __m256 x = _mm256_loadu_ps(v + i);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(x, x));
  }
  return ReduceSum8(acc);
}

// In-register FWHT stages h = 1, 2, 4. For lane i the reference computes a + b (low) or a - b
// (high); here fma(self, +-1, partner): the product is exact, so one rounding of b + a or a + (-b),
// which equal a + b and a - b bit for bit (NaN payloads aside).
[[gnu::always_inline]] inline __m256 FwhtIn8(__m256 x) {
  const __m256 s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
  const __m256 s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
  const __m256 s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
  x = _mm256_fmadd_ps(x, s1, _mm256_permute_ps(x, 0xB1));
  x = _mm256_fmadd_ps(x, s2, _mm256_permute_ps(x, 0x4E));
  x = _mm256_fmadd_ps(x, s4, _mm256_permute2f128_ps(x, x, 0x01));
  return x;
}

// Unnormalised FWHT of 8 * R floats held as R registers. Beyond 8 registers: both halves first,
// then the last stage across them. Every element sees the same operations in the same order as
// stage by stage, and working on 8 registers at a time spills far less.
// Always inlined: as a call, the registers would go through memory (GCC stops inlining the
// recursive instances once several callers use them).
template <int R>
[[gnu::always_inline]] inline void FwhtRegs(__m256* x) {
  if constexpr (R > 8) {
    FwhtRegs<R / 2>(x);
    FwhtRegs<R / 2>(x + R / 2);
#pragma GCC unroll 64
    for (int r = 0; r < R / 2; ++r) {
      const __m256 a = x[r], b = x[r + R / 2];
      x[r] = _mm256_add_ps(a, b);
      x[r + R / 2] = _mm256_sub_ps(a, b);
    }
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) x[r] = FwhtIn8(x[r]);
#pragma GCC unroll 8
    for (int k = 1; k < R; k <<= 1) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        if (r & k) continue;
        const __m256 a = x[r], b = x[r + k];
        x[r] = _mm256_add_ps(a, b);
        x[r + k] = _mm256_sub_ps(a, b);
      }
    }
  }
}

// Per-call constants. Up to 5 bits every threshold is compared; beyond, a coarse count over every
// group-th threshold (15 compares) picks a group, then a binary search with gathers finishes it.
constexpr int GroupShift(int bits) { return bits > 5 ? bits - 4 : 0; }
constexpr int CoarseCount(int bits) { return bits > 5 ? 15 : (1 << bits) - 1; }

struct Tables {
  alignas(32) float coarse[31][8];  // broadcast thresholds t[group * k + group - 1]
  __m256 cent[4];                   // centroids 0..31 (used up to 5 bits)
  __m256 thr[2];                    // thresholds 0..14 (binary search at 3 and 4 bits)
  __m256 fine5[3];                  // 5 bits: lane g of fine5[k] = threshold 4g + k
};

// Eight lanes built in registers (scalar stores followed by a vector load of the same bytes
// would wait for the stores: no store-to-load forwarding across sizes).
template <typename At>
inline __m256 Lanes(At&& at) {
  return _mm256_setr_ps(at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7));
}

void InitTables(const SubsetPlan& p, Tables* t) {
  const int bits = static_cast<int>(p.bits);
  const uint32_t group = 1u << GroupShift(bits);
  for (int k = 0; k < CoarseCount(bits); ++k) {
    _mm256_store_ps(t->coarse[k], _mm256_set1_ps(p.thresholds[group * k + group - 1]));
  }
  const uint32_t nc = p.bits <= 5 ? (1u << p.bits) : 0;
  for (uint32_t r = 0; r < 4; ++r) {
    t->cent[r] = Lanes([&](uint32_t l) { return 8 * r + l < nc ? p.centroids[8 * r + l] : 0.0f; });
  }
  const uint32_t nt = p.bits <= 4 ? (1u << p.bits) - 1 : 0;
  for (uint32_t r = 0; r < 2; ++r) {
    t->thr[r] = Lanes([&](uint32_t l) { return 8 * r + l < nt ? p.thresholds[8 * r + l] : 0.0f; });
  }
  for (uint32_t k = 0; k < 3; ++k) {
    t->fine5[k] = Lanes([&](uint32_t g) { return p.bits == 5 ? p.thresholds[4 * g + k] : 0.0f; });
  }
}

// Index of each lane of 4 registers: the number of thresholds strictly below z (ordered compares,
// so NaN counts 0). Thresholds ascend, so with count = c the coarse compares give c / group and
// the search within the group gives c % group: the same answer as counting all of them. Four
// registers at once keep several gathers in flight.
template <int kBits>
inline void Quantize4x8(const SubsetPlan& p, const Tables& t, const __m256* z, __m256i* idx) {
  if constexpr (kBits == 5) {
    // count = 4g + f: g = #{j < 7 : t[4j + 3] < z} is count / 4, then f = #{k < 3 : t[4g + k] < z}
    // with the group's three thresholds permuted into the lanes (25 ops a register, not 62).
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      __m256i g = _mm256_setzero_si256();
#pragma GCC unroll 7
      for (int j = 0; j < 7; ++j) {
        const __m256 tj = _mm256_load_ps(t.coarse[4 * j + 3]);
        g = _mm256_sub_epi32(g, _mm256_castps_si256(_mm256_cmp_ps(tj, z[r], _CMP_LT_OQ)));
      }
      __m256i f = _mm256_slli_epi32(g, 2);
#pragma GCC unroll 3
      for (int k = 0; k < 3; ++k) {
        const __m256 tv = _mm256_permutevar8x32_ps(t.fine5[k], g);
        f = _mm256_sub_epi32(f, _mm256_castps_si256(_mm256_cmp_ps(tv, z[r], _CMP_LT_OQ)));
      }
      idx[r] = f;
    }
    return;
  }
  if constexpr (kBits >= 3 && kBits <= 4) {
    // Binary search with the thresholds in registers: fewer ops than 7 or 15 compares.
    // The first probe is one broadcast threshold; at 4 bits its outcome also picks the register
    // (thresholds 0-7 or 8-14) for the later probes.
    constexpr int kTop = 1 << (kBits - 1);
    const __m256 first = _mm256_load_ps(t.coarse[kTop - 1]);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m256 hi = _mm256_cmp_ps(first, z[r], _CMP_LT_OQ);
      __m256i ix = _mm256_and_si256(_mm256_castps_si256(hi), _mm256_set1_epi32(kTop));
#pragma GCC unroll 4
      for (int step = kTop / 2; step > 0; step /= 2) {
        const __m256i probe = _mm256_add_epi32(ix, _mm256_set1_epi32(step - 1));
        __m256 tv = _mm256_permutevar8x32_ps(t.thr[0], probe);
        if constexpr (kBits == 4) {
          tv = _mm256_blendv_ps(tv, _mm256_permutevar8x32_ps(t.thr[1], probe), hi);
        }
        const __m256 lt = _mm256_cmp_ps(tv, z[r], _CMP_LT_OQ);
        ix = _mm256_add_epi32(ix,
                              _mm256_and_si256(_mm256_castps_si256(lt), _mm256_set1_epi32(step)));
      }
      idx[r] = ix;
    }
    return;
  }
  constexpr int kShift = GroupShift(kBits);
  constexpr int kCoarse = CoarseCount(kBits);
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) idx[r] = _mm256_setzero_si256();
#pragma GCC unroll 31
  for (int k = 0; k < kCoarse; ++k) {
    const __m256 tk = _mm256_load_ps(t.coarse[k]);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      idx[r] = _mm256_sub_epi32(idx[r], _mm256_castps_si256(_mm256_cmp_ps(tk, z[r], _CMP_LT_OQ)));
    }
  }
  if constexpr (kShift > 0) {
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) idx[r] = _mm256_slli_epi32(idx[r], kShift);
#pragma GCC unroll 4
    for (int step = 1 << (kShift - 1); step > 0; step >>= 1) {
      const __m256i stepv = _mm256_set1_epi32(step);
      const __m256i step_m1 = _mm256_set1_epi32(step - 1);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        // Is t[idx + step - 1] below z? Then at least idx + step thresholds are.
        const __m256i probe = _mm256_add_epi32(idx[r], step_m1);
        const __m256 tv = _mm256_i32gather_ps(p.thresholds, probe, 4);
        const __m256 lt = _mm256_cmp_ps(tv, z[r], _CMP_LT_OQ);
        idx[r] = _mm256_add_epi32(idx[r], _mm256_and_si256(_mm256_castps_si256(lt), stepv));
      }
    }
  }
}

// Centroid of each lane: register permutes from cent[] up to 5 bits, a gather beyond.
template <int kBits>
inline __m256 Lookup8(const SubsetPlan& p, const __m256* cent, __m256i idx) {
  if constexpr (kBits <= 3) {
    return _mm256_permutevar8x32_ps(cent[0], idx);
  } else if constexpr (kBits == 4) {
    const __m256 bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(cent[0], idx),
                            _mm256_permutevar8x32_ps(cent[1], idx), bit3);
  } else if constexpr (kBits == 5) {
    const __m256 bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
    const __m256 bit4 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 27));
    const __m256 lo = _mm256_blendv_ps(_mm256_permutevar8x32_ps(cent[0], idx),
                                       _mm256_permutevar8x32_ps(cent[1], idx), bit3);
    const __m256 hi = _mm256_blendv_ps(_mm256_permutevar8x32_ps(cent[2], idx),
                                       _mm256_permutevar8x32_ps(cent[3], idx), bit3);
    return _mm256_blendv_ps(lo, hi, bit4);
  } else {
    return _mm256_i32gather_ps(p.centroids, idx, 4);
  }
}

// Four registers of int32 indices (0..255) -> 32 bytes in lane order.
inline __m256i PackIdx32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b);  // a0-3 b0-3 | a4-7 b4-7
  const __m256i cd = _mm256_packs_epi32(c, d);
  const __m256i abcd = _mm256_packus_epi16(ab, cd);  // a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 ...
  return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Up to 4 plane bytes as one word. The common full case is one load; the tail is assembled in a
// register (byte stores followed by a wide load would stall store-to-load forwarding).
inline uint32_t LoadPlaneWord(const uint8_t* src, size_t nbytes) {
  uint32_t w = 0;
  if (nbytes == 4) {
    std::memcpy(&w, src, 4);
    return w;
  }
  for (size_t b = 0; b < nbytes; ++b) w |= static_cast<uint32_t>(src[b]) << (8 * b);
  return w;
}

inline void StorePlaneWord(uint8_t* dst, size_t nbytes, uint32_t w) {
  if (nbytes == 4) {
    std::memcpy(dst, &w, 4);
    return;
  }
  for (size_t b = 0; b < nbytes; ++b) dst[b] = static_cast<uint8_t>(w >> (8 * b));
}

// Bit planes of m indices (m a multiple of 8; idx padded with zeros to a multiple of 32).
template <int kBits>
inline void PackPlanesFromBytes(const uint8_t* idx, size_t m, uint8_t* planes) {
  const size_t pb = m / 8;
  for (size_t c = 0; c < m; c += 32) {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(idx + c));
    const size_t nbytes = std::min<size_t>(4, pb - c / 8);
#pragma GCC unroll 8
    for (int p = 0; p < kBits; ++p) {
      // Bit p of every byte to bit 7 of that byte (16-bit shift: bit p of the high byte lands on
      // 15).
      const uint32_t mask =
          static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_slli_epi16(v, 7 - p)));
      StorePlaneWord(planes + p * pb + c / 8, nbytes, mask);
    }
  }
}

// Inverse: 32 indices per step, a byte shuffle spreads plane byte j / 8 to byte j.
template <int kBits>
inline void UnpackPlanesToBytes(const uint8_t* planes, size_t m, uint8_t* idx) {
  const size_t pb = m / 8;
  const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                       2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  for (size_t c = 0; c < m; c += 32) {
    const size_t nbytes = std::min<size_t>(4, pb - c / 8);
    __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int p = 0; p < kBits; ++p) {
      const uint32_t w = LoadPlaneWord(planes + p * pb + c / 8, nbytes);
      const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(w)), sel);
      const __m256i on = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
      acc = _mm256_or_si256(acc, _mm256_and_si256(on, _mm256_set1_epi8(static_cast<char>(1 << p))));
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(idx + c), acc);
  }
}

using internal::LoadNorm;
using internal::StoreNorm;

// y = M x with mt = M^T row-major (column i of M at mt + i * m); fma per column, columns in order.
// Blocks of 64 outputs keep the accumulators in registers; blocking does not change any lane's
// order.
void MatVecT(const float* mt, const float* x, size_t m, float* y) {
  size_t j0 = 0;
  for (; j0 + 64 <= m; j0 += 64) {
    __m256 acc[8];
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
    for (size_t i = 0; i < m; ++i) {
      const __m256 xi = _mm256_broadcast_ss(x + i);
      const float* row = mt + i * m + j0;
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r)
        acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(row + 8 * r), xi, acc[r]);
    }
    for (int r = 0; r < 8; ++r) _mm256_storeu_ps(y + j0 + 8 * r, acc[r]);
  }
  for (; j0 < m; j0 += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (size_t i = 0; i < m; ++i) {
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(mt + i * m + j0), _mm256_broadcast_ss(x + i), acc);
    }
    _mm256_storeu_ps(y + j0, acc);
  }
}

// MatVecT for NV vectors at once: each matrix row is loaded once for all of them, which halves
// the L2 traffic that bounds the one-vector loop (a 128x128 matrix does not fit L1).
// Blocks of 16 outputs x NV vectors of accumulators; every lane keeps the reference's fma order.
// One block of NR * 8 outputs (from j0) for NV vectors: NV * NR accumulators.
template <int NV, int NR>
inline void MatVecTBlock(const float* mt, const float* const* x, size_t m, size_t j0,
                         float* const* y) {
  __m256 acc[NV][NR];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) acc[v][r] = _mm256_setzero_ps();
  }
  for (size_t i = 0; i < m; ++i) {
    const float* row = mt + i * m + j0;
    __m256 rv[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) rv[r] = _mm256_loadu_ps(row + 8 * r);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __m256 xi = _mm256_broadcast_ss(x[v] + i);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[v][r] = _mm256_fmadd_ps(rv[r], xi, acc[v][r]);
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) _mm256_storeu_ps(y[v] + j0 + 8 * r, acc[v][r]);
  }
}

// 24-output blocks: 12 accumulators for 4 vectors hide the fma latency and fill the 16 registers.
template <int NV>
void MatVecTN(const float* mt, const float* const* x, size_t m, float* const* y) {
  size_t j0 = 0;
  for (; j0 + 24 <= m; j0 += 24) MatVecTBlock<NV, 3>(mt, x, m, j0, y);
  if (m - j0 == 16) MatVecTBlock<NV, 2>(mt, x, m, j0, y);
  if (m - j0 == 8) MatVecTBlock<NV, 1>(mt, x, m, j0, y);
}

constexpr size_t kHaarBatch = 4;

void MatVecTBatch(const float* mt, const float* const* x, size_t nv, size_t m, float* const* y) {
  switch (nv) {
    case 1:
      return MatVecT(mt, x[0], m, y[0]);
    case 2:
      return MatVecTN<2>(mt, x, m, y);
    case 3:
      return MatVecTN<3>(mt, x, m, y);
    default:
      return MatVecTN<4>(mt, x, m, y);
  }
}

// Hadamard rotation of x into z (aligned), optionally scaled: z = Fwht(s2 * Fwht(s1 * x)) * scale.
template <int R>
inline void HadamardForward(const SubsetPlan& p, const float* x, float scale, float* z) {
  __m256 v[R];
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) {
    v[r] = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * r), _mm256_loadu_ps(p.signs1 + 8 * r));
  }
  FwhtRegs<R>(v);
  if (p.rotation == RotationKind::kHadamard2) {
#pragma GCC unroll 128
    for (int r = 0; r < R; ++r) v[r] = _mm256_mul_ps(v[r], _mm256_loadu_ps(p.signs2 + 8 * r));
    FwhtRegs<R>(v);
  }
  const __m256 s = _mm256_set1_ps(scale);
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) _mm256_store_ps(z + 8 * r, _mm256_mul_ps(v[r], s));
}

// out = s1 * Fwht(s2 * Fwht(v)) (Hadamard2) or s1 * Fwht(v).
template <int R>
inline void HadamardInverse(const SubsetPlan& p, const float* v_in, float* out) {
  __m256 v[R];
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) v[r] = _mm256_load_ps(v_in + 8 * r);
  FwhtRegs<R>(v);
  if (p.rotation == RotationKind::kHadamard2) {
#pragma GCC unroll 128
    for (int r = 0; r < R; ++r) v[r] = _mm256_mul_ps(v[r], _mm256_loadu_ps(p.signs2 + 8 * r));
    FwhtRegs<R>(v);
  }
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out + 8 * r, _mm256_mul_ps(v[r], _mm256_loadu_ps(p.signs1 + 8 * r)));
  }
}

using ForwardFn = void (*)(const SubsetPlan&, const float*, float, float*);
using InverseFn = void (*)(const SubsetPlan&, const float*, float*);

template <int R>
void HadamardForwardFn(const SubsetPlan& p, const float* x, float scale, float* z) {
  HadamardForward<R>(p, x, scale, z);
}
template <int R>
void HadamardInverseFn(const SubsetPlan& p, const float* v, float* out) {
  HadamardInverse<R>(p, v, out);
}

ForwardFn PickForward(uint32_t dim) {
  switch (dim / 8) {
    case 1:
      return HadamardForwardFn<1>;
    case 2:
      return HadamardForwardFn<2>;
    case 4:
      return HadamardForwardFn<4>;
    case 8:
      return HadamardForwardFn<8>;
    case 16:
      return HadamardForwardFn<16>;
    case 32:
      return HadamardForwardFn<32>;
    case 64:
      return HadamardForwardFn<64>;
    case 128:
      return HadamardForwardFn<128>;
  }
  return nullptr;
}

InverseFn PickInverse(uint32_t dim) {
  switch (dim / 8) {
    case 1:
      return HadamardInverseFn<1>;
    case 2:
      return HadamardInverseFn<2>;
    case 4:
      return HadamardInverseFn<4>;
    case 8:
      return HadamardInverseFn<8>;
    case 16:
      return HadamardInverseFn<16>;
    case 32:
      return HadamardInverseFn<32>;
    case 64:
      return HadamardInverseFn<64>;
    case 128:
      return HadamardInverseFn<128>;
  }
  return nullptr;
}

// ---- Kronecker kind: signs, FWHT of each B-block, then the q*q mix across blocks ----

// t = Fwht(signs * x) for one block of 8 * R floats (t aligned).
template <int R>
void SignedFwhtBlock(const float* x, const float* signs, float* t) {
  __m256 v[R];
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) {
    v[r] = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * r), _mm256_loadu_ps(signs + 8 * r));
  }
  FwhtRegs<R>(v);
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) _mm256_store_ps(t + 8 * r, v[r]);
}

// y = (M (x) I_B) x, B = 8 * R, with mt = M^T (q*q): for each output block a, R accumulators
// take the q fmas in the reference's order (a' ascending); one broadcast serves R registers.
// Accumulators in chunks of at most 8 registers, so large blocks do not spill. x aligned; the
// result goes to y (scaled by `scale` when given: encode), or with `signs`, through the block's
// FWHT in registers and the sign multiply (decode: u never goes to memory).
// kQ > 0 fixes q at compile time (q = 3: 96 = 3 * 32, 48, 192), so the loops unroll and the q * q
// weights stay in registers.
template <int R, int kQ>
inline void KronMixBlocks(const float* mt, const float* x, size_t q_runtime, const float* scale,
                          const float* signs, float* y) {
  const size_t q = kQ > 0 ? static_cast<size_t>(kQ) : q_runtime;
  constexpr int kB = 8 * R;
  constexpr int kChunk = R < 8 ? R : 8;
#pragma GCC unroll 4
  for (size_t a = 0; a < q; ++a) {
    if (signs != nullptr && R <= 16) {  // decode: the whole block in registers
      __m256 acc[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
#pragma GCC unroll 4
      for (size_t a2 = 0; a2 < q; ++a2) {
        const __m256 w = _mm256_broadcast_ss(mt + a2 * q + a);
        const float* xb = x + a2 * kB;
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(w, _mm256_load_ps(xb + 8 * r), acc[r]);
      }
      FwhtRegs<R>(acc);
      float* yb = y + a * kB;
      const float* sb = signs + a * kB;
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(yb + 8 * r, _mm256_mul_ps(acc[r], _mm256_loadu_ps(sb + 8 * r)));
      }
      continue;
    }
    for (int r0 = 0; r0 < R; r0 += kChunk) {
      __m256 acc[kChunk];
#pragma GCC unroll 8
      for (int r = 0; r < kChunk; ++r) acc[r] = _mm256_setzero_ps();
#pragma GCC unroll 4
      for (size_t a2 = 0; a2 < q; ++a2) {
        const __m256 w = _mm256_broadcast_ss(mt + a2 * q + a);
        const float* xb = x + a2 * kB + 8 * r0;
#pragma GCC unroll 8
        for (int r = 0; r < kChunk; ++r) {
          acc[r] = _mm256_fmadd_ps(w, _mm256_load_ps(xb + 8 * r), acc[r]);
        }
      }
      if (scale != nullptr) {
        const __m256 s = _mm256_set1_ps(*scale);
#pragma GCC unroll 8
        for (int r = 0; r < kChunk; ++r) acc[r] = _mm256_mul_ps(acc[r], s);
      }
      float* yb = y + a * kB + 8 * r0;
#pragma GCC unroll 8
      for (int r = 0; r < kChunk; ++r) _mm256_store_ps(yb + 8 * r, acc[r]);
    }
  }
}

// out = signs * Fwht(u) for one block (u aligned).
template <int R>
void FwhtSignedBlock(const float* u, const float* signs, float* out) {
  __m256 v[R];
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) v[r] = _mm256_load_ps(u + 8 * r);
  FwhtRegs<R>(v);
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out + 8 * r, _mm256_mul_ps(v[r], _mm256_loadu_ps(signs + 8 * r)));
  }
}

// z = KronMix(Q_q^T, Fwht of each block of signs * x) * scale (z aligned).
template <int R, int kQ>
void KronForward(const SubsetPlan& p, const float* x, float scale, float* z) {
  constexpr size_t kB = 8 * R;
  alignas(32) float t[kMaxDim];
  for (size_t j = 0; j < p.dim; j += kB) SignedFwhtBlock<R>(x + j, p.signs1 + j, t + j);
  KronMixBlocks<R, kQ>(p.haar_t, t, p.dim / kB, &scale, nullptr, z);
}

// out = signs * (Fwht of each block of KronMix(Q_q, v)) (v aligned).
template <int R, int kQ>
void KronInverse(const SubsetPlan& p, const float* v, float* out) {
  constexpr size_t kB = 8 * R;
  if constexpr (R <= 16) {
    KronMixBlocks<R, kQ>(p.haar, v, p.dim / kB, nullptr, p.signs1, out);
  } else {
    alignas(32) float u[kMaxDim];
    KronMixBlocks<R, kQ>(p.haar, v, p.dim / kB, nullptr, nullptr, u);
    for (size_t j = 0; j < p.dim; j += kB) FwhtSignedBlock<R>(u + j, p.signs1 + j, out + j);
  }
}

template <template <int> class F, typename Fn>
Fn PickByBlock(uint32_t block) {
  switch (block / 8) {
    case 1: return F<1>::kFn;
    case 2: return F<2>::kFn;
    case 4: return F<4>::kFn;
    case 8: return F<8>::kFn;
    case 16: return F<16>::kFn;
    case 32: return F<32>::kFn;
    case 64: return F<64>::kFn;
    case 128: return F<128>::kFn;
  }
  return nullptr;
}
template <int R>
struct KronForwardOp {
  static constexpr ForwardFn kFn = KronForward<R, 0>;
};
template <int R>
struct KronInverseOp {
  static constexpr InverseFn kFn = KronInverse<R, 0>;
};
// q = 3 only where 3 * B fits kMaxDim (larger shapes never reach the SIMD path).
template <int R>
struct KronForward3Op {
  static constexpr ForwardFn kFn = 24 * R <= kMaxDim ? KronForward<R, 3> : KronForward<R, 0>;
};
template <int R>
struct KronInverse3Op {
  static constexpr InverseFn kFn = 24 * R <= kMaxDim ? KronInverse<R, 3> : KronInverse<R, 0>;
};
ForwardFn PickKronForward(const SubsetPlan& p) {
  if (p.dim == 3 * p.block) return PickByBlock<KronForward3Op, ForwardFn>(p.block);
  return PickByBlock<KronForwardOp, ForwardFn>(p.block);
}
InverseFn PickKronInverse(const SubsetPlan& p) {
  if (p.dim == 3 * p.block) return PickByBlock<KronInverse3Op, InverseFn>(p.block);
  return PickByBlock<KronInverseOp, InverseFn>(p.block);
}

// kRegs (1..4) registers of z -> 32 index bytes (zero padded); with norm correction also adds the
// squared centroids to csum, lane k taking elements 8r + k in order of r as Sum8 does.
template <int kBits, int kRegs>
inline void QuantizeGroup(const SubsetPlan& plan, const Tables& t, const float* z, __m256* csum,
                          uint8_t* idx) {
  __m256 zr[4];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) zr[r] = r < kRegs ? _mm256_load_ps(z + 8 * r) : _mm256_setzero_ps();
  __m256i q[4];
  Quantize4x8<kBits>(plan, t, zr, q);
#pragma GCC unroll 4
  for (int r = kRegs; r < 4; ++r) q[r] = _mm256_setzero_si256();
  if (plan.norm_correction) {
#pragma GCC unroll 4
    for (int r = 0; r < kRegs; ++r) {
      const __m256 c = Lookup8<kBits>(plan, t.cent, q[r]);
      *csum = _mm256_add_ps(*csum, _mm256_mul_ps(c, c));
    }
  }
  _mm256_store_si256(reinterpret_cast<__m256i*>(idx), PackIdx32(q[0], q[1], q[2], q[3]));
}

ForwardFn PickForwardFn(const SubsetPlan& plan) {
  if (plan.rotation == RotationKind::kHaar) return nullptr;
  if (plan.rotation == RotationKind::kKronecker) return PickKronForward(plan);
  return PickForward(plan.dim);
}
InverseFn PickInverseFn(const SubsetPlan& plan) {
  if (plan.rotation == RotationKind::kHaar) return nullptr;
  if (plan.rotation == RotationKind::kKronecker) return PickKronInverse(plan);
  return PickInverse(plan.dim);
}

// One vector with its norm (finite, not 0): rotation (forward; null for Haar: z then holds Q x
// already), scale, quantize, pack. Returns the norm to store (norm correction applied). z
// (kMaxDim floats) and idx (kMaxDim + 32 bytes) are aligned scratch.
template <int kBits>
[[gnu::always_inline]] inline float EncodeVecWithNorm(const SubsetPlan& plan, const Tables& t,
                                                      ForwardFn forward, const float* xv,
                                                      float norm, float* z, uint8_t* idx,
                                                      uint8_t* planes) {
  const size_t m = plan.dim;
  const float s = plan.enc_scale / norm;
  if (forward == nullptr) {
    const __m256 sv = _mm256_set1_ps(s);
    for (size_t j = 0; j < m; j += 8) {
      _mm256_store_ps(z + j, _mm256_mul_ps(_mm256_load_ps(z + j), sv));
    }
  } else {
    forward(plan, xv, s, z);
  }
  // Quantize 32 lanes at a time; a short last group is padded with zero indices.
  __m256 csum = _mm256_setzero_ps();
  size_t j = 0;
  for (; j + 32 <= m; j += 32) QuantizeGroup<kBits, 4>(plan, t, z + j, &csum, idx + j);
  switch ((m - j) / 8) {
    case 1:
      QuantizeGroup<kBits, 1>(plan, t, z + j, &csum, idx + j);
      break;
    case 2:
      QuantizeGroup<kBits, 2>(plan, t, z + j, &csum, idx + j);
      break;
    case 3:
      QuantizeGroup<kBits, 3>(plan, t, z + j, &csum, idx + j);
      break;
  }
  PackPlanesFromBytes<kBits>(idx, m, planes);
  if (!plan.norm_correction) return norm;
  return norm * _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(static_cast<float>(m) / ReduceSum8(csum))));
}

// One vector: its norm, then EncodeVecWithNorm.
template <int kBits>
[[gnu::always_inline]] inline void EncodeVec(const SubsetPlan& plan, const Tables& t,
                                             ForwardFn forward, const float* xv, float* z,
                                             uint8_t* idx, uint8_t* norm_out, uint8_t* planes) {
  const float norm = _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(Sum8Squares(xv, plan.dim))));
  if (norm == 0.0f || !std::isfinite(norm)) {
    StoreNorm(norm == 0.0f ? 0.0f : std::numeric_limits<float>::quiet_NaN(), plan.norm_dtype,
              norm_out);
    std::memset(planes, 0, plan.planes_bytes());
    return;
  }
  StoreNorm(EncodeVecWithNorm<kBits>(plan, t, forward, xv, norm, z, idx, planes), plan.norm_dtype,
            norm_out);
}

template <int kBits>
void EncodeBits(const SubsetPlan& plan, const float* x, size_t x_stride, size_t n,
                uint8_t* norm_out, uint8_t* planes_out, size_t code_stride) {
  const size_t m = plan.dim;
  const bool haar = plan.rotation == RotationKind::kHaar;
  const ForwardFn forward = PickForwardFn(plan);
  Tables t;
  InitTables(plan, &t);
  alignas(32) float zbuf[kHaarBatch][kMaxDim];
  alignas(32) uint8_t idx[kMaxDim + 32];
  const size_t batch = haar ? kHaarBatch : 1;
  for (size_t v0 = 0; v0 < n; v0 += batch) {
    const size_t nb = std::min(batch, n - v0);
    if (haar) {  // rotate the batch first; vectors rejected below just waste their product
      const float* xs[kHaarBatch];
      float* ys[kHaarBatch];
      for (size_t b = 0; b < nb; ++b) {
        xs[b] = x + (v0 + b) * x_stride;
        ys[b] = zbuf[b];
      }
      MatVecTBatch(plan.haar_t, xs, nb, m, ys);
    }
    for (size_t b = 0; b < nb; ++b) {
      const size_t v = v0 + b;
      EncodeVec<kBits>(plan, t, forward, x + v * x_stride, zbuf[b], idx, norm_out + v * code_stride,
                       planes_out + v * code_stride);
    }
  }
}

void Encode(const SubsetPlan& plan, const float* x, size_t x_stride, size_t n, uint8_t* norm_out,
            uint8_t* planes_out, size_t code_stride) {
  if (!Vectorised(plan)) {
    ScalarKernels().encode(plan, x, x_stride, n, norm_out, planes_out, code_stride);
    return;
  }
  using Fn = void (*)(const SubsetPlan&, const float*, size_t, size_t, uint8_t*, uint8_t*, size_t);
  static constexpr Fn kByBits[8] = {EncodeBits<1>, EncodeBits<2>, EncodeBits<3>, EncodeBits<4>,
                                    EncodeBits<5>, EncodeBits<6>, EncodeBits<7>, EncodeBits<8>};
  kByBits[plan.bits - 1](plan, x, x_stride, n, norm_out, planes_out, code_stride);
}

template <int kBits>
void EncodeUnitBits(const SubsetPlan& plan, const float* x, size_t x_stride, size_t n,
                    uint8_t* planes_out, size_t code_stride) {
  const ForwardFn forward = PickForwardFn(plan);
  Tables t;
  InitTables(plan, &t);
  alignas(32) float z[kMaxDim];
  alignas(32) uint8_t idx[kMaxDim + 32];
  for (size_t v = 0; v < n; ++v) {
    EncodeVecWithNorm<kBits>(plan, t, forward, x + v * x_stride, 1.0f, z, idx,
                             planes_out + v * code_stride);
  }
}

void EncodeUnit(const SubsetPlan& plan, const float* x, size_t x_stride, size_t n,
                uint8_t* planes_out, size_t code_stride) {
  if (!Vectorised(plan) || plan.rotation == RotationKind::kHaar) {  // Haar: rotated in batches
    ScalarKernels().encode_unit(plan, x, x_stride, n, planes_out, code_stride);
    return;
  }
  using Fn = void (*)(const SubsetPlan&, const float*, size_t, size_t, uint8_t*, size_t);
  static constexpr Fn kByBits[8] = {EncodeUnitBits<1>, EncodeUnitBits<2>, EncodeUnitBits<3>,
                                    EncodeUnitBits<4>, EncodeUnitBits<5>, EncodeUnitBits<6>,
                                    EncodeUnitBits<7>, EncodeUnitBits<8>};
  kByBits[plan.bits - 1](plan, x, x_stride, n, planes_out, code_stride);
}

void Whiten(const float* x, size_t x_stride, size_t n, size_t d, const uint32_t* channel,
            const float* mean, const float* scale, size_t rows, float* norms, float* w,
            size_t w_stride) {
  if (d % 8 != 0) {
    return ScalarKernels().whiten(x, x_stride, n, d, channel, mean, scale, rows, norms, w,
                                  w_stride);
  }
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
  for (size_t i = 0; i < n; ++i) {
    const float* xv = x + i * x_stride;
    const float norm = _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(Sum8Squares(xv, d))));
    norms[i] = norm;
    const __m256 nv = _mm256_set1_ps(norm);
    float* wv = w + i * w_stride;
    size_t r = 0;
    for (; r + 8 <= rows; r += 8) {
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(channel + r));
      const __m256 u = _mm256_div_ps(_mm256_i32gather_ps(xv, c, 4), nv);
      const __m256 s = _mm256_loadu_ps(scale + r);
      const __m256 pos = _mm256_cmp_ps(s, zero, _CMP_GT_OQ);  // the divisor 1 elsewhere
      const __m256 q =
          _mm256_div_ps(_mm256_sub_ps(u, _mm256_loadu_ps(mean + r)), _mm256_blendv_ps(one, s, pos));
      _mm256_storeu_ps(wv + r, _mm256_and_ps(q, pos));
    }
    for (; r < rows; ++r) {
      const float u = xv[channel[r]] / norm;
      wv[r] = scale[r] > 0.0f ? (u - mean[r]) / scale[r] : 0.0f;
    }
  }
}

void UnitMoments(const float* x, size_t x_stride, size_t n, size_t d, double* s1, double* s2,
                 size_t* count, float* largest) {
  if (d % 8 != 0) return ScalarKernels().unit_moments(x, x_stride, n, d, s1, s2, count, largest);
  for (size_t i = 0; i < n; ++i) {
    const float* xv = x + i * x_stride;
    const float norm = _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(Sum8Squares(xv, d))));
    if (!(norm > 0.0f) || !std::isfinite(norm)) continue;
    ++*count;
    *largest = std::max(*largest, norm);
    const __m256 nv = _mm256_set1_ps(norm);
    for (size_t c = 0; c < d; c += 8) {
      const __m256 u = _mm256_div_ps(_mm256_loadu_ps(xv + c), nv);
      const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(u));
      const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(u, 1));
      _mm256_storeu_pd(s1 + c, _mm256_add_pd(_mm256_loadu_pd(s1 + c), lo));
      _mm256_storeu_pd(s1 + c + 4, _mm256_add_pd(_mm256_loadu_pd(s1 + c + 4), hi));
      _mm256_storeu_pd(s2 + c, _mm256_add_pd(_mm256_loadu_pd(s2 + c), _mm256_mul_pd(lo, lo)));
      _mm256_storeu_pd(s2 + c + 4,
                       _mm256_add_pd(_mm256_loadu_pd(s2 + c + 4), _mm256_mul_pd(hi, hi)));
    }
  }
}

// Indices of channels 8g..8g+7 straight from the bit planes into int32 lanes: planes 0-3 and 4-7
// as two words, lane l moving bit 8k + l of a word (its plane k) to bit k. For small blocks (kl's
// 8 and 16 channels) this beats unpacking 32 at a time through a byte buffer.
template <int kBits>
inline __m256i Indices8(const uint8_t* planes, size_t pb, size_t g) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i q = _mm256_setzero_si256();
#pragma GCC unroll 2
  for (int w0 = 0; w0 < kBits; w0 += 4) {
    const int planes_in_word = kBits - w0 < 4 ? kBits - w0 : 4;
    uint32_t w = 0;
#pragma GCC unroll 4
    for (int k = 0; k < planes_in_word; ++k) {
      w |= static_cast<uint32_t>(planes[(w0 + k) * pb + g]) << (8 * k);
    }
    const __m256i wv = _mm256_set1_epi32(static_cast<int>(w));
    __m256i qw = _mm256_and_si256(_mm256_srlv_epi32(wv, lane), _mm256_set1_epi32(1));
#pragma GCC unroll 3
    for (int k = 1; k < planes_in_word; ++k) {
      const __m256i bit = _mm256_srlv_epi32(wv, _mm256_add_epi32(lane, _mm256_set1_epi32(7 * k)));
      qw = _mm256_or_si256(qw, _mm256_and_si256(bit, _mm256_set1_epi32(1 << k)));
    }
    q = w0 == 0 ? qw : _mm256_or_si256(q, _mm256_slli_epi32(qw, 4));
  }
  return q;
}

// One vector's scaled centroids v = c[idx] * a into vbuf (plan.dim floats).
template <int kBits>
[[gnu::always_inline]] inline void DequantizeVec(const SubsetPlan& plan, const Tables& t,
                                                 const uint8_t* norm_in, const uint8_t* planes,
                                                 uint8_t* idx, float* vbuf) {
  const size_t m = plan.dim;
  const float a = LoadNorm(norm_in, plan.norm_dtype) * plan.dec_scale;
  const __m256 av = _mm256_set1_ps(a);
  // Up to 5 bits, scaling the centroids first gives each lane the same product c[idx] * a, one
  // op less; more bits scale each looked-up centroid.
  constexpr bool kScaleTable = kBits <= 5;
  constexpr int kRegs = kBits <= 3 ? 1 : kBits == 4 ? 2 : 4;
  __m256 cent[4];
  if constexpr (kScaleTable) {
#pragma GCC unroll 4
    for (int r = 0; r < kRegs; ++r) cent[r] = _mm256_mul_ps(t.cent[r], av);
  }
  const auto store = [&](size_t j, __m256i q) {
    if constexpr (kScaleTable) {
      _mm256_storeu_ps(vbuf + j, Lookup8<kBits>(plan, cent, q));
    } else {
      _mm256_storeu_ps(vbuf + j, _mm256_mul_ps(Lookup8<kBits>(plan, t.cent, q), av));
    }
  };
  if (m <= 16) {  // kl's small blocks: indices straight from the planes
    for (size_t g = 0; g < m / 8; ++g) store(8 * g, Indices8<kBits>(planes, m / 8, g));
    return;
  }
  UnpackPlanesToBytes<kBits>(planes, m, idx);
  for (size_t j = 0; j < m; j += 8) {
    store(j, _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(idx + j))));
  }
}

template <int kBits>
void DecodeBits(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
                size_t code_stride, size_t n, float* out, size_t out_stride) {
  const size_t m = plan.dim;
  const bool haar = plan.rotation == RotationKind::kHaar;
  const InverseFn inverse = PickInverseFn(plan);
  Tables t;
  InitTables(plan, &t);
  alignas(32) float vbufs[kHaarBatch][kMaxDim];
  alignas(32) uint8_t idx[kMaxDim + 32];
  const size_t batch = haar ? kHaarBatch : 1;
  for (size_t k0 = 0; k0 < n; k0 += batch) {
    const size_t nb = std::min(batch, n - k0);
    for (size_t b = 0; b < nb; ++b) {
      const size_t k = k0 + b;
      DequantizeVec<kBits>(plan, t, norm_in + k * code_stride, planes_in + k * code_stride, idx,
                           vbufs[b]);
      if (!haar) inverse(plan, vbufs[b], out + k * out_stride);
    }
    if (haar) {
      const float* vs[kHaarBatch];
      float* outs[kHaarBatch];
      for (size_t b = 0; b < nb; ++b) {
        vs[b] = vbufs[b];
        outs[b] = out + (k0 + b) * out_stride;
      }
      MatVecTBatch(plan.haar, vs, nb, m, outs);
    }
  }
}

void Decode(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
            size_t code_stride, size_t n, float* out, size_t out_stride) {
  if (!Vectorised(plan)) {
    ScalarKernels().decode(plan, norm_in, planes_in, code_stride, n, out, out_stride);
    return;
  }
  using Fn =
      void (*)(const SubsetPlan&, const uint8_t*, const uint8_t*, size_t, size_t, float*, size_t);
  static constexpr Fn kByBits[8] = {DecodeBits<1>, DecodeBits<2>, DecodeBits<3>, DecodeBits<4>,
                                    DecodeBits<5>, DecodeBits<6>, DecodeBits<7>, DecodeBits<8>};
  kByBits[plan.bits - 1](plan, norm_in, planes_in, code_stride, n, out, out_stride);
}

// ---- split gather / scatter: one permute per 8 channels, by the mask byte ----

struct SplitLut {
  uint8_t set[256][8];    // lanes whose bit is set, ascending (then padding)
  uint8_t unset[256][8];  // lanes whose bit is clear, ascending (then padding)
  uint8_t rank[256][8];   // lane l: its rank among the set (bit set) or the clear lanes
};

const SplitLut& Lut() {
  static const SplitLut lut = [] {
    SplitLut t{};
    for (int mb = 0; mb < 256; ++mb) {
      int a = 0, b = 0;
      for (int l = 0; l < 8; ++l) {
        if ((mb >> l) & 1) {
          t.rank[mb][l] = static_cast<uint8_t>(a);
          t.set[mb][a++] = static_cast<uint8_t>(l);
        } else {
          t.rank[mb][l] = static_cast<uint8_t>(b);
          t.unset[mb][b++] = static_cast<uint8_t>(l);
        }
      }
    }
    return t;
  }();
  return lut;
}

inline __m256i LoadLut(const uint8_t* row) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row)));
}

// Whole registers are stored at the running positions: the lanes past the valid ones are
// overwritten by the next step, or land in the next vector's region (written later) or the slack.
void SplitGather(const float* x, size_t x_stride, size_t n, const uint8_t* mask, size_t d,
                 float* out0, size_t m0, float* out1, size_t m1) {
  const SplitLut& t = Lut();
  const size_t full = d / 8;
  for (size_t i = 0; i < n; ++i) {
    const float* xv = x + i * x_stride;
    float* o0 = out0 + i * m0;
    float* o1 = out1 + i * m1;
    for (size_t k = 0; k < full; ++k) {
      const uint8_t mb = mask[k];
      const __m256 v = _mm256_loadu_ps(xv + 8 * k);
      _mm256_storeu_ps(o0, _mm256_permutevar8x32_ps(v, LoadLut(t.set[mb])));
      _mm256_storeu_ps(o1, _mm256_permutevar8x32_ps(v, LoadLut(t.unset[mb])));
      const int cnt = __builtin_popcount(mb);
      o0 += cnt;
      o1 += 8 - cnt;
    }
    for (size_t c = 8 * full; c < d; ++c) {
      if ((mask[c / 8] >> (c % 8)) & 1u) {
        *o0++ = xv[c];
      } else {
        *o1++ = xv[c];
      }
    }
  }
}

void SplitScatter(const float* in0, size_t m0, const float* in1, size_t m1, size_t n,
                  const uint8_t* mask, size_t d, float* x, size_t x_stride) {
  const SplitLut& t = Lut();
  const size_t full = d / 8;
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  for (size_t i = 0; i < n; ++i) {
    float* xv = x + i * x_stride;
    const float* i0 = in0 + i * m0;
    const float* i1 = in1 + i * m1;
    for (size_t k = 0; k < full; ++k) {
      const uint8_t mb = mask[k];
      const __m256i rank = LoadLut(t.rank[mb]);
      const __m256 a = _mm256_permutevar8x32_ps(_mm256_loadu_ps(i0), rank);
      const __m256 b = _mm256_permutevar8x32_ps(_mm256_loadu_ps(i1), rank);
      const __m256i sel = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(mb), bit), bit);
      _mm256_storeu_ps(xv + 8 * k, _mm256_blendv_ps(b, a, _mm256_castsi256_ps(sel)));
      const int cnt = __builtin_popcount(mb);
      i0 += cnt;
      i1 += 8 - cnt;
    }
    for (size_t c = 8 * full; c < d; ++c) xv[c] = ((mask[c / 8] >> (c % 8)) & 1u) ? *i0++ : *i1++;
  }
}

// ---- split codecs fused per vector: gather, both subsets, scatter, all in L1 ----
//
// Batch-wise (gather 64 vectors, encode each subset, scatter) streams every float through a
// 32 KiB buffer per step; per vector the subsets' floats stay in a few cache lines. Haar subsets
// keep the batched products (MatVecTBatch), so they, and shapes the reference handles, take the
// batch-wise route.

bool Fusable(const SubsetPlan& p) { return Vectorised(p) && p.rotation != RotationKind::kHaar; }

// The group mask's data movement, worked out once per call: for 8-channel chunk k, where its
// outlier and regular channels start in the subset vectors and the lane permutations. Gather and
// scatter then need no mask bits, popcounts or table look-ups per vector.
constexpr size_t kMaxChunks = 64;  // fused route: d <= 512
struct SplitMap {
  size_t chunks = 0;
  alignas(32) int32_t set[kMaxChunks][8];    // lanes of the outlier channels, ascending
  alignas(32) int32_t unset[kMaxChunks][8];  // lanes of the regular channels, ascending
  alignas(32) int32_t rank[kMaxChunks][8];   // lane l: its position within its subset's run
  alignas(32) int32_t sel[kMaxChunks][8];    // -1 where lane l is an outlier channel
  uint32_t off0[kMaxChunks], off1[kMaxChunks];
};

void InitSplitMap(const uint8_t* mask, size_t d, SplitMap* map) {
  const SplitLut& t = Lut();
  map->chunks = d / 8;
  uint32_t o0 = 0, o1 = 0;
  for (size_t k = 0; k < map->chunks; ++k) {
    const uint8_t mb = mask[k];
    for (int l = 0; l < 8; ++l) {
      map->set[k][l] = t.set[mb][l];
      map->unset[k][l] = t.unset[mb][l];
      map->rank[k][l] = t.rank[mb][l];
      map->sel[k][l] = (mb >> l) & 1 ? -1 : 0;
    }
    map->off0[k] = o0;
    map->off1[k] = o1;
    const int cnt = __builtin_popcount(mb);
    o0 += cnt;
    o1 += 8 - cnt;
  }
}

// Eight elements of dtype kT as floats, exactly as ToF32 converts them, and back as FromF32.
template <DType kT>
inline __m256 Load8AsFloat(const void* row, size_t c) {
  if constexpr (kT == DType::kF32) return _mm256_loadu_ps(static_cast<const float*>(row) + c);
  const __m128i h =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + c));
  if constexpr (kT == DType::kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
template <DType kT>
inline void Store8FromFloat(void* row, size_t c, __m256 v) {
  if constexpr (kT == DType::kF32) {
    _mm256_storeu_ps(static_cast<float*>(row) + c, v);
  } else {
    auto* dst = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(row) + c);
    if constexpr (kT == DType::kF16) {
      _mm_storeu_si128(dst, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    } else {
      _mm_storeu_si128(dst, FloatToBF16x8(v));
    }
  }
}

// One vector (d elements of kT), as to_f32 + SplitGather (the same slack after out0 / out1).
template <DType kT>
inline void GatherVec(const SplitMap& map, const void* xv, float* out0, float* out1) {
  for (size_t k = 0; k < map.chunks; ++k) {
    const __m256 v = Load8AsFloat<kT>(xv, 8 * k);
    const __m256i s = _mm256_load_si256(reinterpret_cast<const __m256i*>(map.set[k]));
    const __m256i u = _mm256_load_si256(reinterpret_cast<const __m256i*>(map.unset[k]));
    _mm256_storeu_ps(out0 + map.off0[k], _mm256_permutevar8x32_ps(v, s));
    _mm256_storeu_ps(out1 + map.off1[k], _mm256_permutevar8x32_ps(v, u));
  }
}

// As SplitScatter + from_f32.
template <DType kT>
inline void ScatterVec(const SplitMap& map, const float* in0, const float* in1, void* xv) {
  for (size_t k = 0; k < map.chunks; ++k) {
    const __m256i rank = _mm256_load_si256(reinterpret_cast<const __m256i*>(map.rank[k]));
    const __m256 a = _mm256_permutevar8x32_ps(_mm256_loadu_ps(in0 + map.off0[k]), rank);
    const __m256 b = _mm256_permutevar8x32_ps(_mm256_loadu_ps(in1 + map.off1[k]), rank);
    const __m256 sel = _mm256_load_ps(reinterpret_cast<const float*>(map.sel[k]));
    Store8FromFloat<kT>(xv, 8 * k, _mm256_blendv_ps(b, a, sel));
  }
}

using EncodeVecFn = void (*)(const SubsetPlan&, const Tables&, ForwardFn, const float*, float*,
                             uint8_t*, uint8_t*, uint8_t*);
using DequantizeVecFn = void (*)(const SubsetPlan&, const Tables&, const uint8_t*,
                                 const uint8_t*, uint8_t*, float*);
template <int kBits>
void EncodeVecFnT(const SubsetPlan& plan, const Tables& t, ForwardFn forward, const float* xv,
                  float* z, uint8_t* idx, uint8_t* norm_out, uint8_t* planes) {
  EncodeVec<kBits>(plan, t, forward, xv, z, idx, norm_out, planes);
}
template <int kBits>
void DequantizeVecFnT(const SubsetPlan& plan, const Tables& t, const uint8_t* norm_in,
                      const uint8_t* planes, uint8_t* idx, float* vbuf) {
  DequantizeVec<kBits>(plan, t, norm_in, planes, idx, vbuf);
}

// One subset's per-call state.
struct VecCoder {
  Tables t;
  ForwardFn forward;
  InverseFn inverse;
  EncodeVecFn encode;
  DequantizeVecFn dequantize;
};

void InitVecCoder(const SubsetPlan& p, VecCoder* c) {
  static constexpr EncodeVecFn kEnc[8] = {EncodeVecFnT<1>, EncodeVecFnT<2>, EncodeVecFnT<3>,
                                          EncodeVecFnT<4>, EncodeVecFnT<5>, EncodeVecFnT<6>,
                                          EncodeVecFnT<7>, EncodeVecFnT<8>};
  static constexpr DequantizeVecFn kDeq[8] = {
      DequantizeVecFnT<1>, DequantizeVecFnT<2>, DequantizeVecFnT<3>, DequantizeVecFnT<4>,
      DequantizeVecFnT<5>, DequantizeVecFnT<6>, DequantizeVecFnT<7>, DequantizeVecFnT<8>};
  InitTables(p, &c->t);
  c->forward = PickForwardFn(p);
  c->inverse = PickInverseFn(p);
  c->encode = kEnc[p.bits - 1];
  c->dequantize = kDeq[p.bits - 1];
}

constexpr size_t kSplitChunk = 16;  // vectors per step of the batch-wise route

bool FusedRoute(const SplitPlan& sp) {
  return Fusable(sp.sub[0]) && Fusable(sp.sub[1]) &&
         (sp.sub[0].dim + sp.sub[1].dim) / 8 <= kMaxChunks;
}

// The fused route's per-call state: both subsets' tables and the mask's movement.
struct FusedSplit {
  VecCoder c[2];
  SplitMap map;
};

void InitFusedSplit(const SplitPlan& sp, const uint8_t* mask, FusedSplit* f) {
  InitVecCoder(sp.sub[0], &f->c[0]);
  InitVecCoder(sp.sub[1], &f->c[1]);
  InitSplitMap(mask, sp.sub[0].dim + sp.sub[1].dim, &f->map);
}

// The batch-wise route: step(first vector, count, f32 rows, subset 0 floats, subset 1 floats)
// over chunks of kSplitChunk vectors.
template <typename Step>
void SplitBatches(const SplitPlan& sp, size_t n, Step&& step) {
  const size_t d = sp.sub[0].dim + sp.sub[1].dim;
  std::vector<float> xf(kSplitChunk * d);
  std::vector<float> g0(kSplitChunk * sp.sub[0].dim + kSplitSlack);
  std::vector<float> g1(kSplitChunk * sp.sub[1].dim + kSplitSlack);
  for (size_t i = 0; i < n; i += kSplitChunk) {
    step(i, std::min(kSplitChunk, n - i), xf.data(), g0.data(), g1.data());
  }
}

template <DType kT>
void SplitEncodeFused(const SplitPlan& sp, const void* x, size_t pitch, size_t n,
                      const uint8_t* mask, uint8_t* code, size_t code_stride) {
  FusedSplit f;
  InitFusedSplit(sp, mask, &f);
  const VecCoder& c0 = f.c[0];
  const VecCoder& c1 = f.c[1];
  const auto* src = static_cast<const uint8_t*>(x);
  // Two buffers per subset: vector i + 1 is gathered before vector i is encoded, so the gather's
  // overlapping stores have reached L1 when the encoder loads them (a load spanning stores still
  // in flight cannot be forwarded and waits for them).
  alignas(32) float g0[2][kMaxDim + kSplitSlack];
  alignas(32) float g1[2][kMaxDim + kSplitSlack];
  alignas(32) float z[kMaxDim];
  alignas(32) uint8_t idx[kMaxDim + 32];
  GatherVec<kT>(f.map, src, g0[0], g1[0]);
  for (size_t i = 0; i < n; ++i) {
    const size_t cur = i & 1;
    if (i + 1 < n) GatherVec<kT>(f.map, src + (i + 1) * pitch, g0[cur ^ 1], g1[cur ^ 1]);
    uint8_t* c = code + i * code_stride;
    c0.encode(sp.sub[0], c0.t, c0.forward, g0[cur], z, idx, c + sp.norm_offset[0],
              c + sp.planes_offset[0]);
    c1.encode(sp.sub[1], c1.t, c1.forward, g1[cur], z, idx, c + sp.norm_offset[1],
              c + sp.planes_offset[1]);
  }
}

void SplitEncode(const SplitPlan& sp, const void* x, DType dtype, size_t x_stride, size_t n,
                 const uint8_t* mask, uint8_t* code, size_t code_stride) {
  const size_t m0 = sp.sub[0].dim, m1 = sp.sub[1].dim, d = m0 + m1;
  const size_t pitch = x_stride * DTypeSize(dtype);
  const auto* src = static_cast<const uint8_t*>(x);
  if (n == 0) return;
  if (FusedRoute(sp)) {
    switch (dtype) {
      case DType::kF16:
        return SplitEncodeFused<DType::kF16>(sp, x, pitch, n, mask, code, code_stride);
      case DType::kBF16:
        return SplitEncodeFused<DType::kBF16>(sp, x, pitch, n, mask, code, code_stride);
      case DType::kF32:
        return SplitEncodeFused<DType::kF32>(sp, x, pitch, n, mask, code, code_stride);
      default:
        break;
    }
  }
  SplitBatches(sp, n, [&](size_t i, size_t cnt, float* xf, float* g0, float* g1) {
    for (size_t r = 0; r < cnt; ++r) ToF32(src + (i + r) * pitch, dtype, d, xf + r * d);
    uint8_t* c = code + i * code_stride;
    SplitGather(xf, d, cnt, mask, d, g0, m0, g1, m1);
    Encode(sp.sub[0], g0, m0, cnt, c + sp.norm_offset[0], c + sp.planes_offset[0], code_stride);
    Encode(sp.sub[1], g1, m1, cnt, c + sp.norm_offset[1], c + sp.planes_offset[1], code_stride);
  });
}

template <DType kT>
void SplitDecodeFused(const SplitPlan& sp, const uint8_t* code, size_t code_stride, size_t n,
                      const uint8_t* mask, void* x, size_t pitch) {
  FusedSplit f;
  InitFusedSplit(sp, mask, &f);
  const VecCoder& c0 = f.c[0];
  const VecCoder& c1 = f.c[1];
  auto* dst = static_cast<uint8_t*>(x);
  // Vector i is scattered after vector i + 1 is decoded, for the same reason as in
  // SplitEncodeFused: the scatter's unaligned loads span the inverse rotation's stores.
  alignas(32) float v[kMaxDim];
  alignas(32) float g0[2][kMaxDim + kSplitSlack];
  alignas(32) float g1[2][kMaxDim + kSplitSlack];
  alignas(32) uint8_t idx[kMaxDim + 32];
  for (size_t i = 0; i < n; ++i) {
    const size_t cur = i & 1;
    const uint8_t* c = code + i * code_stride;
    c0.dequantize(sp.sub[0], c0.t, c + sp.norm_offset[0], c + sp.planes_offset[0], idx, v);
    c0.inverse(sp.sub[0], v, g0[cur]);
    c1.dequantize(sp.sub[1], c1.t, c + sp.norm_offset[1], c + sp.planes_offset[1], idx, v);
    c1.inverse(sp.sub[1], v, g1[cur]);
    if (i > 0) ScatterVec<kT>(f.map, g0[cur ^ 1], g1[cur ^ 1], dst + (i - 1) * pitch);
  }
  ScatterVec<kT>(f.map, g0[(n - 1) & 1], g1[(n - 1) & 1], dst + (n - 1) * pitch);
}

void SplitDecode(const SplitPlan& sp, const uint8_t* code, size_t code_stride, size_t n,
                 const uint8_t* mask, void* x, DType dtype, size_t x_stride) {
  const size_t m0 = sp.sub[0].dim, m1 = sp.sub[1].dim, d = m0 + m1;
  const size_t pitch = x_stride * DTypeSize(dtype);
  auto* dst = static_cast<uint8_t*>(x);
  if (n == 0) return;
  if (FusedRoute(sp)) {
    switch (dtype) {
      case DType::kF16:
        return SplitDecodeFused<DType::kF16>(sp, code, code_stride, n, mask, x, pitch);
      case DType::kBF16:
        return SplitDecodeFused<DType::kBF16>(sp, code, code_stride, n, mask, x, pitch);
      case DType::kF32:
        return SplitDecodeFused<DType::kF32>(sp, code, code_stride, n, mask, x, pitch);
      default:
        break;
    }
  }
  SplitBatches(sp, n, [&](size_t i, size_t cnt, float* xf, float* g0, float* g1) {
    const uint8_t* c = code + i * code_stride;
    Decode(sp.sub[0], c + sp.norm_offset[0], c + sp.planes_offset[0], code_stride, cnt, g0, m0);
    Decode(sp.sub[1], c + sp.norm_offset[1], c + sp.planes_offset[1], code_stride, cnt, g1, m1);
    SplitScatter(g0, m0, g1, m1, cnt, mask, d, xf, d);
    for (size_t r = 0; r < cnt; ++r) FromF32(xf + r * d, d, dtype, dst + (i + r) * pitch);
  });
}

// Four channels of a row as floats, exactly as ToF32 converts them.
template <DType kT>
inline __m128 Load4AsFloat(const uint8_t* row, size_t c) {
  if constexpr (kT == DType::kF32) return _mm_loadu_ps(reinterpret_cast<const float*>(row) + c);
  const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 2 * c));
  if constexpr (kT == DType::kF16) return _mm_cvtph_ps(h);
  return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16));
}

// energy[c] += double(x)^2 per vector in order; kRows vectors per pass over the accumulators,
// each channel's adds still one vector after the other.
template <DType kT, int kRows>
inline void EnergyRows(const uint8_t* rows, size_t pitch, size_t d, double* energy) {
  for (size_t c = 0; c < d; c += 4) {
    __m256d acc = _mm256_loadu_pd(energy + c);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m256d v = _mm256_cvtps_pd(Load4AsFloat<kT>(rows + r * pitch, c));
      acc = _mm256_add_pd(acc, _mm256_mul_pd(v, v));
    }
    _mm256_storeu_pd(energy + c, acc);
  }
}

template <DType kT>
void ChannelEnergyT(const uint8_t* src, size_t n, size_t pitch, size_t d, double* energy) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) EnergyRows<kT, 4>(src + i * pitch, pitch, d, energy);
  for (; i < n; ++i) EnergyRows<kT, 1>(src + i * pitch, pitch, d, energy);
}

void ChannelEnergy(const void* x, DType dtype, size_t n, size_t stride, size_t d,
                   double* energy) {
  const auto* src = static_cast<const uint8_t*>(x);
  const size_t pitch = stride * DTypeSize(dtype);
  if (d % 4 != 0) return ScalarKernels().channel_energy(x, dtype, n, stride, d, energy);
  switch (dtype) {
    case DType::kF16:
      return ChannelEnergyT<DType::kF16>(src, n, pitch, d, energy);
    case DType::kBF16:
      return ChannelEnergyT<DType::kBF16>(src, n, pitch, d, energy);
    case DType::kF32:
      return ChannelEnergyT<DType::kF32>(src, n, pitch, d, energy);
    default:
      break;
  }
  ScalarKernels().channel_energy(x, dtype, n, stride, d, energy);
}

// mul then add, never _mm256_fmadd_ps: the reference rounds the product first.
void AddScaled(const float* mean, const float* scale, size_t n, size_t d, float* x,
               size_t x_stride) {
  for (size_t i = 0; i < n; ++i) {
    float* xv = x + i * x_stride;
    const __m256 a = _mm256_set1_ps(scale[i]);
    size_t j = 0;
    for (; j + 8 <= d; j += 8) {
      const __m256 p = _mm256_mul_ps(a, _mm256_loadu_ps(mean + j));
      _mm256_storeu_ps(xv + j, _mm256_add_ps(_mm256_loadu_ps(xv + j), p));
    }
    for (; j < d; ++j) xv[j] += scale[i] * mean[j];
  }
}

template <int kBits>
void DequantizeBits(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
                    size_t code_stride, size_t n, float* out, size_t out_stride) {
  Tables t;
  InitTables(plan, &t);
  alignas(32) uint8_t idx[kMaxDim + 32];
  for (size_t k = 0; k < n; ++k) {
    DequantizeVec<kBits>(plan, t, norm_in + k * code_stride, planes_in + k * code_stride, idx,
                         out + k * out_stride);
  }
}

void Dequantize(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
                size_t code_stride, size_t n, float* out, size_t out_stride) {
  if (!Vectorised(plan)) {
    ref::Dequantize(plan, norm_in, planes_in, code_stride, n, out, out_stride);
    return;
  }
  using Fn =
      void (*)(const SubsetPlan&, const uint8_t*, const uint8_t*, size_t, size_t, float*, size_t);
  static constexpr Fn kByBits[8] = {DequantizeBits<1>, DequantizeBits<2>, DequantizeBits<3>,
                                    DequantizeBits<4>, DequantizeBits<5>, DequantizeBits<6>,
                                    DequantizeBits<7>, DequantizeBits<8>};
  kByBits[plan.bits - 1](plan, norm_in, planes_in, code_stride, n, out, out_stride);
}

}  // namespace

namespace internal {
const KernelTable& Avx2Table() {
  static const KernelTable table{"avx2", ToF32, FromF32, Encode, Decode, SplitGather,
                                 SplitScatter, SplitEncode, SplitDecode, ChannelEnergy,
                                 AddScaled, nullptr, nullptr, Avx2GatherAffine, Dequantize,
                                 Avx2TransformAssemble, Avx2TransformDecode, EncodeUnit,
                                 Whiten, UnitMoments};
  return table;
}
}  // namespace internal

}  // namespace tqkv::kernels
