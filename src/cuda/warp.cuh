// Warp-level building blocks of the decode/encode kernels, in the exact operation order of
// src/codec/kernels/kernels.h. Element j of an m-channel subset lives in lane j % 32, register
// j / 32 (packed.h). Every float operation is an explicit _rn intrinsic, and the library builds with
// --fmad=false, so nothing is contracted or reassociated.
#ifndef TQKV_SRC_CUDA_WARP_CUH_
#define TQKV_SRC_CUDA_WARP_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/packed.h"

namespace tqkv::cuda {

inline constexpr unsigned kFullMask = 0xFFFFFFFFu;
inline constexpr int kWarpsPerBlock = 8;

// Sum8(v^2): lane k < 8 owns acc[k] and adds element k + 8t at step t (from lane k + 8 (t % 4),
// register t / 4), products rounded before the add; then the fixed tree. Result in every lane.
template <int E>
__device__ __forceinline__ float WarpSum8Squares(const float (&x)[E], uint32_t m, uint32_t lane) {
  float acc = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const float sq = __fmul_rn(x[e], x[e]);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t t = static_cast<uint32_t>(e * 4 + q);
      const float p = __shfl_sync(kFullMask, sq, static_cast<int>((lane & 7u) + 8u * q));
      if (lane < 8 && lane + 8 * t < m) acc = __fadd_rn(acc, p);
    }
  }
  float a[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) a[k] = __shfl_sync(kFullMask, acc, k);
  return __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[4]), __fadd_rn(a[2], a[6])),
                   __fadd_rn(__fadd_rn(a[1], a[5]), __fadd_rn(a[3], a[7])));
}

// Unnormalised FWHT, stages h = 1, 2, ..., m/2 in order; (a, b) -> (a + b, a - b) with a the
// element whose index has bit h clear. m a power of two <= 32 * E.
template <int E>
__device__ __forceinline__ void WarpFwht(float (&v)[E], uint32_t m, uint32_t lane) {
  for (uint32_t h = 1; h < m && h < 32; h <<= 1) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float other = __shfl_xor_sync(kFullMask, v[e], static_cast<int>(h));
      v[e] = (lane & h) ? __fsub_rn(other, v[e]) : __fadd_rn(v[e], other);
    }
  }
#pragma unroll
  for (int hh = 1; hh < E; hh <<= 1) {
    if (static_cast<uint32_t>(hh) * 32 >= m) break;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if ((e & hh) == 0) {
        const float a = v[e], b = v[e + hh];
        v[e] = __fadd_rn(a, b);
        v[e + hh] = __fsub_rn(a, b);
      }
    }
  }
}

// y = M x with mt = M^T row-major (m*m): y[j] = fma(mt[i][j], x[i], y[j]) for i = 0..m-1 in order.
template <int E>
__device__ __forceinline__ void WarpMatVecT(const float* __restrict__ mt, const float (&x)[E],
                                            uint32_t m, uint32_t lane, float (&y)[E]) {
#pragma unroll
  for (int e = 0; e < E; ++e) y[e] = 0.0f;
#pragma unroll
  for (int ei = 0; ei < E; ++ei) {
    for (uint32_t l = 0; l < 32; ++l) {
      const uint32_t i = static_cast<uint32_t>(ei) * 32 + l;
      if (i >= m) break;  // warp-uniform
      const float xi = __shfl_sync(kFullMask, x[ei], static_cast<int>(l));
      const float* row = mt + static_cast<size_t>(i) * m;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const uint32_t j = static_cast<uint32_t>(e) * 32 + lane;
        if (j < m) y[e] = __fmaf_rn(__ldg(row + j), xi, y[e]);
      }
    }
  }
}

// Kronecker mix y = (M (x) I_B) x, mt = M^T (q*q, q = m / B), through the warp's shared buffer
// `buf` (m floats, the subset's slots): x is parked there, then lane j computes
// y[j] = fma(mt[a'][a], x[a' * B + b], acc) for a' = 0..q-1 in order (j = a * B + b).
template <int E>
__device__ __forceinline__ void WarpKronMix(const float* __restrict__ mt, const float (&x)[E],
                                            uint32_t m, uint32_t block, uint32_t lane, float* buf,
                                            float (&y)[E]) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const uint32_t j = static_cast<uint32_t>(e) * 32 + lane;
    if (j < m) buf[j] = x[e];
  }
  __syncwarp();
  const uint32_t q = m / block;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const uint32_t j = static_cast<uint32_t>(e) * 32 + lane;
    float acc = 0.0f;
    if (j < m) {
      const uint32_t a = j / block, b = j % block;
      for (uint32_t a2 = 0; a2 < q; ++a2) {
        acc = __fmaf_rn(__ldg(mt + a2 * q + a), buf[a2 * block + b], acc);
      }
    }
    y[e] = acc;
  }
  __syncwarp();  // the caller may overwrite buf next
}

// Elementwise v[j] *= t[j] (sign vectors: exact).
template <int E>
__device__ __forceinline__ void WarpMulTable(float (&v)[E], const float* __restrict__ t,
                                             uint32_t m, uint32_t lane) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const uint32_t j = static_cast<uint32_t>(e) * 32 + lane;
    if (j < m) v[e] = __fmul_rn(v[e], __ldg(t + j));
  }
}

// f32 -> f16/bf16 bits exactly as packed.h's ports (= tqkv/types.h): the hardware conversion is
// IEEE round-to-nearest-even with overflow to inf and exact subnormals, which is what the ports
// compute for every non-NaN value; NaN takes the port (the hardware returns a canonical NaN,
// the CPU keeps the payload).
__device__ __forceinline__ uint32_t ToHalfBits(float v, uint32_t dtype) {
  if (isnan(v)) return dtype == kGpuF16 ? FloatToHalfBits(v) : FloatToBF16Bits(v);
  return dtype == kGpuF16 ? __half_as_ushort(__float2half_rn(v))
                          : __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// Writes channels 0..d-1 of one destination row (element offset `row`), channel c's value
// value(c), c = lane, lane + 32, ...: f16/bf16 rows at 4-byte-aligned addresses two channels per
// lane in one 4-byte store (128 coalesced bytes per warp instruction); rows of a caller's layout
// may sit at odd element offsets, and those take one element per store.
template <class F>
__device__ __forceinline__ void StoreRow(const GpuDst& dst, uint64_t row, uint32_t d, uint32_t lane,
                                         F value) {
  uint16_t* const row16 = static_cast<uint16_t*>(dst.base) + row;
  if (dst.dtype != kGpuF32 && (d & 1u) == 0 && (reinterpret_cast<uintptr_t>(row16) & 3u) == 0) {
    uint32_t* out = reinterpret_cast<uint32_t*>(row16);
    for (uint32_t c2 = lane; c2 < d / 2; c2 += 32) {
      const uint32_t lo = ToHalfBits(value(2 * c2), dst.dtype);
      const uint32_t hi = ToHalfBits(value(2 * c2 + 1), dst.dtype);
      out[c2] = lo | hi << 16;
    }
  } else {
    for (uint32_t c = lane; c < d; c += 32) StoreElement(dst.base, dst.dtype, row + c, value(c));
  }
}

// Blocks of kWarpsPerBlock warps for `units` warp-sized units of work (grid-stride beyond).
inline uint32_t GridBlocks(uint64_t units) {
  const uint64_t b = (units + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<uint32_t>(b < 65535ull * 8 ? b : 65535ull * 8);
}

}  // namespace tqkv::cuda

#endif  // TQKV_SRC_CUDA_WARP_CUH_
