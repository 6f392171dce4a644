// The split codecs' fused route, written once for every lane width (lane traits: simd_rotation.h):
// gather, both subsets, scatter, vector by vector in L1. Batch-wise (gather 64 vectors, encode
// each subset, scatter) streams every float through a buffer of tens of KiB per step; per vector
// the subsets' floats stay in a few cache lines. Include only from the ISA files.
//
// C, the ISA's coder policy:
//   C::L                    the lane traits (kN, Load, Store, Permute, Permute2, LoadAs, StoreAs)
//   C::VecCoder             one subset's per-call state, with function pointers
//                             encode(plan, coder, x, norm, z, norm_out, planes): one vector with
//                               its norm (z: aligned scratch of kMaxDim floats)
//                             decode(plan, coder, norm_in, planes, vbuf, out): one vector back
//   C::Init(plan, &coder)   builds it
//   C::Fusable(plan)        whether the table's per-vector coders take the subset
#ifndef TQKV_SRC_CODEC_KERNELS_SIMD_SPLIT_H_
#define TQKV_SRC_CODEC_KERNELS_SIMD_SPLIT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "codec/kernels/kernels.h"
#include "codec/kernels/simd_rotation.h"
#include "codec/kernels/simd_vectors.h"
#include "tqkv/types.h"

namespace tqkv::kernels::simd {

inline constexpr size_t kMaxSplitDim = 512;  // the fused route's d

// What every ISA's VecCoder holds (Derived: that VecCoder, which its per-vector functions take):
// the subset's tables, the rotation routes through memory, the encode and decode picked for it.
template <class Derived, class TablesT, class ForwardT, class InverseT>
struct VecCoderBase {
  using EncodeFn = void (*)(const SubsetPlan&, const Derived&, const float* x, float norm,
                            float* z, uint8_t* norm_out, uint8_t* planes);
  using DecodeFn = void (*)(const SubsetPlan&, const Derived&, const uint8_t* norm_in,
                            const uint8_t* planes, float* vbuf, float* out);
  TablesT t;
  ForwardT forward;
  InverseT inverse;
  EncodeFn encode;
  DecodeFn decode;
};

// The group mask's data movement, worked out once per call: for chunk k of kN channels, where its
// outlier and regular channels start in the subset vectors and the lane permutations. Gather and
// scatter then need no mask bits, popcounts or table look-ups per vector.
template <class L>
struct SplitMap {
  static constexpr size_t kMaxChunks = kMaxSplitDim / L::kN;
  size_t chunks = 0;
  // Gather: the lanes of subset 0 (then 1), ascending, first; the lanes past them any.
  alignas(64) int32_t gidx0[kMaxChunks][L::kN];
  alignas(64) int32_t gidx1[kMaxChunks][L::kN];
  // Scatter: lane l of chunk k takes lane sidx[k][l] of (kN floats at off0, kN floats at off1).
  alignas(64) int32_t sidx[kMaxChunks][L::kN];
  uint32_t off0[kMaxChunks], off1[kMaxChunks];
};

// d a multiple of kN, at most kMaxSplitDim; bit c % 8 of mask[c / 8] marks channel c's subset 0.
template <class L>
void InitSplitMap(const uint8_t* mask, size_t d, SplitMap<L>* map) {
  constexpr int kN = L::kN;
  map->chunks = d / kN;
  uint32_t o0 = 0, o1 = 0;
  for (size_t k = 0; k < map->chunks; ++k) {
    int32_t r0 = 0, r1 = 0;
    for (int l = 0; l < kN; ++l) {
      const size_t c = k * kN + l;
      if ((mask[c / 8] >> (c % 8)) & 1u) {
        map->gidx0[k][r0] = l;
        map->sidx[k][l] = r0++;
      } else {
        map->gidx1[k][r1] = l;
        map->sidx[k][l] = kN + r1++;
      }
    }
    for (int l = r0; l < kN; ++l) map->gidx0[k][l] = 0;
    for (int l = r1; l < kN; ++l) map->gidx1[k][l] = 0;
    map->off0[k] = o0;
    map->off1[k] = o1;
    o0 += r0;
    o1 += r1;
  }
}

// One vector (d elements of kT) as to_f32 + split_gather: whole registers are stored at the
// running positions; the lanes past the valid ones are overwritten by the next chunk or land in
// the kN floats of slack after each subset.
template <class L, DType kT>
inline void GatherVec(const SplitMap<L>& map, const void* xv, float* out0, float* out1) {
  for (size_t k = 0; k < map.chunks; ++k) {
    const typename L::V v = L::template LoadAs<kT>(xv, L::kN * k);
    L::Store(out0 + map.off0[k], L::Permute(v, map.gidx0[k]));
    L::Store(out1 + map.off1[k], L::Permute(v, map.gidx1[k]));
  }
}

// As split_scatter + from_f32.
template <class L, DType kT>
inline void ScatterVec(const SplitMap<L>& map, const float* in0, const float* in1, void* xv) {
  for (size_t k = 0; k < map.chunks; ++k) {
    const typename L::V a = L::Load(in0 + map.off0[k]);
    const typename L::V b = L::Load(in1 + map.off1[k]);
    L::template StoreAs<kT>(xv, L::kN * k, L::Permute2(a, b, map.sidx[k]));
  }
}

// Asks for the kNormBatch rows from `first` (of n, pitch bytes apart) that a block ahead will
// read: the hardware prefetcher alone left the reads waiting on memory. `static`: each ISA file
// its own copy (internal.h).
static inline void PrefetchRows(const uint8_t* src, size_t pitch, size_t first, size_t n,
                                size_t bytes) {
  const size_t end = std::min(n, first + kNormBatch);
  for (size_t i = first; i < end; ++i) {
    const uint8_t* row = src + i * pitch;
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(row + o, 0, 3);  // prefetcht0
  }
}

template <class C>
bool FusedRoute(const SplitPlan& sp) {
  const size_t d = sp.sub[0].dim + sp.sub[1].dim;
  return C::Fusable(sp.sub[0]) && C::Fusable(sp.sub[1]) && d % C::L::kN == 0 &&
         d <= kMaxSplitDim;
}

template <class C>
struct FusedSplit {
  typename C::VecCoder c[2];
  SplitMap<typename C::L> map;
};

template <class C>
void InitFusedSplit(const SplitPlan& sp, const uint8_t* mask, FusedSplit<C>* f) {
  C::Init(sp.sub[0], &f->c[0]);
  C::Init(sp.sub[1], &f->c[1]);
  InitSplitMap(mask, sp.sub[0].dim + sp.sub[1].dim, &f->map);
}

// The rows the split encode asks for ahead, one per vector encoded (and that vector's code, for
// writing): at that steady pace the rows arrive while the encoders run. Asking for a block's rows
// at once (PrefetchRows) left the gather waiting on memory: an eighth of the encode at AVX-512 on
// rows not in cache.
inline constexpr size_t kSplitAhead = 16;

// kNormBatch vectors per step: block b + 1 is gathered before block b is encoded, so the gather's
// overlapping stores have reached L1 when the norms and the encoder load them (a load spanning
// stores still in flight waits for them), and the norms of a block's subset vectors interleave.
template <class C, DType kT>
void SplitEncodeFused(const SplitPlan& sp, const void* x, size_t pitch, size_t n,
                      const uint8_t* mask, uint8_t* code, size_t code_stride) {
  using L = typename C::L;
  constexpr size_t kSlack = L::kN;  // one whole register past a subset vector
  FusedSplit<C> f;
  InitFusedSplit(sp, mask, &f);
  const size_t m0 = sp.sub[0].dim, m1 = sp.sub[1].dim;
  const size_t vec = m0 + m1 + 2 * kSlack;  // one vector's two subsets, each with its slack
  const auto* src = static_cast<const uint8_t*>(x);
  const size_t row_bytes = (m0 + m1) * DTypeSize(kT);
  alignas(64) float g[2][kNormBatch * (kMaxSplitDim + 2 * kSlack)];
  alignas(64) float z[kMaxDim];
  for (size_t i = 0; i < std::min(n, kSplitAhead); ++i) PrefetchRow(src + i * pitch, row_bytes);
  const auto gather = [&](size_t first, float* buf) {
    const size_t cnt = std::min(kNormBatch, n - first);
    for (size_t b = 0; b < cnt; ++b) {
      GatherVec<L, kT>(f.map, src + (first + b) * pitch, buf + b * vec,
                       buf + b * vec + m0 + kSlack);
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
    Norms<L>(x0, cnt, m0, n0);
    Norms<L>(x1, cnt, m1, n1);
    for (size_t b = 0; b < cnt; ++b) {
      if (i0 + b + kSplitAhead < n) {
        PrefetchRow(src + (i0 + b + kSplitAhead) * pitch, row_bytes);
        __builtin_prefetch(code + (i0 + b + kSplitAhead) * code_stride, 1, 3);  // to be written
      }
      uint8_t* c = code + (i0 + b) * code_stride;
      f.c[0].encode(sp.sub[0], f.c[0], x0[b], n0[b], z, c + sp.norm_offset[0],
                    c + sp.planes_offset[0]);
      f.c[1].encode(sp.sub[1], f.c[1], x1[b], n1[b], z, c + sp.norm_offset[1],
                    c + sp.planes_offset[1]);
    }
  }
}

// Vector i is scattered after vector i + 1 is decoded: the scatter's unaligned loads span the
// inverse rotation's stores.
template <class C, DType kT>
void SplitDecodeFused(const SplitPlan& sp, const uint8_t* code, size_t code_stride, size_t n,
                      const uint8_t* mask, void* x, size_t pitch) {
  using L = typename C::L;
  FusedSplit<C> f;
  InitFusedSplit(sp, mask, &f);
  const auto& c0 = f.c[0];
  const auto& c1 = f.c[1];
  auto* dst = static_cast<uint8_t*>(x);
  alignas(64) float v[kMaxDim];
  alignas(64) float g0[2][kMaxDim + L::kN];
  alignas(64) float g1[2][kMaxDim + L::kN];
  for (size_t i = 0; i < n; ++i) {
    const size_t cur = i & 1;
    const uint8_t* c = code + i * code_stride;
    c0.decode(sp.sub[0], c0, c + sp.norm_offset[0], c + sp.planes_offset[0], v, g0[cur]);
    c1.decode(sp.sub[1], c1, c + sp.norm_offset[1], c + sp.planes_offset[1], v, g1[cur]);
    if (i > 0) ScatterVec<L, kT>(f.map, g0[cur ^ 1], g1[cur ^ 1], dst + (i - 1) * pitch);
  }
  ScatterVec<L, kT>(f.map, g0[(n - 1) & 1], g1[(n - 1) & 1], dst + (n - 1) * pitch);
}

// split_encode by the fused route; false, having written nothing, where it does not apply (the
// table then takes another).
template <class C>
bool SplitEncode(const SplitPlan& sp, const void* x, DType dtype, size_t x_stride, size_t n,
                 const uint8_t* mask, uint8_t* code, size_t code_stride) {
  if (n == 0) return true;
  if (!FusedRoute<C>(sp)) return false;
  const size_t pitch = x_stride * DTypeSize(dtype);
  return WithFloatDType(dtype, [&](auto t) {
    SplitEncodeFused<C, decltype(t)::value>(sp, x, pitch, n, mask, code, code_stride);
  });
}

template <class C>
bool SplitDecode(const SplitPlan& sp, const uint8_t* code, size_t code_stride, size_t n,
                 const uint8_t* mask, void* x, DType dtype, size_t x_stride) {
  if (n == 0) return true;
  if (!FusedRoute<C>(sp)) return false;
  const size_t pitch = x_stride * DTypeSize(dtype);
  return WithFloatDType(dtype, [&](auto t) {
    SplitDecodeFused<C, decltype(t)::value>(sp, code, code_stride, n, mask, x, pitch);
  });
}

}  // namespace tqkv::kernels::simd

#endif  // TQKV_SRC_CODEC_KERNELS_SIMD_SPLIT_H_
