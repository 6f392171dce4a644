// Per-vector loops of the SIMD tables written once for every lane width (see simd_rotation.h for
// the lane traits L): norms, the degenerate-norm rule, channel energy, mean-removed keys, the
// transform codec's whitening and unit moments, and the switch from a DType to a template.
// Include only from the ISA files.
#ifndef TQKV_SRC_CODEC_KERNELS_SIMD_VECTORS_H_
#define TQKV_SRC_CODEC_KERNELS_SIMD_VECTORS_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "codec/kernels/internal.h"
#include "codec/kernels/kernels.h"
#include "tqkv/types.h"

namespace tqkv::kernels::simd {

// f(integral_constant<DType, t>) for the float dtypes (f32, f16, bf16); false for any other.
template <class F>
inline bool WithFloatDType(DType t, F&& f) {
  switch (t) {
    case DType::kF32:
      f(std::integral_constant<DType, DType::kF32>{});
      return true;
    case DType::kF16:
      f(std::integral_constant<DType, DType::kF16>{});
      return true;
    case DType::kBF16:
      f(std::integral_constant<DType, DType::kBF16>{});
      return true;
    default:
      return false;
  }
}

// Sum8 of m floats (m a multiple of L::kSumStep).
template <class L>
inline float Sum8Squares(const float* v, size_t m) {
  typename L::S8 acc = L::S8Zero();
  for (size_t i = 0; i < m; i += L::kSumStep) acc = L::AddSquaresAt(acc, v + i);
  return L::Reduce(acc);
}

// Norms several vectors at a time: each of Sum8's eight lanes is one chain of m / 8 dependent
// adds, so interleaving the chains of kNormBatch vectors keeps the adders busy.
inline constexpr size_t kNormBatch = 4;

template <class L, int N>
void NormsN(const float* const* x, size_t m, float* norms) {
  typename L::S8 acc[N];
#pragma GCC unroll 4
  for (int v = 0; v < N; ++v) acc[v] = L::S8Zero();
  for (size_t i = 0; i < m; i += L::kSumStep) {
#pragma GCC unroll 4
    for (int v = 0; v < N; ++v) acc[v] = L::AddSquaresAt(acc[v], x[v] + i);
  }
#pragma GCC unroll 4
  for (int v = 0; v < N; ++v) norms[v] = L::Sqrt(L::Reduce(acc[v]));
}

// norms[v] = sqrtf(Sum8(x_v^2)) for count (1..kNormBatch) vectors of m floats.
template <class L>
inline void Norms(const float* const* x, size_t count, size_t m, float* norms) {
  switch (count) {
    case 1: return NormsN<L, 1>(x, m, norms);
    case 2: return NormsN<L, 2>(x, m, norms);
    case 3: return NormsN<L, 3>(x, m, norms);
    default: return NormsN<L, 4>(x, m, norms);
  }
}

// A zero or non-finite norm: every index 0, stored norm +0 or NaN. True when it was one.
// `static`: each ISA file its own copy, compiled for its instruction set (internal.h).
static inline bool EncodeDegenerate(const SubsetPlan& plan, float norm, uint8_t* norm_out,
                             uint8_t* planes) {
  if (norm != 0.0f && std::isfinite(norm)) return false;
  internal::StoreNorm(norm == 0.0f ? 0.0f : std::numeric_limits<float>::quiet_NaN(),
                      plan.norm_dtype, norm_out);
  std::memset(planes, 0, plan.planes_bytes());
  return true;
}

// The norm to store: with norm correction norm * sqrtf(m / csum), csum Sum8 of the centroids'
// squares.
template <class L>
inline void StoreEncodedNorm(const SubsetPlan& plan, float norm, float csum, uint8_t* norm_out) {
  float stored = norm;
  if (plan.norm_correction) stored = norm * L::Sqrt(static_cast<float>(plan.dim) / csum);
  internal::StoreNorm(stored, plan.norm_dtype, norm_out);
}

// ---- channel energy: energy[c] += double(x)^2 per vector in order ----

// The energy pass streams every vector once, from memory: the rows kEnergyAhead ahead are asked
// for (the hardware prefetcher alone left it at half the speed it has on cached rows).
inline constexpr size_t kEnergyAhead = 16;

// Asks for `bytes` from row into L1 (prefetcht0). `static`: each ISA file its own copy.
static inline void PrefetchRow(const uint8_t* row, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(row + o, 0, 3);
}

// kRows vectors per pass over the accumulators, each channel's adds still one vector after the
// other.
template <class L, DType kT, int kRows>
inline void EnergyRows(const uint8_t* rows, size_t pitch, size_t d, double* energy) {
  for (size_t c = 0; c < d; c += L::kDN) {
    typename L::DV acc = L::LoadD(energy + c);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const typename L::DV v = L::template LoadAsDouble<kT>(rows + r * pitch, c);
      acc = L::AddD(acc, L::MulD(v, v));
    }
    L::StoreD(energy + c, acc);
  }
}

// d = kDN kBlocks channels: the sums stay in registers for all n vectors.
template <class L, DType kT, int kBlocks>
void EnergyInRegs(const uint8_t* src, size_t n, size_t pitch, double* energy) {
  typename L::DV acc[kBlocks];
#pragma GCC unroll 16
  for (int b = 0; b < kBlocks; ++b) acc[b] = L::LoadD(energy + L::kDN * b);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* row = src + i * pitch;
    if (i + kEnergyAhead < n) {
      PrefetchRow(row + kEnergyAhead * pitch, kBlocks * L::kDN * DTypeSize(kT));
    }
#pragma GCC unroll 16
    for (int b = 0; b < kBlocks; ++b) {
      const typename L::DV v = L::template LoadAsDouble<kT>(row, L::kDN * b);
      acc[b] = L::AddD(acc[b], L::MulD(v, v));
    }
  }
#pragma GCC unroll 16
  for (int b = 0; b < kBlocks; ++b) L::StoreD(energy + L::kDN * b, acc[b]);
}

template <class L, DType kT>
void ChannelEnergyT(const uint8_t* src, size_t n, size_t pitch, size_t d, double* energy) {
  if constexpr (L::kEnergyRegs >= 16) {
    if (d == 16 * L::kDN) return EnergyInRegs<L, kT, 16>(src, n, pitch, energy);
  }
  if constexpr (L::kEnergyRegs >= 8) {
    if (d == 8 * L::kDN) return EnergyInRegs<L, kT, 8>(src, n, pitch, energy);
  }
  const size_t bytes = d * DTypeSize(kT);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (size_t r = i + kEnergyAhead; r < std::min(n, i + kEnergyAhead + 4); ++r) {
      PrefetchRow(src + r * pitch, bytes);
    }
    EnergyRows<L, kT, 4>(src + i * pitch, pitch, d, energy);
  }
  for (; i < n; ++i) EnergyRows<L, kT, 1>(src + i * pitch, pitch, d, energy);
}

// The channel_energy kernel; other shapes and dtypes go to `fallback`.
template <class L>
void ChannelEnergy(const KernelTable& fallback, const void* x, DType dtype, size_t n,
                   size_t stride, size_t d, double* energy) {
  const auto* src = static_cast<const uint8_t*>(x);
  const size_t pitch = stride * DTypeSize(dtype);
  if (d % L::kDN == 0 && WithFloatDType(dtype, [&](auto t) {
        ChannelEnergyT<L, decltype(t)::value>(src, n, pitch, d, energy);
      })) {
    return;
  }
  fallback.channel_energy(x, dtype, n, stride, d, energy);
}

// Mean-removed keys: mul then add, never an fma (the reference rounds the product first).
template <class L>
void AddScaled(const float* mean, const float* scale, size_t n, size_t d, float* x,
               size_t x_stride) {
  for (size_t i = 0; i < n; ++i) {
    float* xv = x + i * x_stride;
    const typename L::V a = L::Set1(scale[i]);
    size_t j = 0;
    for (; j + L::kN <= d; j += L::kN) {
      L::Store(xv + j, L::Add(L::Load(xv + j), L::Mul(a, L::Load(mean + j))));
    }
    for (; j < d; ++j) xv[j] += scale[i] * mean[j];
  }
}

// ---- the transform codec's per-vector statistics ----

// unit_moments (kernels.h) for d a multiple of kN; the norms kNormBatch vectors at a time, the
// sums vector after vector.
template <class L>
void UnitMoments(const float* x, size_t x_stride, size_t n, size_t d, double* s1, double* s2,
                 size_t* count, float* largest) {
  using DV = typename L::DV;
  for (size_t i0 = 0; i0 < n; i0 += kNormBatch) {
    const size_t cnt = std::min(kNormBatch, n - i0);
    const float* xs[kNormBatch];
    float norms[kNormBatch];
    for (size_t b = 0; b < cnt; ++b) xs[b] = x + (i0 + b) * x_stride;
    Norms<L>(xs, cnt, d, norms);
    for (size_t b = 0; b < cnt; ++b) {
      const float norm = norms[b];
      if (!(norm > 0.0f) || !std::isfinite(norm)) continue;
      ++*count;
      *largest = std::max(*largest, norm);
      const typename L::V nv = L::Set1(norm);
      for (size_t c = 0; c < d; c += L::kN) {
        DV lo, hi;
        L::ToDoubles(L::Div(L::Load(xs[b] + c), nv), &lo, &hi);
        double* p1 = s1 + c;
        double* p2 = s2 + c;
        L::StoreD(p1, L::AddD(L::LoadD(p1), lo));
        L::StoreD(p1 + L::kDN, L::AddD(L::LoadD(p1 + L::kDN), hi));
        L::StoreD(p2, L::AddD(L::LoadD(p2), L::MulD(lo, lo)));
        L::StoreD(p2 + L::kDN, L::AddD(L::LoadD(p2 + L::kDN), L::MulD(hi, hi)));
      }
    }
  }
}

// whiten (kernels.h) for d a multiple of kN; whole registers of rows, the tail as the reference.
template <class L>
void Whiten(const float* x, size_t x_stride, size_t n, size_t d, const uint32_t* channel,
            const float* mean, const float* scale, size_t rows, float* norms, float* w,
            size_t w_stride) {
  for (size_t i0 = 0; i0 < n; i0 += kNormBatch) {
    const size_t cnt = std::min(kNormBatch, n - i0);
    const float* xs[kNormBatch];
    for (size_t b = 0; b < cnt; ++b) xs[b] = x + (i0 + b) * x_stride;
    Norms<L>(xs, cnt, d, norms + i0);
    for (size_t b = 0; b < cnt; ++b) {
      const float norm = norms[i0 + b];
      const typename L::V nv = L::Set1(norm);
      float* wv = w + (i0 + b) * w_stride;
      size_t r = 0;
      for (; r + L::kN <= rows; r += L::kN) {
        const typename L::V u = L::Div(L::Gather(xs[b], channel + r), nv);
        L::Store(wv + r, L::DivIfPositive(L::Sub(u, L::Load(mean + r)), L::Load(scale + r)));
      }
      for (; r < rows; ++r) {
        const float u = xs[b][channel[r]] / norm;
        wv[r] = scale[r] > 0.0f ? (u - mean[r]) / scale[r] : 0.0f;
      }
    }
  }
}

}  // namespace tqkv::kernels::simd

#endif  // TQKV_SRC_CODEC_KERNELS_SIMD_VECTORS_H_
