// Arm NEON (AArch64) kernels. Every result is bit-identical to ref.cc: the same operations in the
// same order, four lanes at a time. The rotations and the per-vector loops are the shared
// templates (simd_*.h) at four lanes (neon::Lanes below); quantization, bit planes, the Haar
// product and the split movement are this file's.
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

#include "codec/kernels/internal.h"
#include "codec/kernels/kernels.h"
#include "codec/kernels/simd_rotation.h"
#include "codec/kernels/simd_vectors.h"

namespace tqkv::kernels {
namespace neon {

// 4 lanes (simd_rotation.h).
struct Lanes {
  using V = float32x4_t;
  struct S8 {  // Sum8's eight accumulators: lanes 0-3 (lo) and 4-7 (hi)
    float32x4_t lo, hi;
  };
  struct DV {  // four doubles
    float64x2_t lo, hi;
  };
  static constexpr int kN = 4;
  static constexpr int kDN = 4;
  static constexpr int kFwhtRegs = 8;    // FwhtRegs: register stages up to 8 registers (32 floats)
  static constexpr int kEnergyRegs = 0;  // channel energy: sums stay in memory

  static V Zero() { return vdupq_n_f32(0.0f); }
  static V Set1(float f) { return vdupq_n_f32(f); }
  static V Load(const float* p) { return vld1q_f32(p); }
  static V LoadA(const float* p) { return vld1q_f32(p); }
  static void Store(float* p, V v) { vst1q_f32(p, v); }
  static void StoreA(float* p, V v) { vst1q_f32(p, v); }
  static V Add(V a, V b) { return vaddq_f32(a, b); }
  static V Sub(V a, V b) { return vsubq_f32(a, b); }
  static V Mul(V a, V b) { return vmulq_f32(a, b); }
  static V Fma(V a, V b, V c) { return vfmaq_f32(c, a, b); }  // a * b + c, one rounding

  // FWHT stages h = 1, 2 inside a register. Lane i of a pair takes a + b or a - b; here
  // fma(self, +-1, partner): the product is exact, so one rounding of partner + self or
  // partner - self, equal bit for bit to the reference's a + b and a - b (NaN payloads aside).
  [[gnu::always_inline]] static V FwhtIn(V x) {
    const float32x4_t s1 = {1.0f, -1.0f, 1.0f, -1.0f};
    const float32x4_t s2 = {1.0f, 1.0f, -1.0f, -1.0f};
    x = vfmaq_f32(vrev64q_f32(x), x, s1);
    x = vfmaq_f32(vextq_f32(x, x, 2), x, s2);
    return x;
  }

  // Sum8 (kernels.h): lane k of lo takes i % 8 == k, lane k of hi i % 8 == k + 4.
  static constexpr int kSumStep = 8;
  static S8 S8Zero() { return {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; }
  static S8 AddSquaresAt(S8 acc, const float* p) {
    const float32x4_t a = vld1q_f32(p), b = vld1q_f32(p + 4);
    return {vaddq_f32(acc.lo, vmulq_f32(a, a)), vaddq_f32(acc.hi, vmulq_f32(b, b))};
  }
  // The reference's reduction tree ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
  static float Reduce(S8 acc) {
    const float32x4_t t = vaddq_f32(acc.lo, acc.hi);                     // a0+a4 .. a3+a7
    const float32x2_t u = vadd_f32(vget_low_f32(t), vget_high_f32(t));  // (a0+a4)+(a2+a6), ..
    return vget_lane_f32(u, 0) + vget_lane_f32(u, 1);
  }
  static float Sqrt(float x) { return std::sqrt(x); }

  // Four elements of kT from element c as doubles, converted exactly.
  template <DType kT>
  static DV LoadAsDouble(const void* row, size_t c) {
    float32x4_t f;
    if constexpr (kT == DType::kF32) {
      f = vld1q_f32(static_cast<const float*>(row) + c);
    } else {
      const uint16x4_t h = vld1_u16(static_cast<const uint16_t*>(row) + c);
      if constexpr (kT == DType::kF16) {
        f = vcvt_f32_f16(vreinterpret_f16_u16(h));
      } else {
        f = vreinterpretq_f32_u32(vshll_n_u16(h, 16));
      }
    }
    return {vcvt_f64_f32(vget_low_f32(f)), vcvt_high_f64_f32(f)};
  }
  static DV LoadD(const double* p) { return {vld1q_f64(p), vld1q_f64(p + 2)}; }
  static void StoreD(double* p, DV v) {
    vst1q_f64(p, v.lo);
    vst1q_f64(p + 2, v.hi);
  }
  // The product of two floats' doubles is exact; vmulq_f64 then vaddq_f64, never fused.
  static DV AddD(DV a, DV b) { return {vaddq_f64(a.lo, b.lo), vaddq_f64(a.hi, b.hi)}; }
  static DV MulD(DV a, DV b) { return {vmulq_f64(a.lo, b.lo), vmulq_f64(a.hi, b.hi)}; }
};

}  // namespace neon

namespace {

using L = neon::Lanes;
using internal::LoadNorm;
using internal::StoreNorm;
using simd::kMaxDim;

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

// ---- the Haar product ----

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

// idx[j] for z[j], j < m (m a multiple of 8).
template <int kBits>
void QuantizeVec(const float* thresholds, const Coarse& c, const float* z, size_t m,
                 uint8_t* idx) {
  for (size_t j = 0; j < m; j += 8) {
    const uint32x4_t lo = Quantize4<kBits>(thresholds, c, vld1q_f32(z + j));
    const uint32x4_t hi = Quantize4<kBits>(thresholds, c, vld1q_f32(z + j + 4));
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

// ---- encode / decode ----
//
// Shapes handled here: dim a multiple of 8 up to kMaxDim; Hadamard kinds a power of two;
// Kronecker blocks a power of two of at least 4 (whole registers). Others go to the reference.

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

template <int kBits>
void EncodeBits(const SubsetPlan& plan, const float* x, size_t x_stride, size_t n,
                uint8_t* norm_out, uint8_t* planes_out, size_t code_stride) {
  const size_t m = plan.dim;
  const simd::ForwardFn forward = simd::PickForwardFn<L>(plan);  // null: Haar
  Coarse coarse;
  InitCoarse(plan, &coarse);
  Scratch s;
  for (size_t v = 0; v < n; ++v) {
    const float* xv = x + v * x_stride;
    uint8_t* norm_v = norm_out + v * code_stride;
    uint8_t* planes_v = planes_out + v * code_stride;
    const float norm = L::Sqrt(simd::Sum8Squares<L>(xv, m));
    if (simd::EncodeDegenerate(plan, norm, norm_v, planes_v)) continue;
    const float scale = plan.enc_scale / norm;
    if (forward != nullptr) {
      forward(plan, xv, scale, s.y);
    } else {
      MatVecT(plan.haar_t, xv, m, s.y);
      for (size_t j = 0; j < m; j += 4) vst1q_f32(s.y + j, vmulq_n_f32(vld1q_f32(s.y + j), scale));
    }
    QuantizeVec<kBits>(plan.thresholds, coarse, s.y, m, s.idx);
    float csum = 0.0f;
    if (plan.norm_correction) {
      for (size_t j = 0; j < m; ++j) s.t[j] = plan.centroids[s.idx[j]];
      csum = simd::Sum8Squares<L>(s.t, m);
    }
    simd::StoreEncodedNorm<L>(plan, norm, csum, norm_v);
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
  const simd::InverseFn inverse = simd::PickInverseFn<L>(plan);  // null: Haar
  Scratch s;
  for (size_t k = 0; k < n; ++k) {
    const float a = LoadNorm(norm_in + k * code_stride, plan.norm_dtype) * plan.dec_scale;
    UnpackPlanes(planes_in + k * code_stride, plan.dim, plan.bits, s.idx);
    Dequantize(plan, s.idx, a, s.y);
    if (inverse != nullptr) {
      inverse(plan, s.y, out + k * out_stride);
    } else {
      MatVecT(plan.haar, s.y, plan.dim, out + k * out_stride);
    }
  }
}

// ---- split codecs ----

// Gather and scatter move 8 channels (one mask byte) per step with byte table look-ups (TBL over
// the 32 bytes of 8 floats): SplitLut<4> holds byte indices per mask byte.

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
  const internal::SplitLut<4>& t = internal::SplitLutOf<4>();
  internal::SplitGatherWalk(x, x_stride, n, mask, d, d / 8, out0, m0, out1, m1,
                            [&](const float* xv, uint8_t mb, float* o0, float* o1) {
                              const uint8x16x2_t v = Load8AsBytes(xv);
                              Store8Picked(o0, v, t.set[mb]);
                              Store8Picked(o1, v, t.unset[mb]);
                            });
}

void SplitScatter(const float* in0, size_t m0, const float* in1, size_t m1, size_t n,
                  const uint8_t* mask, size_t d, float* x, size_t x_stride) {
  const internal::SplitLut<4>& t = internal::SplitLutOf<4>();
  internal::SplitScatterWalk(
      in0, m0, in1, m1, n, mask, d, d / 8, x, x_stride,
      [&](float* xv, uint8_t mb, const float* i0, const float* i1) {
        const uint8x16x2_t a = Load8AsBytes(i0), b = Load8AsBytes(i1);
        for (int h = 0; h < 2; ++h) {
          const uint8x16_t rank = vld1q_u8(t.rank[mb] + 16 * h);
          const uint8x16_t picked = vbslq_u8(vld1q_u8(t.sel[mb] + 16 * h), vqtbl2q_u8(a, rank),
                                             vqtbl2q_u8(b, rank));
          vst1q_f32(xv + 4 * h, vreinterpretq_f32_u8(picked));
        }
      });
}

void SplitEncode(const SplitPlan& sp, const void* x, DType dtype, size_t x_stride, size_t n,
                 const uint8_t* mask, uint8_t* code, size_t code_stride) {
  SplitEncodeBatched(internal::NeonTable(), sp, x, dtype, x_stride, n, mask, code, code_stride);
}

void SplitDecode(const SplitPlan& sp, const uint8_t* code, size_t code_stride, size_t n,
                 const uint8_t* mask, void* x, DType dtype, size_t x_stride) {
  SplitDecodeBatched(internal::NeonTable(), sp, code, code_stride, n, mask, x, dtype, x_stride);
}

void ChannelEnergy(const void* x, DType dtype, size_t n, size_t stride, size_t d,
                   double* energy) {
  simd::ChannelEnergy<L>(ScalarKernels(), x, dtype, n, stride, d, energy);
}

}  // namespace

namespace internal {
const KernelTable& NeonTable() {
  static const KernelTable table{"neon", ToF32, FromF32, Encode, Decode, SplitGather,
                                 SplitScatter, SplitEncode, SplitDecode, ChannelEnergy,
                                 simd::AddScaled<L>, nullptr, nullptr, ref::GatherAffine, nullptr,
                                 nullptr, nullptr, ScalarKernels().encode_unit,
                                 ScalarKernels().whiten, ScalarKernels().unit_moments};
  return table;
}
}  // namespace internal

}  // namespace tqkv::kernels
