// AVX2 + FMA + F16C kernels. Every result is bit-identical to ref.cc: same operations in the same
// order, only several lanes at a time. The rotations, the split codecs' fused route and the
// per-vector loops are the shared templates (simd_*.h) at 8 lanes; quantization, bit planes and
// the Haar products are this file's.
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
#include "codec/kernels/simd_rotation.h"
#include "codec/kernels/simd_split.h"
#include "codec/kernels/simd_vectors.h"

namespace tqkv::kernels {
namespace {

using L = avx2::Lanes;
using avx2::FloatToBF16x8;
using simd::ForwardFn;
using simd::InverseFn;
using simd::kMaxDim;

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


// kRegs (1..4) registers zr (the rest zero) -> 32 index bytes (zero padded); with norm correction
// also adds the squared centroids to csum, lane k taking elements 8r + k in order of r as Sum8
// does.
template <int kBits, int kRegs>
[[gnu::always_inline]] inline __m256i QuantizeIdx32(const SubsetPlan& plan, const Tables& t,
                                                    const __m256* zr, __m256* csum) {
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
  return PackIdx32(q[0], q[1], q[2], q[3]);
}

// kRegs registers of z to idx.
template <int kBits, int kRegs>
inline void QuantizeGroup(const SubsetPlan& plan, const Tables& t, const float* z, __m256* csum,
                          uint8_t* idx) {
  __m256 zr[4];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) zr[r] = r < kRegs ? _mm256_load_ps(z + 8 * r) : _mm256_setzero_ps();
  const __m256i packed = QuantizeIdx32<kBits, kRegs>(plan, t, zr, csum);
  _mm256_store_si256(reinterpret_cast<__m256i*>(idx), packed);
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
  return norm * _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(static_cast<float>(m) / L::Reduce(csum))));
}

// One vector: its norm, then EncodeVecWithNorm.
template <int kBits>
[[gnu::always_inline]] inline void EncodeVec(const SubsetPlan& plan, const Tables& t,
                                             ForwardFn forward, const float* xv, float* z,
                                             uint8_t* idx, uint8_t* norm_out, uint8_t* planes) {
  const float norm = L::Sqrt(simd::Sum8Squares<L>(xv, plan.dim));
  if (simd::EncodeDegenerate(plan, norm, norm_out, planes)) return;
  StoreNorm(EncodeVecWithNorm<kBits>(plan, t, forward, xv, norm, z, idx, planes), plan.norm_dtype,
            norm_out);
}

template <int kBits>
void EncodeBits(const SubsetPlan& plan, const float* x, size_t x_stride, size_t n,
                uint8_t* norm_out, uint8_t* planes_out, size_t code_stride) {
  const size_t m = plan.dim;
  const bool haar = plan.rotation == RotationKind::kHaar;
  const ForwardFn forward = simd::PickForwardFn<L>(plan);
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
  const ForwardFn forward = simd::PickForwardFn<L>(plan);
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
  simd::Whiten<L>(x, x_stride, n, d, channel, mean, scale, rows, norms, w, w_stride);
}

void UnitMoments(const float* x, size_t x_stride, size_t n, size_t d, double* s1, double* s2,
                 size_t* count, float* largest) {
  if (d % 8 != 0) return ScalarKernels().unit_moments(x, x_stride, n, d, s1, s2, count, largest);
  simd::UnitMoments<L>(x, x_stride, n, d, s1, s2, count, largest);
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
  const InverseFn inverse = simd::PickInverseFn<L>(plan);
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

inline __m256i LoadLut(const uint8_t* row) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row)));
}

// Whole registers are stored at the running positions: the lanes past the valid ones are
// overwritten by the next step, or land in the next vector's region (written later) or the slack.
void SplitGather(const float* x, size_t x_stride, size_t n, const uint8_t* mask, size_t d,
                 float* out0, size_t m0, float* out1, size_t m1) {
  const internal::SplitLut<1>& t = internal::SplitLutOf<1>();
  internal::SplitGatherWalk(x, x_stride, n, mask, d, d / 8, out0, m0, out1, m1,
                            [&](const float* xv, uint8_t mb, float* o0, float* o1) {
                              const __m256 v = _mm256_loadu_ps(xv);
                              _mm256_storeu_ps(o0, _mm256_permutevar8x32_ps(v, LoadLut(t.set[mb])));
                              _mm256_storeu_ps(o1,
                                               _mm256_permutevar8x32_ps(v, LoadLut(t.unset[mb])));
                            });
}

void SplitScatter(const float* in0, size_t m0, const float* in1, size_t m1, size_t n,
                  const uint8_t* mask, size_t d, float* x, size_t x_stride) {
  const internal::SplitLut<1>& t = internal::SplitLutOf<1>();
  internal::SplitScatterWalk(
      in0, m0, in1, m1, n, mask, d, d / 8, x, x_stride,
      [&](float* xv, uint8_t mb, const float* i0, const float* i1) {
        const __m256i rank = LoadLut(t.rank[mb]);
        const __m256 a = _mm256_permutevar8x32_ps(_mm256_loadu_ps(i0), rank);
        const __m256 b = _mm256_permutevar8x32_ps(_mm256_loadu_ps(i1), rank);
        const __m256 sel = _mm256_castsi256_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(t.sel[mb]))));
        _mm256_storeu_ps(xv, _mm256_blendv_ps(b, a, sel));
      });
}

// ---- split codecs fused per vector (simd_split.h) ----
//
// Haar subsets keep the batched products (MatVecTBatch), so they, and shapes the reference
// handles, take the batch-wise route through this table's kernels (SplitEncodeBatched).

// One subset's per-call state (simd_split.h).
struct VecCoder : simd::VecCoderBase<VecCoder, Tables, ForwardFn, InverseFn> {};
using EncodeVecFn = VecCoder::EncodeFn;
using DecodeVecFn = VecCoder::DecodeFn;

template <int kBits>
void EncodeVecFnT(const SubsetPlan& plan, const VecCoder& c, const float* xv, float norm,
                  float* z, uint8_t* norm_out, uint8_t* planes) {
  if (simd::EncodeDegenerate(plan, norm, norm_out, planes)) return;
  alignas(32) uint8_t idx[kMaxDim + 32];
  StoreNorm(EncodeVecWithNorm<kBits>(plan, c.t, c.forward, xv, norm, z, idx, planes),
            plan.norm_dtype, norm_out);
}

// kRegs (1..4) registers v * s as QuantizeGroup quantizes them from z: their kRegs bytes of each
// plane to planes + p * pb, the centroids' squares (norm correction) added to *csum in the same
// order: the split presets' subsets skip the route through z and idx (stores, then loads).
template <int kBits, int kRegs>
[[gnu::always_inline]] inline void QuantizeRegs(const SubsetPlan& plan, const Tables& t,
                                                const __m256* v, __m256 s, __m256* csum,
                                                uint8_t* planes, size_t pb) {
  __m256 zr[4];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) zr[r] = r < kRegs ? _mm256_mul_ps(v[r], s) : _mm256_setzero_ps();
  const __m256i idx = QuantizeIdx32<kBits, kRegs>(plan, t, zr, csum);
#pragma GCC unroll 8
  for (int p = 0; p < kBits; ++p) {
    const int mask = _mm256_movemask_epi8(_mm256_slli_epi16(idx, 7 - p));  // as PackPlanesFromBytes
    StorePlaneWord(planes + p * pb, kRegs, static_cast<uint32_t>(mask));
  }
}

inline void StoreNormWithCsum(const SubsetPlan& plan, float norm, __m256 csum, uint8_t* norm_out) {
  simd::StoreEncodedNorm<L>(plan, norm, plan.norm_correction ? L::Reduce(csum) : 0.0f, norm_out);
}

// Hadamard kinds with m = 8 R (R 1..8): rotation, scale and quantization in registers.
template <int kBits, int R, int kTwo>
void EncodeVecHadamard(const SubsetPlan& plan, const VecCoder& c, const float* xv, float norm,
                       float*, uint8_t* norm_out, uint8_t* planes) {
  if (simd::EncodeDegenerate(plan, norm, norm_out, planes)) return;
  __m256 v[R];
  simd::HadamardRegs<L, R, kTwo>(plan, xv, v);
  const __m256 s = _mm256_set1_ps(plan.enc_scale / norm);
  __m256 csum = _mm256_setzero_ps();
  internal::Unroll<(R + 3) / 4>([&](auto gc) {
    constexpr int g = decltype(gc)::value;
    QuantizeRegs<kBits, (R - 4 * g < 4 ? R - 4 * g : 4)>(plan, c.t, v + 4 * g, s, &csum,
                                                         planes + 4 * g, R);
  });
  StoreNormWithCsum(plan, norm, csum, norm_out);
}

// Kronecker with q = kQ blocks of 8 R (R 1..4): each block quantized as soon as it is mixed (a
// block is R bytes of each plane), so the 16 registers hold the blocks and one block's sums.
template <int kBits, int R, int kQ>
void EncodeVecKron(const SubsetPlan& plan, const VecCoder& c, const float* xv, float norm, float*,
                   uint8_t* norm_out, uint8_t* planes) {
  if (simd::EncodeDegenerate(plan, norm, norm_out, planes)) return;
  const __m256 s = _mm256_set1_ps(plan.enc_scale / norm);
  __m256 csum = _mm256_setzero_ps();
  simd::KronRegs<L, R, kQ>(plan, xv, [&](int a, const __m256* acc) {
    QuantizeRegs<kBits, R>(plan, c.t, acc, s, &csum, planes + a * R, kQ * R);
  });
  StoreNormWithCsum(plan, norm, csum, norm_out);
}

// The split presets' subsets (Hadamard up to 64 floats, Kronecker q = 3 with blocks up to 32) in
// registers; the rest through EncodeVecFnT.
template <int kBits>
EncodeVecFn PickEncodeVec(const SubsetPlan& p) {
  if (p.rotation == RotationKind::kKronecker) {
    if (p.dim != 3 * p.block) return EncodeVecFnT<kBits>;
    switch (p.block) {
      case 8: return EncodeVecKron<kBits, 1, 3>;
      case 16: return EncodeVecKron<kBits, 2, 3>;
      case 32: return EncodeVecKron<kBits, 4, 3>;
    }
    return EncodeVecFnT<kBits>;
  }
  if (p.rotation != RotationKind::kHadamard && p.rotation != RotationKind::kHadamard2) {
    return EncodeVecFnT<kBits>;
  }
  const bool two = p.rotation == RotationKind::kHadamard2;
  switch (p.dim) {
    case 8: return two ? EncodeVecHadamard<kBits, 1, 1> : EncodeVecHadamard<kBits, 1, 0>;
    case 16: return two ? EncodeVecHadamard<kBits, 2, 1> : EncodeVecHadamard<kBits, 2, 0>;
    case 32: return two ? EncodeVecHadamard<kBits, 4, 1> : EncodeVecHadamard<kBits, 4, 0>;
    case 64: return two ? EncodeVecHadamard<kBits, 8, 1> : EncodeVecHadamard<kBits, 8, 0>;
  }
  return EncodeVecFnT<kBits>;
}

template <int kBits>
void DecodeVecFnT(const SubsetPlan& plan, const VecCoder& c, const uint8_t* norm_in,
                  const uint8_t* planes, float* vbuf, float* out) {
  alignas(32) uint8_t idx[kMaxDim + 32];
  DequantizeVec<kBits>(plan, c.t, norm_in, planes, idx, vbuf);
  c.inverse(plan, vbuf, out);
}

struct Coders {
  using L = avx2::Lanes;
  using VecCoder = ::tqkv::kernels::VecCoder;
  static void Init(const SubsetPlan& p, VecCoder* c) {
    using PickFn = EncodeVecFn (*)(const SubsetPlan&);
    static constexpr PickFn kEnc[8] = {PickEncodeVec<1>, PickEncodeVec<2>, PickEncodeVec<3>,
                                       PickEncodeVec<4>, PickEncodeVec<5>, PickEncodeVec<6>,
                                       PickEncodeVec<7>, PickEncodeVec<8>};
    static constexpr DecodeVecFn kDec[8] = {DecodeVecFnT<1>, DecodeVecFnT<2>, DecodeVecFnT<3>,
                                            DecodeVecFnT<4>, DecodeVecFnT<5>, DecodeVecFnT<6>,
                                            DecodeVecFnT<7>, DecodeVecFnT<8>};
    InitTables(p, &c->t);
    c->forward = simd::PickForwardFn<L>(p);
    c->inverse = simd::PickInverseFn<L>(p);
    c->encode = kEnc[p.bits - 1](p);
    c->decode = kDec[p.bits - 1];
  }
  static bool Fusable(const SubsetPlan& p) {
    return Vectorised(p) && p.rotation != RotationKind::kHaar;
  }
};

void SplitEncode(const SplitPlan& sp, const void* x, DType dtype, size_t x_stride, size_t n,
                 const uint8_t* mask, uint8_t* code, size_t code_stride) {
  if (simd::SplitEncode<Coders>(sp, x, dtype, x_stride, n, mask, code, code_stride)) return;
  SplitEncodeBatched(internal::Avx2Table(), sp, x, dtype, x_stride, n, mask, code, code_stride);
}

void SplitDecode(const SplitPlan& sp, const uint8_t* code, size_t code_stride, size_t n,
                 const uint8_t* mask, void* x, DType dtype, size_t x_stride) {
  if (simd::SplitDecode<Coders>(sp, code, code_stride, n, mask, x, dtype, x_stride)) return;
  SplitDecodeBatched(internal::Avx2Table(), sp, code, code_stride, n, mask, x, dtype, x_stride);
}

void ChannelEnergy(const void* x, DType dtype, size_t n, size_t stride, size_t d,
                   double* energy) {
  simd::ChannelEnergy<L>(ScalarKernels(), x, dtype, n, stride, d, energy);
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
                                 simd::AddScaled<L>, nullptr, nullptr, Avx2GatherAffine, Dequantize,
                                 Avx2TransformAssemble, Avx2TransformDecode, EncodeUnit,
                                 Whiten, UnitMoments};
  return table;
}
}  // namespace internal

}  // namespace tqkv::kernels
