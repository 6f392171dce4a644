// Encode kernel: f32/f16/bf16 vectors ([token][head][head_dim]) -> TurboQuant codes, head-major.
// One warp per vector; the arithmetic order is kernels.h's Encode (Sum8 tree, FWHT stage order,
// fma MatVec and KronMix, strict thresholds, ballot-built bit planes), so codes are bit-identical to the CPU.
#include "cuda/kernels.h"
#include "cuda/warp.cuh"

namespace tqkv::cuda {
namespace {

template <int E>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    EncodeKernel(GpuCodecParams p, const void* __restrict__ x, uint32_t in_dtype,
                 const uint8_t* __restrict__ masks, uint32_t heads, uint32_t tokens,
                 uint8_t* __restrict__ codes) {
  __shared__ float sbuf[kWarpsPerBlock][E * 32];
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* buf = sbuf[warp];
  const uint64_t n = static_cast<uint64_t>(heads) * tokens;
  const uint32_t k_out = p.num_subsets == 2 ? p.subsets[0].dim : 0;
  for (uint64_t v = static_cast<uint64_t>(blockIdx.x) * kWarpsPerBlock + warp; v < n;
       v += static_cast<uint64_t>(gridDim.x) * kWarpsPerBlock) {
    const uint32_t head = static_cast<uint32_t>(v / tokens);
    const uint32_t tok = static_cast<uint32_t>(v % tokens);
    const uint8_t* mask = p.num_subsets == 2 ? masks + static_cast<size_t>(head) * p.meta_bytes
                                             : nullptr;
    const uint64_t row = (static_cast<uint64_t>(tok) * heads + head) * p.head_dim;
    for (uint32_t c = lane; c < p.head_dim; c += 32) {
      buf[ChannelSlot(mask, c, k_out)] = LoadElement(x, in_dtype, row + c);
    }
    __syncwarp();
    uint8_t* code = codes + v * p.code_bytes;
    float stored0 = 0.0f, stored1 = 0.0f;
    bool any_nan = false;
    uint32_t base = 0;
    for (uint32_t s = 0; s < p.num_subsets; ++s) {
      const GpuSubset g = s == 0 ? p.subsets[0] : p.subsets[1];  // no dynamic param indexing
      const uint32_t m = g.dim, pb = (m + 7) / 8;
      float xv[E];
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const uint32_t j = static_cast<uint32_t>(e) * 32 + lane;
        xv[e] = j < m ? buf[base + j] : 0.0f;
      }
      float* slots = buf + base;  // free once read: the Kronecker mix parks its input there
      base += m;
      const float norm = __fsqrt_rn(WarpSum8Squares<E>(xv, m, lane));
      uint32_t idx[E];
#pragma unroll
      for (int e = 0; e < E; ++e) idx[e] = 0;
      float st;
      if (norm == 0.0f || !isfinite(norm)) {
        st = norm == 0.0f ? 0.0f : __uint_as_float(kNanNormF32);
      } else {
        float y[E];
        if (g.rotation == kGpuHaar) {
          WarpMatVecT<E>(p.table + g.haar_t, xv, m, lane, y);
        } else if (g.rotation == kGpuKronecker) {
          float t[E];
#pragma unroll
          for (int e = 0; e < E; ++e) t[e] = xv[e];
          WarpMulTable<E>(t, p.table + g.signs1, m, lane);
          WarpFwht<E>(t, g.block, lane);  // aligned B-blocks: the same stages on every block
          WarpKronMix<E>(p.table + g.haar_t, t, m, g.block, lane, slots, y);
        } else {
#pragma unroll
          for (int e = 0; e < E; ++e) y[e] = xv[e];
          WarpMulTable<E>(y, p.table + g.signs1, m, lane);
          WarpFwht<E>(y, m, lane);
          if (g.rotation == kGpuHadamard2) {
            WarpMulTable<E>(y, p.table + g.signs2, m, lane);
            WarpFwht<E>(y, m, lane);
          }
        }
        const float sc = __fdiv_rn(g.enc_scale, norm);
        const float* th = p.table + g.thresholds;
        const uint32_t count = (1u << g.bits) - 1;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const float z = __fmul_rn(y[e], sc);
          uint32_t lo = 0, hi = count;  // count of thresholds t < z (ascending; NaN gives 0)
          while (lo < hi) {
            const uint32_t mid = (lo + hi) / 2;
            if (__ldg(th + mid) < z) lo = mid + 1; else hi = mid;
          }
          idx[e] = lo;
        }
        st = norm;
        if (p.norm_correction) {
          float cw[E];
#pragma unroll
          for (int e = 0; e < E; ++e) {
            const uint32_t j = static_cast<uint32_t>(e) * 32 + lane;
            cw[e] = j < m ? __ldg(p.table + g.centroids + idx[e]) : 0.0f;
          }
          const float cs = WarpSum8Squares<E>(cw, m, lane);
          st = __fmul_rn(norm, __fsqrt_rn(__fdiv_rn(static_cast<float>(m), cs)));
        }
      }
      // Bit planes: word e of plane b is the ballot of bit b over register e.
      for (uint32_t b = 0; b < g.bits; ++b) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          if (static_cast<uint32_t>(e) * 32 >= m) break;
          const uint32_t j = static_cast<uint32_t>(e) * 32 + lane;
          const unsigned word = __ballot_sync(kFullMask, j < m && ((idx[e] >> b) & 1u));
          const uint32_t byte = static_cast<uint32_t>(e) * 4 + lane;
          if (lane < 4 && byte < pb) {
            code[g.planes_offset + b * pb + byte] = static_cast<uint8_t>(word >> (8 * lane));
          }
        }
      }
      if (s == 0) stored0 = st; else stored1 = st;
      any_nan |= isnan(st);
    }
    if (lane == 0) {
      const float nan = __uint_as_float(kNanNormF32);
      StoreNormBytes(any_nan ? nan : stored0, p.norm_dtype, code + p.subsets[0].norm_offset);
      if (p.num_subsets == 2) {
        StoreNormBytes(any_nan ? nan : stored1, p.norm_dtype, code + p.subsets[1].norm_offset);
      }
    }
    __syncwarp();
  }
}

}  // namespace

cudaError_t LaunchEncode(const GpuCodecParams& p, const void* x, uint32_t in_dtype,
                         const uint8_t* masks, uint32_t heads, uint32_t tokens, uint8_t* codes,
                         cudaStream_t stream) {
  if (p.kind == kGpuTransform) return cudaErrorInvalidValue;
  const uint64_t n = static_cast<uint64_t>(heads) * tokens;
  if (n == 0) return cudaSuccess;
  uint64_t blocks = (n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 65535ull * 8) blocks = 65535ull * 8;
  const dim3 grid(static_cast<uint32_t>(blocks)), block(kWarpsPerBlock * 32);
  switch (RegsForHeadDim(p.head_dim)) {
    case 2: EncodeKernel<2><<<grid, block, 0, stream>>>(p, x, in_dtype, masks, heads, tokens, codes); break;
    case 4: EncodeKernel<4><<<grid, block, 0, stream>>>(p, x, in_dtype, masks, heads, tokens, codes); break;
    default: EncodeKernel<8><<<grid, block, 0, stream>>>(p, x, in_dtype, masks, heads, tokens, codes); break;
  }
  return cudaGetLastError();
}

}  // namespace tqkv::cuda
