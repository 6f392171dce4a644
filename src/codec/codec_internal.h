// Private pieces shared by the codec implementations (codec.cc, raw_codec.cc, turboquant.cc).
#ifndef TQKV_SRC_CODEC_CODEC_INTERNAL_H_
#define TQKV_SRC_CODEC_CODEC_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/codec.h"

namespace tqkv::codec {

// Vectors per kernel call (scratch of kBatch * head_dim floats) and per thread-pool piece.
inline constexpr size_t kBatch = 64;
inline constexpr size_t kGrain = 256;
// Vectors per split_encode call: their codes (64 KiB at 64 bytes) stay cached for the NaN check.
inline constexpr size_t kSplitPiece = 1024;

// Resolves a spec for one head dimension (rotation kAuto, subset seeds, Lloyd-Max centroids).
Result<CodecParams> ResolveParams(const CodecSpec& spec, uint32_t head_dim);

// Params must have passed ValidateCodecParams.
std::unique_ptr<Codec> MakeRawCodec(const CodecParams& params);
std::unique_ptr<Codec> MakeTurboQuantCodec(const CodecParams& params);
std::unique_ptr<Codec> MakeTransformCodec(const CodecParams& params);

// The transform codec's codebooks: Lloyd-Max for a coordinate of a unit vector in this many
// dimensions, i.e. N(0, 1) to within 1e-6 (lloyd_max.h).
inline constexpr uint32_t kGaussianDim = uint32_t{1} << 20;

// The rotation of a kl block of m channels (a power of two, 8..256; docs/codec.md §11): its
// signs and its enc and dec scale float(1 / sqrt(m)). The codec and the CUDA tables take it here.
struct KlBlockRotation {
  std::vector<float> signs;
  float scale = 1.0f;
};
KlBlockRotation KlRotationOf(uint32_t m);

// kl:B's index bits per vector: B * head_dim rounded down, less the norm's, rounded down to whole
// bytes (every class of the transform codec is a multiple of 8 channels); 0 when none are left.
inline uint32_t KlCodeBits(uint32_t milli, uint32_t head_dim, DType norm_dtype) {
  const uint64_t total = uint64_t{milli} * head_dim / 1000;
  const uint64_t norm_bits = 8 * DTypeSize(norm_dtype);
  if (total < norm_bits + 8) return 0;
  const uint64_t bits = (total - norm_bits) / 8 * 8;
  return static_cast<uint32_t>(bits > 8ull * head_dim ? 8ull * head_dim : bits);
}

// Checks shared by every Encode/Decode/SelectGroupMeta: dtype known, stride >= head_dim,
// pointer present when n > 0, and n * stride representable.
Status CheckVectors(const char* what, const void* p, DType dtype, size_t n, size_t stride,
                    uint32_t head_dim);
// DecodeAdd's key means: head_dim mean values and one scale per vector.
Status CheckMeanScale(size_t mean, size_t scale, uint32_t head_dim, size_t n);
// span.size() >= n * per_item (no overflow).
Status CheckSpan(const char* what, size_t have, size_t n, size_t per_item);
// The error of a codec spec that does not parse: "codec spec '<spec>': <why>" (spec.cc).
Status BadSpec(std::string_view spec, const std::string& why);

}  // namespace tqkv::codec

#endif  // TQKV_SRC_CODEC_CODEC_INTERNAL_H_
