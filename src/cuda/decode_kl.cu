// Decode kernel of the transform codec kl:B (docs/codec.md §11): codes -> f32/f16/bf16 in the
// canonical or paged layout, the same floats as the CPU codec (params.cc emulates it per vector).
//
// A warp takes a tile of up to kTile consecutive tokens of one head: it derives the group's layout
// from the metadata once (class sizes by ballots; each channel's row position, a_c = m_c * g and
// b_c = s_c * g into per-warp shared arrays), then decodes the tile's vectors one by one: every
// block a TurboQuant subset (centroids times N * sigma, the FWHT across lanes and registers, the
// signs) parked in a shared row, then x_c = a_c * N + b_c * row[p_c] written coalesced.
#include "cuda/kernels.h"
#include "cuda/warp.cuh"

namespace tqkv::cuda {
namespace {

constexpr uint32_t kTile = 32;  // tokens per layout derivation

template <int E>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    DecodeKlKernel(GpuCodecParams p, const uint8_t* __restrict__ codes,
                   const uint8_t* __restrict__ metas, uint32_t heads, uint64_t token_begin,
                   uint32_t token_count, GpuDst dst, GpuKeyMeans means) {
  __shared__ float srow[kWarpsPerBlock][E * 32];
  __shared__ float sa[kWarpsPerBlock][E * 32];
  __shared__ float sb[kWarpsPerBlock][E * 32];
  __shared__ uint8_t sfrom[kWarpsPerBlock][E * 32];
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t d = p.head_dim;
  const uint32_t norm_bytes = p.norm_dtype == kGpuF16 ? 2u : 4u;
  const uint32_t tiles_per_head = (token_count + kTile - 1) / kTile;
  const uint64_t tiles = static_cast<uint64_t>(heads) * tiles_per_head;
  for (uint64_t t = static_cast<uint64_t>(blockIdx.x) * kWarpsPerBlock + warp; t < tiles;
       t += static_cast<uint64_t>(gridDim.x) * kWarpsPerBlock) {
    const uint32_t head = static_cast<uint32_t>(t / tiles_per_head);
    const uint32_t first = static_cast<uint32_t>(t % tiles_per_head) * kTile;
    const uint32_t last = first + kTile < token_count ? first + kTile : token_count;
    const uint8_t* meta = metas + static_cast<uint64_t>(head) * p.meta_bytes;

    // The group's layout: class sizes, each channel's rank in its class, then row positions.
    uint32_t bits[E], rank[E];
    bool ok = true;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const uint32_t c = static_cast<uint32_t>(e) * 32 + lane;
      bits[e] = c < d ? meta[c] : 0xFFu;
      rank[e] = 0;
      if (c < d) ok = ok && KlChannelOk(meta, d, c);
    }
    uint32_t counts[kGpuKlMaxBits + 1] = {};
    for (uint32_t b = 1; b <= kGpuKlMaxBits; ++b) {
      uint32_t n = 0;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const unsigned in = __ballot_sync(kFullMask, bits[e] == b);
        if (bits[e] == b) rank[e] = n + __popc(in & ((1u << lane) - 1u));
        n += __popc(in);
      }
      counts[b] = n;
    }
    const uint32_t g_bits = KlNormScaleBits(meta, d);
    ok = __all_sync(kFullMask, ok) && KlGroupOk(g_bits, counts, KlCodeBits(p));
    uint32_t start[kGpuKlMaxBits + 1] = {};
    for (uint32_t b = 2; b <= kGpuKlMaxBits; ++b) start[b] = start[b - 1] + counts[b - 1];
    const float g = BitsFloat(g_bits);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const uint32_t c = static_cast<uint32_t>(e) * 32 + lane;
      if (c >= d || !ok) continue;
      const bool coded = bits[e] != 0;
      sfrom[warp][c] = static_cast<uint8_t>(coded ? start[bits[e]] + rank[e] : 0u);
      sa[warp][c] = __fmul_rn(KlMean(meta, d, c), g);
      sb[warp][c] = coded ? __fmul_rn(KlScale(meta, d, c), g) : 0.0f;
    }
    __syncwarp();

    for (uint32_t tok = first; tok < last; ++tok) {
      const uint64_t v = static_cast<uint64_t>(head) * token_count + tok;
      const uint8_t* code = codes + v * p.code_bytes;
      const uint64_t row = DstElementOffset(dst, token_begin + tok, head, 0);
      if (!ok) {  // refused on the host first (device_sink.cc); never read past the code
        StoreRow(dst, row, d, lane, [](uint32_t) { return BitsFloat(kNanNormF32); });
        continue;
      }
      const float n = LoadNormBytes(code, p.norm_dtype);
      uint32_t r = 0, plane = norm_bytes;
      for (uint32_t b = 1; b <= kGpuKlMaxBits; ++b) {
        for (uint32_t m = 32u * E; m >= 8; m >>= 1) {
          if ((counts[b] & m) == 0) continue;
          const float a = __fmul_rn(n, __ldg(p.table + KlScaleAt(m)));
          const uint32_t pb = m / 8;
          float x[E];
#pragma unroll
          for (int e = 0; e < E; ++e) {
            const uint32_t j = static_cast<uint32_t>(e) * 32 + lane;
            x[e] = 0.0f;
            if (j < m) {
              uint32_t idx = 0;
              const uint8_t* pl = code + plane + j / 8;
              for (uint32_t q = 0; q < b; ++q) idx |= ((pl[q * pb] >> (j % 8)) & 1u) << q;
              x[e] = __fmul_rn(__ldg(p.table + KlCentroidsAt(b) + idx), a);
            }
          }
          WarpFwht<E>(x, m, lane);
          WarpMulTable<E>(x, p.table + KlSignsAt(m), m, lane);
#pragma unroll
          for (int e = 0; e < E; ++e) {
            const uint32_t j = static_cast<uint32_t>(e) * 32 + lane;
            if (j < m) srow[warp][r + j] = x[e];
          }
          r += m;
          plane += b * pb;
        }
      }
      __syncwarp();
      const uint8_t* mrow = nullptr;
      float alpha = 0.0f;
      if (means.means != nullptr) {  // mean-removed keys: add α·μ, in f32, no fma
        mrow = KeyMeanRow(means, token_begin + tok, head, d);
        alpha = KeyMeanAlpha(means, token_begin + tok, head);
      }
      StoreRow(dst, row, d, lane, [&](uint32_t c) {
        float x = __fadd_rn(__fmul_rn(sa[warp][c], n), __fmul_rn(sb[warp][c], srow[warp][sfrom[warp][c]]));
        if (mrow != nullptr) x = __fadd_rn(x, __fmul_rn(alpha, LoadKeyMean(mrow, means.dtype, c)));
        return x;
      });
      __syncwarp();
    }
  }
}

}  // namespace

cudaError_t LaunchKlDecode(const GpuCodecParams& p, const uint8_t* codes, const uint8_t* metas,
                           uint32_t heads, uint64_t token_begin, uint32_t token_count,
                           const GpuDst& dst, cudaStream_t stream, const GpuKeyMeans& means) {
  if (p.kind != kGpuTransform || metas == nullptr) return cudaErrorInvalidValue;
  const uint64_t tiles = static_cast<uint64_t>(heads) * ((token_count + kTile - 1) / kTile);
  if (tiles == 0) return cudaSuccess;
  const dim3 grid(GridBlocks(tiles)), block(kWarpsPerBlock * 32);
  switch (RegsForHeadDim(p.head_dim)) {
    case 2: DecodeKlKernel<2><<<grid, block, 0, stream>>>(p, codes, metas, heads, token_begin, token_count, dst, means); break;
    case 4: DecodeKlKernel<4><<<grid, block, 0, stream>>>(p, codes, metas, heads, token_begin, token_count, dst, means); break;
    default: DecodeKlKernel<8><<<grid, block, 0, stream>>>(p, codes, metas, heads, token_begin, token_count, dst, means); break;
  }
  return cudaGetLastError();
}

}  // namespace tqkv::cuda
