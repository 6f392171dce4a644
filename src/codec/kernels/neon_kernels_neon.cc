// Arm NEON (AArch64) kernels. Every result is bit-identical to ref.cc: the same operations in the
// same order, four lanes at a time.
//
// NEON and the f16 conversions are part of the AArch64 base ISA, so this file needs no target
// flags; CMake compiles it only for aarch64 targets. Rounding: vfmaq_f32 / vfmaq_n_f32 are fused
// (one rounding) and appear exactly where the reference calls std::fma (MatVec, KronMix) and in the
// in-register FWHT stages, where the product is by +-1 and exact. Everywhere else products and sums
// are separate vmulq / vaddq; vmlaq_f32 is avoided (GCC spells it a + b * c, which may contract).
#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "codec/kernels/internal.h"
#include "codec/kernels/kernels.h"

namespace tqkv::kernels {
namespace {

// ---- element conversions ----

void ToF32(const void* src, DType dtype, size_t n, float* dst) {
  if (dtype == DType::kF32) {
    std::memmove(dst, src, n * sizeof(float));
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  size_t i = 0;
  if (dtype == DType::kF16) {
    // FCVT half -> single is exact; NaNs come back quiet with their payload, as HalfToFloat.
    for (; i + 8 <= n; i += 8) {
      const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(s + i));
      vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
      vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
    }
  } else if (dtype == DType::kBF16) {
    for (; i + 8 <= n; i += 8) {
      const uint16x8_t h = vld1q_u16(s + i);
      vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)));
      vst1q_f32(dst + i + 4, vreinterpretq_f32_u32(vshll_high_n_u16(h, 16)));
    }
  }
  ScalarKernels().to_f32(s + i, dtype, n - i, dst + i);
}

// Same rounding as FloatToBF16: nearest even, NaN keeps its top bits with the quiet bit set.
inline uint16x4_t FloatToBF16x4(float32x4_t f) {
  const uint32x4_t x = vreinterpretq_u32_f32(f);
  const uint32x4_t abs = vandq_u32(x, vdupq_n_u32(0x7FFFFFFFu));
  const uint32x4_t is_nan = vcgtq_u32(abs, vdupq_n_u32(0x7F800000u));
  const uint32x4_t odd = vandq_u32(vshrq_n_u32(x, 16), vdupq_n_u32(1));
  const uint32x4_t rounded = vaddq_u32(x, vaddq_u32(odd, vdupq_n_u32(0x7FFFu)));
  const uint32x4_t nan = vorrq_u32(x, vdupq_n_u32(0x400000u));  // (x >> 16) | 0x40 after the shift
  return vshrn_n_u32(vbslq_u32(is_nan, nan, rounded), 16);
}

// FCVT single -> half rounds by FPCR (nearest even: Linux never changes it) and quiets NaNs
// keeping the top payload bits, as FloatToHalf.
inline uint16x8_t FloatToHalfx8(float32x4_t lo, float32x4_t hi) {
  return vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(lo), hi));
}

void FromF32(const float* src, size_t n, DType dtype, void* dst) {
  if (dtype == DType::kF32) {
    std::memmove(dst, src, n * sizeof(float));
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  size_t i = 0;
  if (dtype == DType::kF16) {
    for (; i + 8 <= n; i += 8) {
      vst1q_u16(d + i, FloatToHalfx8(vld1q_f32(src + i), vld1q_f32(src + i + 4)));
    }
  } else if (dtype == DType::kBF16) {
    for (; i + 8 <= n; i += 8) {
      vst1q_u16(d + i, vcombine_u16(FloatToBF16x4(vld1q_f32(src + i)),
                                    FloatToBF16x4(vld1q_f32(src + i + 4))));
    }
  }
  ScalarKernels().from_f32(src + i, n - i, dtype, d + i);
}

// ---- arithmetic primitives ----

// The reference's reduction tree ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)) of lanes 0-3 (lo) and
// 4-7 (hi).
inline float ReduceSum8(float32x4_t lo, float32x4_t hi) {
  const float32x4_t t = vaddq_f32(lo, hi);                             // a0+a4 a1+a5 a2+a6 a3+a7
  const float32x2_t u = vadd_f32(vget_low_f32(t), vget_high_f32(t));  // (a0+a4)+(a2+a6), ...
  return vget_lane_f32(u, 0) + vget_lane_f32(u, 1);
}

// Sum8 of m floats, m a multiple of 8: two registers are the eight accumulators (lane k of lo
// takes i % 8 == k, lane k of hi i % 8 == k + 4).
inline float Sum8Squares(const float* v, size_t m) {
  float32x4_t lo = vdupq_n_f32(0.0f), hi = vdupq_n_f32(0.0f);
  for (size_t i = 0; i < m; i += 8) {
    const float32x4_t a = vld1q_f32(v + i), b = vld1q_f32(v + i + 4);
    lo = vaddq_f32(lo, vmulq_f32(a, a));
    hi = vaddq_f32(hi, vmulq_f32(b, b));
  }
  return ReduceSum8(lo, hi);
}

inline void MulInto(const float* a, const float* b, size_t m, float* out) {
  for (size_t j = 0; j < m; j += 4) {
    vst1q_f32(out + j, vmulq_f32(vld1q_f32(a + j), vld1q_f32(b + j)));
  }
}

// FWHT stages h = 1, 2 inside a register. Lane i of a pair takes a + b or a - b; here
// fma(self, +-1, partner): the product is exact, so one rounding of partner + self or
// partner - self, equal bit for bit to the reference's a + b and a - b (NaN payloads aside).
inline float32x4_t FwhtIn4(float32x4_t x) {
  const float32x4_t s1 = {1.0f, -1.0f, 1.0f, -1.0f};
  const float32x4_t s2 = {1.0f, 1.0f, -1.0f, -1.0f};
  x = vfmaq_f32(vrev64q_f32(x), x, s1);
  x = vfmaq_f32(vextq_f32(x, x, 2), x, s2);
  return x;
}

// Every stage below 4 * R of blocks of 4 * R floats, the block in R registers.
template <int R>
inline void FwhtBlocks(float* y, size_t m) {
  for (size_t b0 = 0; b0 < m; b0 += 4 * R) {
    float32x4_t v[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) v[r] = FwhtIn4(vld1q_f32(y + b0 + 4 * r));
#pragma GCC unroll 8
    for (int k = 1; k < R; k <<= 1) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        if (r & k) continue;
        const float32x4_t a = v[r], b = v[r + k];
        v[r] = vaddq_f32(a, b);
        v[r + k] = vsubq_f32(a, b);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) vst1q_f32(y + b0 + 4 * r, v[r]);
  }
}

// Unnormalised FWHT of m floats in place, m a power of two >= 4. The stages below 32 run on
// 32-float blocks in registers, the larger ones as passes over memory. A stage below 32 never
// pairs elements of different blocks, so every element sees its stages in the reference's order.
void Fwht(float* y, size_t m) {
  switch (m) {
    case 4: return FwhtBlocks<1>(y, m);
    case 8: return FwhtBlocks<2>(y, m);
    case 16: return FwhtBlocks<4>(y, m);
    default: FwhtBlocks<8>(y, m);
  }
  for (size_t h = 32; h < m; h <<= 1) {
    for (size_t i = 0; i < m; i += 2 * h) {
      for (size_t j = i; j < i + h; j += 4) {
        const float32x4_t a = vld1q_f32(y + j), b = vld1q_f32(y + j + h);
        vst1q_f32(y + j, vaddq_f32(a, b));
        vst1q_f32(y + j + h, vsubq_f32(a, b));
      }
    }
  }
}

// y = M x with mt = M^T row-major; y_j = fma(mt[i][j], x_i, y_j) for i in order. Blocks of 32
// outputs keep the accumulators in registers; blocking changes no lane's order.
void MatVecT(const float* mt, const float* x, size_t m, float* y) {
  size_t j0 = 0;
  for (; j0 + 32 <= m; j0 += 32) {
    float32x4_t acc[8];
    for (int r = 0; r < 8; ++r) acc[r] = vdupq_n_f32(0.0f);
    for (size_t i = 0; i < m; ++i) {
      const float xi = x[i];
      const float* row = mt + i * m + j0;
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) acc[r] = vfmaq_n_f32(acc[r], vld1q_f32(row + 4 * r), xi);
    }
    for (int r = 0; r < 8; ++r) vst1q_f32(y + j0 + 4 * r, acc[r]);
  }
  for (; j0 < m; j0 += 4) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (size_t i = 0; i < m; ++i) acc = vfmaq_n_f32(acc, vld1q_f32(mt + i * m + j0), x[i]);
    vst1q_f32(y + j0, acc);
  }
}

// y = (M (x) I_B) x, mt = M^T (q*q row-major), B a multiple of 4: for each output, the q fmas in
// the reference's order (a' ascending), four outputs of a block per register.
void KronMix(const float* mt, const float* x, size_t q, size_t block, float* y) {
  for (size_t a = 0; a < q; ++a) {
    size_t b = 0;
    for (; b + 16 <= block; b += 16) {
      float32x4_t acc[4];
      for (int r = 0; r < 4; ++r) acc[r] = vdupq_n_f32(0.0f);
      for (size_t a2 = 0; a2 < q; ++a2) {
        const float w = mt[a2 * q + a];
        const float* xb = x + a2 * block + b;
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) acc[r] = vfmaq_n_f32(acc[r], vld1q_f32(xb + 4 * r), w);
      }
      for (int r = 0; r < 4; ++r) vst1q_f32(y + a * block + b + 4 * r, acc[r]);
    }
    for (; b < block; b += 4) {
      float32x4_t acc = vdupq_n_f32(0.0f);
      for (size_t a2 = 0; a2 < q; ++a2) {
        acc = vfmaq_n_f32(acc, vld1q_f32(x + a2 * block + b), mt[a2 * q + a]);
      }
      vst1q_f32(y + a * block + b, acc);
    }
  }
}

// ---- quantize, bit planes ----

// Up to 5 bits every threshold is compared; beyond, a coarse count over every group-th threshold
// (15 compares) picks a group, then a binary search with lane loads finishes it (thresholds
// ascend, so with count c the coarse compares give c / group and the search c % group).
constexpr int GroupShift(int bits) { return bits > 5 ? bits - 4 : 0; }
constexpr int CoarseCount(int bits) { return bits > 5 ? 15 : (1 << bits) - 1; }

struct Coarse {
  float32x4_t t[31];  // broadcast thresholds t[group * k + group - 1]
};

void InitCoarse(const SubsetPlan& p, Coarse* c) {
  const int bits = static_cast<int>(p.bits);
  const uint32_t group = 1u << GroupShift(bits);
  for (int k = 0; k < CoarseCount(bits); ++k) {
    c->t[k] = vdupq_n_f32(p.thresholds[group * k + group - 1]);
  }
}

inline float32x4_t Gather4(const float* t, uint32x4_t i) {
  const float32x4_t r = {t[vgetq_lane_u32(i, 0)], t[vgetq_lane_u32(i, 1)],
                         t[vgetq_lane_u32(i, 2)], t[vgetq_lane_u32(i, 3)]};
  return r;
}

// Number of thresholds strictly below each lane of z (ordered compares: NaN counts 0).
template <int kBits>
inline uint32x4_t Quantize4(const float* thresholds, const Coarse& c, float32x4_t z) {
  constexpr int kShift = GroupShift(kBits);
  constexpr int kCoarse = CoarseCount(kBits);
  uint32x4_t idx = vdupq_n_u32(0);
#pragma GCC unroll 31
  for (int k = 0; k < kCoarse; ++k) idx = vsubq_u32(idx, vcltq_f32(c.t[k], z));
  if constexpr (kShift > 0) {
    idx = vshlq_n_u32(idx, kShift);
    for (uint32_t step = 1u << (kShift - 1); step > 0; step >>= 1) {
      // Is t[idx + step - 1] below z? Then at least idx + step thresholds are.
      const float32x4_t tv = Gather4(thresholds, vaddq_u32(idx, vdupq_n_u32(step - 1)));
      idx = vaddq_u32(idx, vandq_u32(vcltq_f32(tv, z), vdupq_n_u32(step)));
    }
  }
  return idx;
}

// idx[j] for z[j] = y[j] * s, j < m (m a multiple of 8).
template <int kBits>
void QuantizeVec(const float* thresholds, const Coarse& c, const float* y, float s, size_t m,
                 uint8_t* idx) {
  const float32x4_t sv = vdupq_n_f32(s);
  for (size_t j = 0; j < m; j += 8) {
    const uint32x4_t lo = Quantize4<kBits>(thresholds, c, vmulq_f32(vld1q_f32(y + j), sv));
    const uint32x4_t hi = Quantize4<kBits>(thresholds, c, vmulq_f32(vld1q_f32(y + j + 4), sv));
    vst1_u8(idx + j, vmovn_u16(vcombine_u16(vmovn_u32(lo), vmovn_u32(hi))));
  }
}

const uint8x8_t kBitOfLane = {1, 2, 4, 8, 16, 32, 64, 128};

// Plane p, byte j / 8, bit j % 8 = bit p of idx[j]; m a multiple of 8.
void PackPlanes(const uint8_t* idx, size_t m, uint32_t bits, uint8_t* planes) {
  const size_t pb = m / 8;
  for (size_t c = 0; c < m; c += 8) {
    const uint8x8_t v = vld1_u8(idx + c);
    for (uint32_t p = 0; p < bits; ++p) {
      const uint8x8_t on = vtst_u8(v, vdup_n_u8(static_cast<uint8_t>(1u << p)));
      planes[p * pb + c / 8] = vaddv_u8(vand_u8(on, kBitOfLane));
    }
  }
}

void UnpackPlanes(const uint8_t* planes, size_t m, uint32_t bits, uint8_t* idx) {
  const size_t pb = m / 8;
  for (size_t c = 0; c < m; c += 8) {
    uint8x8_t acc = vdup_n_u8(0);
    for (uint32_t p = 0; p < bits; ++p) {
      const uint8x8_t on = vtst_u8(vdup_n_u8(planes[p * pb + c / 8]), kBitOfLane);
      acc = vorr_u8(acc, vand_u8(on, vdup_n_u8(static_cast<uint8_t>(1u << p))));
    }
    vst1_u8(idx + c, acc);
  }
}

// v[j] = centroids[idx[j]] * a. Up to 4 bits the 16 products c_k * a (the same products) sit in
// four registers and a byte table look-up (TBL) picks each lane's four bytes.
void Dequantize(const SubsetPlan& p, const uint8_t* idx, float a, float* v) {
  const size_t m = p.dim;
  if (p.bits > 4) {
    for (size_t j = 0; j < m; ++j) v[j] = p.centroids[idx[j]] * a;
    return;
  }
  alignas(16) float cent[16] = {};
  std::copy(p.centroids, p.centroids + (size_t{1} << p.bits), cent);
  const float32x4_t av = vdupq_n_f32(a);
  uint8x16x4_t tab;
  tab.val[0] = vreinterpretq_u8_f32(vmulq_f32(vld1q_f32(cent), av));
  tab.val[1] = vreinterpretq_u8_f32(vmulq_f32(vld1q_f32(cent + 4), av));
  tab.val[2] = vreinterpretq_u8_f32(vmulq_f32(vld1q_f32(cent + 8), av));
  tab.val[3] = vreinterpretq_u8_f32(vmulq_f32(vld1q_f32(cent + 12), av));
  const uint8x16_t spread_lo = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
  const uint8x16_t spread_hi = {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7};
  const uint8x16_t byte = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
  for (size_t j = 0; j < m; j += 8) {
    const uint8x16_t q = vcombine_u8(vld1_u8(idx + j), vdup_n_u8(0));
    const uint8x16_t lo = vorrq_u8(vshlq_n_u8(vqtbl1q_u8(q, spread_lo), 2), byte);
    const uint8x16_t hi = vorrq_u8(vshlq_n_u8(vqtbl1q_u8(q, spread_hi), 2), byte);
    vst1q_f32(v + j, vreinterpretq_f32_u8(vqtbl4q_u8(tab, lo)));
    vst1q_f32(v + j + 4, vreinterpretq_f32_u8(vqtbl4q_u8(tab, hi)));
  }
}

using internal::LoadNorm;
using internal::StoreNorm;

// ---- encode / decode ----
//
// Shapes handled here: dim a multiple of 8 up to kMaxDim; Hadamard kinds a power of two;
// Kronecker blocks a power of two of at least 4 (whole registers). Others go to the reference.

constexpr size_t kMaxDim = 1024;

bool Vectorised(const SubsetPlan& p) {
  if (p.dim == 0 || p.dim % 8 != 0 || p.dim > kMaxDim || p.bits < 1 || p.bits > 8) return false;
  if (p.thresholds == nullptr || p.centroids == nullptr) return false;
  if (p.rotation == RotationKind::kHaar) return p.haar != nullptr && p.haar_t != nullptr;
  if (p.rotation == RotationKind::kKronecker) {
    return p.haar != nullptr && p.haar_t != nullptr && p.signs1 != nullptr && p.block >= 4 &&
           (p.block & (p.block - 1)) == 0 && p.dim % p.block == 0;
  }
  if (p.rotation != RotationKind::kHadamard && p.rotation != RotationKind::kHadamard2) return false;
  if (p.signs1 == nullptr || (p.rotation == RotationKind::kHadamard2 && p.signs2 == nullptr)) {
    return false;
  }
  return (p.dim & (p.dim - 1)) == 0;
}

// Per-vector scratch, 16-byte aligned.
struct Scratch {
  alignas(16) float y[kMaxDim];
  alignas(16) float t[kMaxDim];
  alignas(16) uint8_t idx[kMaxDim];
};

// The rotation of the encoder: y = R x (before the 1 / norm scale).
void Forward(const SubsetPlan& p, const float* x, float* y, float* tmp) {
  const size_t m = p.dim;
  switch (p.rotation) {
    case RotationKind::kHaar:
      MatVecT(p.haar_t, x, m, y);
      return;
    case RotationKind::kKronecker:
      MulInto(x, p.signs1, m, tmp);
      for (size_t j = 0; j < m; j += p.block) Fwht(tmp + j, p.block);
      KronMix(p.haar_t, tmp, m / p.block, p.block, y);
      return;
    default:
      MulInto(x, p.signs1, m, y);
      Fwht(y, m);
      if (p.rotation == RotationKind::kHadamard2) {
        MulInto(y, p.signs2, m, y);
        Fwht(y, m);
      }
      return;
  }
}

// The decoder's inverse rotation of v (scratch, overwritten) into out.
void Inverse(const SubsetPlan& p, float* v, float* tmp, float* out) {
  const size_t m = p.dim;
  switch (p.rotation) {
    case RotationKind::kHaar:
      MatVecT(p.haar, v, m, out);
      return;
    case RotationKind::kKronecker:
      KronMix(p.haar, v, m / p.block, p.block, tmp);
      for (size_t j = 0; j < m; j += p.block) Fwht(tmp + j, p.block);
      MulInto(tmp, p.signs1, m, out);
      return;
    default:
      Fwht(v, m);
      if (p.rotation == RotationKind::kHadamard2) {
        MulInto(v, p.signs2, m, v);
        Fwht(v, m);
      }
      MulInto(v, p.signs1, m, out);
      return;
  }
}

template <int kBits>
void EncodeBits(const SubsetPlan& plan, const float* x, size_t x_stride, size_t n,
                uint8_t* norm_out, uint8_t* planes_out, size_t code_stride) {
  const size_t m = plan.dim;
  Coarse coarse;
  InitCoarse(plan, &coarse);
  Scratch s;
  for (size_t v = 0; v < n; ++v) {
    const float* xv = x + v * x_stride;
    uint8_t* norm_v = norm_out + v * code_stride;
    uint8_t* planes_v = planes_out + v * code_stride;
    const float norm = std::sqrt(Sum8Squares(xv, m));
    if (norm == 0.0f || !std::isfinite(norm)) {
      StoreNorm(norm == 0.0f ? 0.0f : std::numeric_limits<float>::quiet_NaN(), plan.norm_dtype,
                norm_v);
      std::memset(planes_v, 0, plan.planes_bytes());
      continue;
    }
    Forward(plan, xv, s.y, s.t);
    QuantizeVec<kBits>(plan.thresholds, coarse, s.y, plan.enc_scale / norm, m, s.idx);
    float stored = norm;
    if (plan.norm_correction) {
      for (size_t j = 0; j < m; ++j) s.t[j] = plan.centroids[s.idx[j]];
      stored = norm * std::sqrt(static_cast<float>(m) / Sum8Squares(s.t, m));
    }
    StoreNorm(stored, plan.norm_dtype, norm_v);
    PackPlanes(s.idx, m, kBits, planes_v);
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

void Decode(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
            size_t code_stride, size_t n, float* out, size_t out_stride) {
  if (!Vectorised(plan)) {
    ScalarKernels().decode(plan, norm_in, planes_in, code_stride, n, out, out_stride);
    return;
  }
  Scratch s;
  for (size_t k = 0; k < n; ++k) {
    const float a = LoadNorm(norm_in + k * code_stride, plan.norm_dtype) * plan.dec_scale;
    UnpackPlanes(planes_in + k * code_stride, plan.dim, plan.bits, s.idx);
    Dequantize(plan, s.idx, a, s.y);
    Inverse(plan, s.y, s.t, out + k * out_stride);
  }
}

// ---- split codecs ----

// Gather and scatter move 8 channels (one mask byte) per step with byte table look-ups (TBL over
// the 32 bytes of 8 floats); the tables hold byte indices per mask byte.
struct SplitLut {
  uint8_t set[256][32];    // bytes of the lanes whose bit is set, ascending (then padding)
  uint8_t unset[256][32];  // bytes of the lanes whose bit is clear, ascending (then padding)
  uint8_t rank[256][32];   // lane l's bytes: its rank among the set or among the clear lanes
  uint8_t sel[256][32];    // 0xFF in the bytes of the lanes whose bit is set
};

const SplitLut& Lut() {
  static const SplitLut lut = [] {
    SplitLut t{};
    for (int mb = 0; mb < 256; ++mb) {
      int a = 0, b = 0;
      for (int l = 0; l < 8; ++l) {
        const bool set = (mb >> l) & 1;
        const int rank = set ? a++ : b++;
        uint8_t* dst = set ? t.set[mb] : t.unset[mb];
        for (int k = 0; k < 4; ++k) {
          dst[4 * rank + k] = static_cast<uint8_t>(4 * l + k);
          t.rank[mb][4 * l + k] = static_cast<uint8_t>(4 * rank + k);
          t.sel[mb][4 * l + k] = set ? 0xFF : 0x00;
        }
      }
    }
    return t;
  }();
  return lut;
}

inline uint8x16x2_t Load8AsBytes(const float* p) {
  uint8x16x2_t t;
  t.val[0] = vreinterpretq_u8_f32(vld1q_f32(p));
  t.val[1] = vreinterpretq_u8_f32(vld1q_f32(p + 4));
  return t;
}

// Eight floats picked from `t` by 32 byte indices.
inline void Store8Picked(float* out, const uint8x16x2_t& t, const uint8_t* bytes) {
  vst1q_f32(out, vreinterpretq_f32_u8(vqtbl2q_u8(t, vld1q_u8(bytes))));
  vst1q_f32(out + 4, vreinterpretq_f32_u8(vqtbl2q_u8(t, vld1q_u8(bytes + 16))));
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
      const uint8x16x2_t v = Load8AsBytes(xv + 8 * k);
      Store8Picked(o0, v, t.set[mb]);
      Store8Picked(o1, v, t.unset[mb]);
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
  for (size_t i = 0; i < n; ++i) {
    float* xv = x + i * x_stride;
    const float* i0 = in0 + i * m0;
    const float* i1 = in1 + i * m1;
    for (size_t k = 0; k < full; ++k) {
      const uint8_t mb = mask[k];
      const uint8x16x2_t a = Load8AsBytes(i0), b = Load8AsBytes(i1);
      for (int h = 0; h < 2; ++h) {
        const uint8x16_t rank = vld1q_u8(t.rank[mb] + 16 * h);
        const uint8x16_t picked = vbslq_u8(vld1q_u8(t.sel[mb] + 16 * h), vqtbl2q_u8(a, rank),
                                           vqtbl2q_u8(b, rank));
        vst1q_f32(xv + 8 * k + 4 * h, vreinterpretq_f32_u8(picked));
      }
      const int cnt = __builtin_popcount(mb);
      i0 += cnt;
      i1 += 8 - cnt;
    }
    for (size_t c = 8 * full; c < d; ++c) xv[c] = ((mask[c / 8] >> (c % 8)) & 1u) ? *i0++ : *i1++;
  }
}

// Split codecs batch-wise: kSplitChunk vectors converted and gathered, then each subset encoded
// (or decoded, scattered and converted) by this table's kernels.
constexpr size_t kSplitChunk = 16;

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

void SplitEncode(const SplitPlan& sp, const void* x, DType dtype, size_t x_stride, size_t n,
                 const uint8_t* mask, uint8_t* code, size_t code_stride) {
  if (n == 0) return;
  const size_t m0 = sp.sub[0].dim, m1 = sp.sub[1].dim, d = m0 + m1;
  const size_t pitch = x_stride * DTypeSize(dtype);
  const auto* src = static_cast<const uint8_t*>(x);
  SplitBatches(sp, n, [&](size_t i, size_t cnt, float* xf, float* g0, float* g1) {
    for (size_t r = 0; r < cnt; ++r) ToF32(src + (i + r) * pitch, dtype, d, xf + r * d);
    uint8_t* c = code + i * code_stride;
    SplitGather(xf, d, cnt, mask, d, g0, m0, g1, m1);
    Encode(sp.sub[0], g0, m0, cnt, c + sp.norm_offset[0], c + sp.planes_offset[0], code_stride);
    Encode(sp.sub[1], g1, m1, cnt, c + sp.norm_offset[1], c + sp.planes_offset[1], code_stride);
  });
}

void SplitDecode(const SplitPlan& sp, const uint8_t* code, size_t code_stride, size_t n,
                 const uint8_t* mask, void* x, DType dtype, size_t x_stride) {
  if (n == 0) return;
  const size_t m0 = sp.sub[0].dim, m1 = sp.sub[1].dim, d = m0 + m1;
  const size_t pitch = x_stride * DTypeSize(dtype);
  auto* dst = static_cast<uint8_t*>(x);
  SplitBatches(sp, n, [&](size_t i, size_t cnt, float* xf, float* g0, float* g1) {
    const uint8_t* c = code + i * code_stride;
    Decode(sp.sub[0], c + sp.norm_offset[0], c + sp.planes_offset[0], code_stride, cnt, g0, m0);
    Decode(sp.sub[1], c + sp.norm_offset[1], c + sp.planes_offset[1], code_stride, cnt, g1, m1);
    SplitScatter(g0, m0, g1, m1, cnt, mask, d, xf, d);
    for (size_t r = 0; r < cnt; ++r) FromF32(xf + r * d, d, dtype, dst + (i + r) * pitch);
  });
}

// ---- channel energy, mean-removed keys ----

// Four channels of a row as floats, exactly as ToF32 converts them.
template <DType kT>
inline float32x4_t Load4AsFloat(const uint8_t* row, size_t c) {
  if constexpr (kT == DType::kF32) return vld1q_f32(reinterpret_cast<const float*>(row) + c);
  const uint16x4_t h = vld1_u16(reinterpret_cast<const uint16_t*>(row) + c);
  if constexpr (kT == DType::kF16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
  return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

// energy[c] += double(x)^2, vector after vector: the product of two floats' doubles is exact, then
// one rounding of the add (vmulq_f64 then vaddq_f64, never fused).
template <DType kT>
void ChannelEnergyT(const uint8_t* src, size_t n, size_t pitch, size_t d, double* energy) {
  const size_t d4 = d & ~size_t{3};
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* row = src + i * pitch;
    for (size_t c = 0; c < d4; c += 4) {
      const float32x4_t f = Load4AsFloat<kT>(row, c);
      const float64x2_t lo = vcvt_f64_f32(vget_low_f32(f));
      const float64x2_t hi = vcvt_high_f64_f32(f);
      vst1q_f64(energy + c, vaddq_f64(vld1q_f64(energy + c), vmulq_f64(lo, lo)));
      vst1q_f64(energy + c + 2, vaddq_f64(vld1q_f64(energy + c + 2), vmulq_f64(hi, hi)));
    }
    for (size_t c = d4; c < d; ++c) {
      const double v = LoadAsFloat(row, kT, c);
      energy[c] += v * v;
    }
  }
}

void ChannelEnergy(const void* x, DType dtype, size_t n, size_t stride, size_t d,
                   double* energy) {
  const auto* src = static_cast<const uint8_t*>(x);
  const size_t pitch = stride * DTypeSize(dtype);
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

// mul then add, never fused: the reference rounds the product first.
void AddScaled(const float* mean, const float* scale, size_t n, size_t d, float* x,
               size_t x_stride) {
  for (size_t i = 0; i < n; ++i) {
    float* xv = x + i * x_stride;
    const float a = scale[i];
    size_t j = 0;
    for (; j + 4 <= d; j += 4) {
      const float32x4_t p = vmulq_n_f32(vld1q_f32(mean + j), a);
      vst1q_f32(xv + j, vaddq_f32(vld1q_f32(xv + j), p));
    }
    for (; j < d; ++j) xv[j] += a * mean[j];
  }
}

}  // namespace

namespace internal {
const KernelTable& NeonTable() {
  static const KernelTable table{"neon", ToF32, FromF32, Encode, Decode, SplitGather,
                                 SplitScatter, SplitEncode, SplitDecode, ChannelEnergy,
                                 AddScaled, nullptr, nullptr, ref::GatherAffine, nullptr, nullptr,
                                 nullptr, ScalarKernels().encode_unit, ScalarKernels().whiten,
                                 ScalarKernels().unit_moments};
  return table;
}
}  // namespace internal

}  // namespace tqkv::kernels
