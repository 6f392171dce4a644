// Decode kernel: TurboQuant codes -> f32/f16/bf16 in the canonical or paged layout.
// One warp per vector (token, head); the warp decodes each subset in registers, parks the floats in
// a per-warp shared buffer in subset order, then writes channel c (coalesced) from slot
// ChannelSlot(mask, c). Arithmetic as kernels.h's Decode, so the floats equal the CPU codec's.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/kernels.h"
#include "cuda/warp.cuh"

namespace tqkv::cuda {
namespace {

template <int E>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    DecodeKernel(GpuCodecParams p, const uint8_t* __restrict__ codes,
                 const uint8_t* __restrict__ masks, uint32_t heads, uint64_t token_begin,
                 uint32_t token_count, GpuDst dst, GpuKeyMeans means) {
  __shared__ float sbuf[kWarpsPerBlock][E * 32];
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* buf = sbuf[warp];
  const uint64_t n = static_cast<uint64_t>(heads) * token_count;
  const uint32_t k_out = p.num_subsets == 2 ? p.subsets[0].dim : 0;
  for (uint64_t v = static_cast<uint64_t>(blockIdx.x) * kWarpsPerBlock + warp; v < n;
       v += static_cast<uint64_t>(gridDim.x) * kWarpsPerBlock) {
    const uint32_t head = static_cast<uint32_t>(v / token_count);
    const uint32_t tok = static_cast<uint32_t>(v % token_count);
    const uint8_t* code = codes + v * p.code_bytes;
    uint32_t base = 0;
    for (uint32_t s = 0; s < p.num_subsets; ++s) {
      const GpuSubset g = s == 0 ? p.subsets[0] : p.subsets[1];  // no dynamic param indexing
      const uint32_t m = g.dim, pb = (m + 7) / 8;
      const float a = __fmul_rn(LoadNormBytes(code + g.norm_offset, p.norm_dtype), g.dec_scale);
      float x[E];
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const uint32_t j = static_cast<uint32_t>(e) * 32 + lane;
        x[e] = 0.0f;
        if (j < m) {
          uint32_t idx = 0;
          const uint8_t* pl = code + g.planes_offset + j / 8;
          for (uint32_t b = 0; b < g.bits; ++b) idx |= ((pl[b * pb] >> (j % 8)) & 1u) << b;
          x[e] = __fmul_rn(__ldg(p.table + g.centroids + idx), a);
        }
      }
      float o[E];
      if (g.rotation == kGpuHaar) {
        WarpMatVecT<E>(p.table + g.haar, x, m, lane, o);
      } else if (g.rotation == kGpuKronecker) {
        WarpKronMix<E>(p.table + g.haar, x, m, g.block, lane, buf + base, o);
        WarpFwht<E>(o, g.block, lane);
        WarpMulTable<E>(o, p.table + g.signs1, m, lane);
      } else {
        WarpFwht<E>(x, m, lane);
        if (g.rotation == kGpuHadamard2) {
          WarpMulTable<E>(x, p.table + g.signs2, m, lane);
          WarpFwht<E>(x, m, lane);
        }
#pragma unroll
        for (int e = 0; e < E; ++e) o[e] = x[e];
        WarpMulTable<E>(o, p.table + g.signs1, m, lane);
      }
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const uint32_t j = static_cast<uint32_t>(e) * 32 + lane;
        if (j < m) buf[base + j] = o[e];
      }
      base += m;
    }
    __syncwarp();
    const uint8_t* mask = p.num_subsets == 2 ? masks + static_cast<size_t>(head) * p.meta_bytes
                                             : nullptr;
    if (means.means != nullptr) {  // mean-removed keys: add α·μ, in f32, no fma
      const uint8_t* mrow = KeyMeanRow(means, token_begin + tok, head, p.head_dim);
      const float alpha = KeyMeanAlpha(means, token_begin + tok, head);
      for (uint32_t c = lane; c < p.head_dim; c += 32) {
        float* slot = buf + ChannelSlot(mask, c, k_out);
        *slot = __fadd_rn(*slot, __fmul_rn(alpha, LoadKeyMean(mrow, means.dtype, c)));
      }
      __syncwarp();
    }
    StoreRow(dst, DstElementOffset(dst, token_begin + tok, head, 0), p.head_dim, lane,
             [&](uint32_t c) { return buf[ChannelSlot(mask, c, k_out)]; });
    __syncwarp();
  }
}

}  // namespace

cudaError_t LaunchDecode(const GpuCodecParams& p, const uint8_t* codes, const uint8_t* masks,
                         uint32_t heads, uint64_t token_begin, uint32_t token_count,
                         const GpuDst& dst, cudaStream_t stream, const GpuKeyMeans& means) {
  if (p.kind == kGpuTransform) {
    return LaunchKlDecode(p, codes, masks, heads, token_begin, token_count, dst, stream, means);
  }
  const uint64_t n = static_cast<uint64_t>(heads) * token_count;
  if (n == 0) return cudaSuccess;
  const dim3 grid(GridBlocks(n)), block(kWarpsPerBlock * 32);
  switch (RegsForHeadDim(p.head_dim)) {
    case 2: DecodeKernel<2><<<grid, block, 0, stream>>>(p, codes, masks, heads, token_begin, token_count, dst, means); break;
    case 4: DecodeKernel<4><<<grid, block, 0, stream>>>(p, codes, masks, heads, token_begin, token_count, dst, means); break;
    default: DecodeKernel<8><<<grid, block, 0, stream>>>(p, codes, masks, heads, token_begin, token_count, dst, means); break;
  }
  return cudaGetLastError();
}

}  // namespace tqkv::cuda
