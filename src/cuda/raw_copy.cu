// Raw codec copy: a raw chunk ([head][token][head_dim] of the stored dtype) converted element by
// element (packed.h's bit-exact conversions) into the canonical or paged destination.
#include "cuda/kernels.h"

namespace tqkv::cuda {
namespace {

__global__ void RawCopyKernel(GpuCodecParams p, const uint8_t* __restrict__ codes, uint32_t heads,
                              uint64_t token_begin, uint32_t token_count, GpuDst dst) {
  const uint64_t d = p.head_dim;
  const uint64_t n = static_cast<uint64_t>(heads) * token_count * d;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint64_t vec = i / d;
    const uint32_t c = static_cast<uint32_t>(i % d);
    const uint32_t head = static_cast<uint32_t>(vec / token_count);
    const uint64_t tok = vec % token_count;
    StoreElement(dst.base, dst.dtype, DstElementOffset(dst, token_begin + tok, head, c),
                 LoadElement(codes, p.raw_dtype, i));
  }
}

}  // namespace

cudaError_t LaunchRawCopy(const GpuCodecParams& p, const uint8_t* codes, uint32_t heads,
                          uint64_t token_begin, uint32_t token_count, const GpuDst& dst,
                          cudaStream_t stream) {
  const uint64_t n = static_cast<uint64_t>(heads) * token_count * p.head_dim;
  if (n == 0) return cudaSuccess;
  uint64_t blocks = (n + 255) / 256;
  if (blocks > 65535ull * 16) blocks = 65535ull * 16;
  RawCopyKernel<<<static_cast<uint32_t>(blocks), 256, 0, stream>>>(p, codes, heads, token_begin,
                                                                   token_count, dst);
  return cudaGetLastError();
}

}  // namespace tqkv::cuda
