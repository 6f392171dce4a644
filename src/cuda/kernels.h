// Host entry points of the CUDA kernels (one operation per .cu). All pointers are device pointers;
// launches are asynchronous on `stream` and return the launch error (cudaGetLastError).
// Inputs are checked once by the callers (PackCodecParams, src/checkpoint/gpu/cuda_device.cc); kernels trust them.
#ifndef TQKV_SRC_CUDA_KERNELS_H_
#define TQKV_SRC_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/packed.h"

namespace tqkv::cuda {

// decode.cu: decodes a codes chunk, head-major [head][token][code_bytes] for `heads` heads and
// `token_count` tokens starting at absolute token `token_begin`, into `dst` (canonical or paged).
// masks: [head][meta_bytes] group metadata of this (layer, kv): outlier masks of split codecs,
// kl's bits, means and scales; null for codecs without.
// means: the layer's key means when these are mean-removed keys (means null otherwise): channel
// c of the decoded f32 vector gets α·μ_c added (packed.h) before the conversion.
// p.kind kGpuTurboQuant or kGpuTransform (which LaunchKlDecode takes); p.table a device pointer.
cudaError_t LaunchDecode(const GpuCodecParams& p, const uint8_t* codes, const uint8_t* masks,
                         uint32_t heads, uint64_t token_begin, uint32_t token_count,
                         const GpuDst& dst, cudaStream_t stream,
                         const GpuKeyMeans& means = GpuKeyMeans{});
// decode_kl.cu: LaunchDecode for kl codecs (metas required).
cudaError_t LaunchKlDecode(const GpuCodecParams& p, const uint8_t* codes, const uint8_t* metas,
                           uint32_t heads, uint64_t token_begin, uint32_t token_count,
                           const GpuDst& dst, cudaStream_t stream, const GpuKeyMeans& means);

// encode.cu: encodes `tokens` tokens of `heads` heads from x ([token][head][head_dim] of in_dtype)
// into codes, head-major [head][token][code_bytes]. Bit-identical to Codec::Encode. TurboQuant
// and raw codecs only: kl codes are encoded on the CPU (cudaErrorInvalidValue).
cudaError_t LaunchEncode(const GpuCodecParams& p, const void* x, uint32_t in_dtype,
                         const uint8_t* masks, uint32_t heads, uint32_t tokens, uint8_t* codes,
                         cudaStream_t stream);

// raw_copy.cu: raw codec chunk ([head][token][head_dim] of p.raw_dtype) converted into dst.
cudaError_t LaunchRawCopy(const GpuCodecParams& p, const uint8_t* codes, uint32_t heads,
                          uint64_t token_begin, uint32_t token_count, const GpuDst& dst,
                          cudaStream_t stream);

}  // namespace tqkv::cuda

#endif  // TQKV_SRC_CUDA_KERNELS_H_
