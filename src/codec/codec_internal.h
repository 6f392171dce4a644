// Private pieces shared by the codec implementations (codec.cc, raw_codec.cc, turboquant.cc).
#ifndef TQKV_SRC_CODEC_CODEC_INTERNAL_H_
#define TQKV_SRC_CODEC_CODEC_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "tqkv/codec.h"

namespace tqkv::codec {

// Vectors per kernel call (scratch of kBatch * head_dim floats) and per thread-pool piece.
inline constexpr size_t kBatch = 64;
inline constexpr size_t kGrain = 256;

// Resolves a spec for one head dimension (rotation kAuto, subset seeds, Lloyd-Max centroids).
Result<CodecParams> ResolveParams(const CodecSpec& spec, uint32_t head_dim);

// Params must have passed ValidateCodecParams.
std::unique_ptr<Codec> MakeRawCodec(const CodecParams& params);
std::unique_ptr<Codec> MakeTurboQuantCodec(const CodecParams& params);

// Checks shared by every Encode/Decode/SelectGroupMeta: dtype known, stride >= head_dim,
// pointer present when n > 0, and n * stride representable.
Status CheckVectors(const char* what, const void* p, DType dtype, size_t n, size_t stride,
                    uint32_t head_dim);
// span.size() >= n * per_item (no overflow).
Status CheckSpan(const char* what, size_t have, size_t n, size_t per_item);

}  // namespace tqkv::codec

#endif  // TQKV_SRC_CODEC_CODEC_INTERNAL_H_
