// Host side of the shared layout: builds GpuCodecParams (and its float table) from CodecParams,
// and emulates the kernels on the host with the same packed params (tests, and the CPU check of
// everything the kernels read). No CUDA header needed.
#ifndef TQKV_SRC_CUDA_PARAMS_H_
#define TQKV_SRC_CUDA_PARAMS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/packed.h"
#include "tqkv/codec.h"
#include "tqkv/status.h"
#include "tqkv/types.h"

namespace tqkv::cuda {

struct PackedCodec {
  GpuCodecParams params{};   // params.table points into `table` (host) until uploaded
  std::vector<float> table;  // signs, Haar matrices, centroids, thresholds of every subset
};

GpuDType ToGpuDType(DType t);

// Unsupported for what the kernels do not cover: QJL codecs, head_dim > 256. InvalidArgument for
// params that fail ValidateCodecParams.
Result<PackedCodec> PackCodecParams(const CodecParams& params);

// Host emulation of the decode kernel for one vector: the kernels' arithmetic in scalar form, read
// only through `p` (offsets, scales, table) and the packed.h helpers. mask: the (kv, head) outlier
// mask or null. out: head_dim elements of `out_dtype` in channel order. mean_row: for
// mean-removed keys the vector's KeyMeanRow (head_dim values of mean_dtype) and alpha its
// KeyMeanAlpha, else null.
void EmulateDecodeVector(const GpuCodecParams& p, const uint8_t* code, const uint8_t* mask,
                         void* out, uint32_t out_dtype, const uint8_t* mean_row = nullptr,
                         uint32_t mean_dtype = kGpuF32, float alpha = 0.0f);
// Host emulation of the encode kernel for one vector (x: head_dim elements of in_dtype).
void EmulateEncodeVector(const GpuCodecParams& p, const void* x, uint32_t in_dtype,
                         const uint8_t* mask, uint8_t* code);

}  // namespace tqkv::cuda

#endif  // TQKV_SRC_CUDA_PARAMS_H_
