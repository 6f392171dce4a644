// The rotations of the SIMD tables, written once for every lane width: the FWHT, the Hadamard
// kinds and the Kronecker kind's block FWHTs and q x q mix (kernels.h fixes their arithmetic).
//
// L is a lane-traits struct (avx2::Lanes, avx512::Lanes, neon::Lanes): the vector type V of L::kN
// floats and its primitives (Load, Store, Add, Sub, Mul, Fma, Set1, FwhtIn: the FWHT stages
// inside one register). A template instantiated in an ISA's file is compiled with that file's
// flags, so each table gets its own code; include only from the *_avx2.cc, *_avx512.cc and
// *_neon.cc files. The traits types differ per file (and per AVX-512 build), so no two files'
// instantiations share a name.
#ifndef TQKV_SRC_CODEC_KERNELS_SIMD_ROTATION_H_
#define TQKV_SRC_CODEC_KERNELS_SIMD_ROTATION_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "codec/kernels/kernels.h"

namespace tqkv::kernels::simd {

inline constexpr size_t kMaxDim = 1024;  // subset dims the SIMD tables take

// FWHT stages h = 1 .. kM/2 across kM registers (register j pairs with j + h): the reference's
// adds and subtracts, stage by stage.
template <class L, int kM>
[[gnu::always_inline]] inline void ButterflyStages(typename L::V* v) {
#pragma GCC unroll 8
  for (int h = 1; h < kM; h <<= 1) {
#pragma GCC unroll 32
    for (int j = 0; j < kM; ++j) {
      if (j & h) continue;
      const typename L::V a = v[j], b = v[j + h];
      v[j] = L::Add(a, b);
      v[j + h] = L::Sub(a, b);
    }
  }
}

// Unnormalised FWHT of kN * R floats held as R registers. Beyond L::kFwhtRegs registers: both
// halves first, then the last stage across them. Every element sees the same operations in the
// same order as stage by stage, and a few registers at a time spill far less. Always inlined: as
// a call, the registers would go through memory.
template <class L, int R>
[[gnu::always_inline]] inline void FwhtRegs(typename L::V* x) {
  if constexpr (R > L::kFwhtRegs) {
    FwhtRegs<L, R / 2>(x);
    FwhtRegs<L, R / 2>(x + R / 2);
#pragma GCC unroll 64
    for (int r = 0; r < R / 2; ++r) {
      const typename L::V a = x[r], b = x[r + R / 2];
      x[r] = L::Add(a, b);
      x[r + R / 2] = L::Sub(a, b);
    }
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) x[r] = L::FwhtIn(x[r]);
    ButterflyStages<L, R>(x);
  }
}

// v = Fwht(s2 * Fwht(s1 * x)) (Hadamard2) or Fwht(s1 * x), m = kN R floats in registers. kTwo:
// Hadamard2 known at compile time (one path); -1: the plan says.
template <class L, int R, int kTwo = -1>
[[gnu::always_inline]] inline void HadamardRegs(const SubsetPlan& p, const float* x,
                                                typename L::V* v) {
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) v[r] = L::Mul(L::Load(x + L::kN * r), L::Load(p.signs1 + L::kN * r));
  FwhtRegs<L, R>(v);
  if (kTwo == 1 || (kTwo < 0 && p.rotation == RotationKind::kHadamard2)) {
#pragma GCC unroll 128
    for (int r = 0; r < R; ++r) v[r] = L::Mul(v[r], L::Load(p.signs2 + L::kN * r));
    FwhtRegs<L, R>(v);
  }
}

// The rotation routes through memory: forward from x into an aligned z, times scale; inverse
// from an aligned v.
using ForwardFn = void (*)(const SubsetPlan&, const float* x, float scale, float* z);
using InverseFn = void (*)(const SubsetPlan&, const float* v, float* out);

template <class L, int R>
void HadamardForward(const SubsetPlan& p, const float* x, float scale, float* z) {
  typename L::V v[R];
  HadamardRegs<L, R>(p, x, v);
  const typename L::V s = L::Set1(scale);
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) L::StoreA(z + L::kN * r, L::Mul(v[r], s));
}

// out = s1 * Fwht(s2 * Fwht(v)) (Hadamard2) or s1 * Fwht(v).
template <class L, int R>
void HadamardInverse(const SubsetPlan& p, const float* v_in, float* out) {
  typename L::V v[R];
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) v[r] = L::LoadA(v_in + L::kN * r);
  FwhtRegs<L, R>(v);
  if (p.rotation == RotationKind::kHadamard2) {
#pragma GCC unroll 128
    for (int r = 0; r < R; ++r) v[r] = L::Mul(v[r], L::Load(p.signs2 + L::kN * r));
    FwhtRegs<L, R>(v);
  }
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) {
    L::Store(out + L::kN * r, L::Mul(v[r], L::Load(p.signs1 + L::kN * r)));
  }
}

// ---- Kronecker kind: signs, FWHT of each B-block, then the q*q mix across blocks ----

// t = Fwht(signs * x) for one block of kN R floats (t aligned).
template <class L, int R>
void SignedFwhtBlock(const float* x, const float* signs, float* t) {
  typename L::V v[R];
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) v[r] = L::Mul(L::Load(x + L::kN * r), L::Load(signs + L::kN * r));
  FwhtRegs<L, R>(v);
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) L::StoreA(t + L::kN * r, v[r]);
}

// out = signs * Fwht(u) for one block (u aligned).
template <class L, int R>
void FwhtSignedBlock(const float* u, const float* signs, float* out) {
  typename L::V v[R];
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) v[r] = L::LoadA(u + L::kN * r);
  FwhtRegs<L, R>(v);
#pragma GCC unroll 128
  for (int r = 0; r < R; ++r) L::Store(out + L::kN * r, L::Mul(v[r], L::Load(signs + L::kN * r)));
}

// A decoded Kronecker block of up to 128 floats stays in registers through its FWHT.
template <class L, int R>
inline constexpr bool kKronBlockInRegs = R * L::kN <= 128;

// y = (M (x) I_B) x, B = kN R, with mt = M^T (q*q): for each output block a, R accumulators take
// the q fmas in the reference's order (a' ascending, from +0); one broadcast serves R registers,
// in chunks of at most 8 so large blocks do not spill. x aligned; the result goes to y (scaled by
// *scale when given: encode), or with `signs`, through the block's FWHT in registers and the sign
// multiply (decode: u never goes to memory). kQ > 0 fixes q at compile time (q = 3: the split
// presets' 96 = 3 * 32, 48, 192), so the loops unroll and the weights stay in registers.
template <class L, int R, int kQ>
inline void KronMixBlocks(const float* mt, const float* x, size_t q_runtime, const float* scale,
                          const float* signs, float* y) {
  using V = typename L::V;
  constexpr int kN = L::kN;
  const size_t q = kQ > 0 ? static_cast<size_t>(kQ) : q_runtime;
  constexpr int kB = kN * R;
  constexpr int kChunk = R < 8 ? R : 8;
#pragma GCC unroll 4
  for (size_t a = 0; a < q; ++a) {
    if (signs != nullptr && kKronBlockInRegs<L, R>) {  // decode: the whole block in registers
      V acc[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r] = L::Zero();
#pragma GCC unroll 4
      for (size_t a2 = 0; a2 < q; ++a2) {
        const V w = L::Set1(mt[a2 * q + a]);
        const float* xb = x + a2 * kB;
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[r] = L::Fma(w, L::LoadA(xb + kN * r), acc[r]);
      }
      FwhtRegs<L, R>(acc);
      float* yb = y + a * kB;
      const float* sb = signs + a * kB;
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) L::Store(yb + kN * r, L::Mul(acc[r], L::Load(sb + kN * r)));
      continue;
    }
    for (int r0 = 0; r0 < R; r0 += kChunk) {
      V acc[kChunk];
#pragma GCC unroll 8
      for (int r = 0; r < kChunk; ++r) acc[r] = L::Zero();
#pragma GCC unroll 4
      for (size_t a2 = 0; a2 < q; ++a2) {
        const V w = L::Set1(mt[a2 * q + a]);
        const float* xb = x + a2 * kB + kN * r0;
#pragma GCC unroll 8
        for (int r = 0; r < kChunk; ++r) acc[r] = L::Fma(w, L::LoadA(xb + kN * r), acc[r]);
      }
      if (scale != nullptr) {
        const V s = L::Set1(*scale);
#pragma GCC unroll 8
        for (int r = 0; r < kChunk; ++r) acc[r] = L::Mul(acc[r], s);
      }
      float* yb = y + a * kB + kN * r0;
#pragma GCC unroll 8
      for (int r = 0; r < kChunk; ++r) L::StoreA(yb + kN * r, acc[r]);
    }
  }
}

// z = KronMix(Q_q^T, Fwht of each block of signs * x) * scale (z aligned).
template <class L, int R, int kQ>
void KronForward(const SubsetPlan& p, const float* x, float scale, float* z) {
  constexpr size_t kB = L::kN * R;
  alignas(64) float t[kMaxDim];
  for (size_t j = 0; j < p.dim; j += kB) SignedFwhtBlock<L, R>(x + j, p.signs1 + j, t + j);
  KronMixBlocks<L, R, kQ>(p.haar_t, t, p.dim / kB, &scale, nullptr, z);
}

// KronForward before its scale with the vector in registers (kQ R of them): the blocks' signed
// FWHTs, then per output block a the kQ fmas in KronMix's order, handed to emit(a, acc) (R
// registers) before the next block is mixed, so a coder can quantize a block while few are live.
template <class L, int R, int kQ, class Emit>
[[gnu::always_inline]] inline void KronRegs(const SubsetPlan& p, const float* x, Emit&& emit) {
  using V = typename L::V;
  constexpr int kN = L::kN;
  V t[kQ * R];
#pragma GCC unroll 16
  for (int r = 0; r < kQ * R; ++r) t[r] = L::Mul(L::Load(x + kN * r), L::Load(p.signs1 + kN * r));
#pragma GCC unroll 4
  for (int b = 0; b < kQ; ++b) FwhtRegs<L, R>(t + b * R);
#pragma GCC unroll 4
  for (int a = 0; a < kQ; ++a) {
    V acc[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = L::Zero();
#pragma GCC unroll 4
    for (int a2 = 0; a2 < kQ; ++a2) {
      const V w = L::Set1(p.haar_t[a2 * kQ + a]);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r] = L::Fma(w, t[a2 * R + r], acc[r]);
    }
    emit(a, acc);
  }
}

// out = signs * (Fwht of each block of KronMix(Q_q, v)) (v aligned).
template <class L, int R, int kQ>
void KronInverse(const SubsetPlan& p, const float* v, float* out) {
  constexpr size_t kB = L::kN * R;
  if constexpr (kKronBlockInRegs<L, R>) {
    KronMixBlocks<L, R, kQ>(p.haar, v, p.dim / kB, nullptr, p.signs1, out);
  } else {
    alignas(64) float u[kMaxDim];
    KronMixBlocks<L, R, kQ>(p.haar, v, p.dim / kB, nullptr, nullptr, u);
    for (size_t j = 0; j < p.dim; j += kB) FwhtSignedBlock<L, R>(u + j, p.signs1 + j, out + j);
  }
}

// make(integral_constant<int, R>) for n = kN R floats, R a power of two (kN R <= kMaxDim);
// null for any other n.
template <class L, int R = 1, class Make>
auto PickByRegs(uint32_t n, Make make) -> decltype(make(std::integral_constant<int, 1>{})) {
  if constexpr (static_cast<size_t>(R) * L::kN > kMaxDim) {
    return nullptr;
  } else {
    if (n == static_cast<uint32_t>(R * L::kN)) return make(std::integral_constant<int, R>{});
    return PickByRegs<L, 2 * R>(n, make);
  }
}

// q = 3 only where 3 B fits kMaxDim (larger shapes never reach the SIMD tables).
template <class L, int R>
inline constexpr int kKronQ = static_cast<size_t>(3 * L::kN * R) <= kMaxDim ? 3 : 0;

// The forward rotation of a Hadamard or Kronecker plan the table vectorises (null for Haar).
template <class L>
ForwardFn PickForwardFn(const SubsetPlan& p) {
  if (p.rotation == RotationKind::kHaar) return nullptr;
  if (p.rotation == RotationKind::kKronecker) {
    const bool q3 = p.dim == 3 * p.block;
    return PickByRegs<L>(p.block, [q3](auto rc) -> ForwardFn {
      constexpr int R = decltype(rc)::value;
      return q3 ? KronForward<L, R, kKronQ<L, R>> : KronForward<L, R, 0>;
    });
  }
  return PickByRegs<L>(p.dim, [](auto rc) -> ForwardFn {
    return HadamardForward<L, decltype(rc)::value>;
  });
}

template <class L>
InverseFn PickInverseFn(const SubsetPlan& p) {
  if (p.rotation == RotationKind::kHaar) return nullptr;
  if (p.rotation == RotationKind::kKronecker) {
    const bool q3 = p.dim == 3 * p.block;
    return PickByRegs<L>(p.block, [q3](auto rc) -> InverseFn {
      constexpr int R = decltype(rc)::value;
      return q3 ? KronInverse<L, R, kKronQ<L, R>> : KronInverse<L, R, 0>;
    });
  }
  return PickByRegs<L>(p.dim, [](auto rc) -> InverseFn {
    return HadamardInverse<L, decltype(rc)::value>;
  });
}

}  // namespace tqkv::kernels::simd

#endif  // TQKV_SRC_CODEC_KERNELS_SIMD_ROTATION_H_
