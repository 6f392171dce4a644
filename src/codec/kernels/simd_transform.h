// The transform codec's fused decode (docs/codec.md §11), written once for every lane width: kN
// vectors at a time as the lanes of transposed columns, so that a row position is one register
// (lane i: vector i); a block's Hadamard rotation is then adds and subtracts of whole registers,
// the permutation the choice of register. Include only from the x86 ISA files.
//
// T, the ISA's transform policy:
//   T::L                      the lane traits (simd_rotation.h)
//   T::WordsIn(code, code_stride, code_bytes, cnt, words)
//                             bytes 0..code_bytes-1 of codes 0..cnt-1 (the rest 0), transposed by
//                             dwords: words[w] lane i = dword w of code i
//   T::DequantizeColumns<kBits>(plan, planes_offset, words, nv, t)
//                             block columns t[j] = centroid[idx_j] * (norm * dec_scale), lanes the
//                             codes (nv their norms)
//   T::AffineOut<kT>(tr, from, a, b, norms, cnt, d, mean, scale, o, pitch)
//                             gather_affine of the columns (then + scale[i] * mean[c]) as kT to
//                             vector i < cnt at o + i * pitch bytes
#ifndef TQKV_SRC_CODEC_KERNELS_SIMD_TRANSFORM_H_
#define TQKV_SRC_CODEC_KERNELS_SIMD_TRANSFORM_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "codec/kernels/internal.h"
#include "codec/kernels/kernels.h"
#include "codec/kernels/simd_rotation.h"
#include "codec/kernels/simd_vectors.h"
#include "tqkv/types.h"

namespace tqkv::kernels::simd {

inline constexpr size_t kMaxCols = 256;  // row positions held transposed
inline constexpr size_t kMaxWords = 80;  // code bytes held transposed: up to 320

template <class L>
using Columns = float[kMaxCols][L::kN];  // [p]: row position p of kN vectors
template <class L>
using Words = uint32_t[kMaxWords][L::kN];  // [w]: dword w of kN codes

// Stages h = 1 .. kM/2 of the reference's FWHT on kM columns in registers (each lane a vector),
// then (kSigns) the signs.
template <class L, uint32_t kM, bool kSigns>
[[gnu::always_inline]] inline void FwhtColumns(float (*t)[L::kN], const float* signs) {
  typename L::V v[kM];
#pragma GCC unroll 32
  for (uint32_t j = 0; j < kM; ++j) v[j] = L::LoadA(t[j]);
  ButterflyStages<L, kM>(v);
#pragma GCC unroll 32
  for (uint32_t j = 0; j < kM; ++j) {
    L::StoreA(t[j], kSigns ? L::Mul(v[j], L::Set1(signs[j])) : v[j]);
  }
}

// Stages h = 32, 64, .. m/2 across kQ = m / 32 columns 32 apart (column j of each 32-chunk),
// then the signs: the rest of a block past FwhtColumns<32>.
template <class L, uint32_t kQ>
void FwhtAcross(float (*t)[L::kN], const float* signs) {
  for (uint32_t j = 0; j < 32; ++j) {
    typename L::V v[kQ];
#pragma GCC unroll 8
    for (uint32_t q = 0; q < kQ; ++q) v[q] = L::LoadA(t[j + 32 * q]);
    ButterflyStages<L, kQ>(v);
#pragma GCC unroll 8
    for (uint32_t q = 0; q < kQ; ++q) {
      L::StoreA(t[j + 32 * q], L::Mul(v[q], L::Set1(signs[j + 32 * q])));
    }
  }
}

// Fwht(v) * signs of one block, each lane a vector. Every element sees the reference's adds and
// subtracts stage by stage, so the order of the pairs within a stage does not change a bit.
template <class L>
void RotateColumns(const TransformBlock& blk, Columns<L>& tr) {
  float(*t)[L::kN] = tr + blk.offset;
  switch (blk.dim) {
    case 1: return FwhtColumns<L, 1, true>(t, blk.signs);
    case 2: return FwhtColumns<L, 2, true>(t, blk.signs);
    case 4: return FwhtColumns<L, 4, true>(t, blk.signs);
    case 8: return FwhtColumns<L, 8, true>(t, blk.signs);
    case 16: return FwhtColumns<L, 16, true>(t, blk.signs);
    case 32: return FwhtColumns<L, 32, true>(t, blk.signs);
  }
  const uint32_t m = blk.dim;
  if (m == 64 || m == 128 || m == 256) {
    for (uint32_t j = 0; j < m; j += 32) FwhtColumns<L, 32, false>(t + j, nullptr);
    if (m == 64) return FwhtAcross<L, 2>(t, blk.signs);
    if (m == 128) return FwhtAcross<L, 4>(t, blk.signs);
    return FwhtAcross<L, 8>(t, blk.signs);
  }
  for (uint32_t h = 1; h < m; h <<= 1) {  // other powers of two: stage by stage in memory
    for (uint32_t j = 0; j < m; ++j) {
      if (j & h) continue;
      const typename L::V x = L::LoadA(t[j]), y = L::LoadA(t[j + h]);
      L::StoreA(t[j], L::Add(x, y));
      L::StoreA(t[j + h], L::Sub(x, y));
    }
  }
  for (uint32_t j = 0; j < m; ++j) L::StoreA(t[j], L::Mul(L::LoadA(t[j]), L::Set1(blk.signs[j])));
}

template <class T>
void DequantizeColumnsAny(const SubsetPlan& plan, size_t planes_offset,
                          const Words<typename T::L>& w, typename T::L::V nv,
                          float (*t)[T::L::kN]) {
  using Fn = void (*)(const SubsetPlan&, size_t, const Words<typename T::L>&, typename T::L::V,
                      float(*)[T::L::kN]);
  static constexpr Fn kByBits[8] = {
      T::template DequantizeColumns<1>, T::template DequantizeColumns<2>,
      T::template DequantizeColumns<3>, T::template DequantizeColumns<4>,
      T::template DequantizeColumns<5>, T::template DequantizeColumns<6>,
      T::template DequantizeColumns<7>, T::template DequantizeColumns<8>};
  kByBits[plan.bits - 1](plan, planes_offset, w, nv, t);
}

template <class T, DType kT>
void TransformDecodeT(const uint8_t* code, size_t code_stride, size_t code_bytes,
                      const TransformCodeBlock* code_blocks, const TransformBlock* blocks,
                      size_t nblocks, size_t cols, const uint32_t* from, const float* a,
                      const float* b, const float* norms, size_t n, size_t d, const float* mean,
                      const float* scale, uint8_t* out, size_t pitch) {
  using L = typename T::L;
  constexpr size_t kN = L::kN;
  alignas(64) Columns<L> tr;
  alignas(64) Words<L> w;
  for (size_t q = 0; q < cols; ++q) {  // positions no block fills (any from[c] of a 0-bit channel)
    L::StoreA(tr[q], L::Zero());
  }
  for (size_t i0 = 0; i0 < n; i0 += kN) {
    const size_t cnt = std::min(kN, n - i0);
    alignas(64) float nb[kN] = {}, sb[kN] = {};
    std::memcpy(nb, norms + i0, cnt * sizeof(float));
    if (mean != nullptr) std::memcpy(sb, scale + i0, cnt * sizeof(float));
    T::WordsIn(code + i0 * code_stride, code_stride, code_bytes, cnt, w);
    const typename L::V nv = L::LoadA(nb);
    for (size_t k = 0; k < nblocks; ++k) {
      DequantizeColumnsAny<T>(*code_blocks[k].plan, code_blocks[k].planes_offset, w, nv,
                              tr + blocks[k].offset);
      RotateColumns<L>(blocks[k], tr);
    }
    T::template AffineOut<kT>(tr, from, a, b, nb, cnt, d, mean, sb, out + i0 * pitch, pitch);
  }
}

// transform_decode (kernels.h): false, having written nothing, for a shape it does not take.
template <class T>
bool TransformDecode(const uint8_t* code, size_t code_stride,
                     const TransformCodeBlock* code_blocks, const TransformBlock* blocks,
                     size_t nblocks, const uint32_t* from, const float* a, const float* b,
                     const float* norms, size_t n, size_t d, const float* mean, const float* scale,
                     void* out, DType dtype, size_t out_stride) {
  constexpr size_t kN = T::L::kN;
  const size_t cols = (internal::RowPositionsUsed(from, d, blocks, nblocks) + kN - 1) / kN * kN;
  size_t code_bytes = 0;
  if (cols > kMaxCols ||
      !internal::TransformDecodeBlocks(code_blocks, blocks, nblocks, &code_bytes) ||
      code_bytes > 4 * kMaxWords) {
    return false;  // the codec's route through buffers
  }
  const size_t pitch = out_stride * DTypeSize(dtype);
  auto* o = static_cast<uint8_t*>(out);
  return WithFloatDType(dtype, [&](auto t) {
    TransformDecodeT<T, decltype(t)::value>(code, code_stride, code_bytes, code_blocks, blocks,
                                            nblocks, cols, from, a, b, norms, n, d, mean, scale,
                                            o, pitch);
  });
}

}  // namespace tqkv::kernels::simd

#endif  // TQKV_SRC_CODEC_KERNELS_SIMD_TRANSFORM_H_
