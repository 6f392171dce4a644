// Codec::Create / Codec::FromParams: spec resolution and argument checks shared by the codecs.
#include <algorithm>
#include <limits>
#include <string>

#include "codec/codec_internal.h"
#include "codec/lloyd_max.h"
#include "common/prng.h"

namespace tqkv {
namespace codec {
namespace {

// Salt of the QJL matrix seed (derived from the spec seed, independent of every subset's seed).
constexpr uint64_t kQjlSalt = 0x716a6c;  // "qjl"
// Smallest subset: the Lloyd-Max density needs m >= 3; 4 keeps every split meaningful.
constexpr uint32_t kMinSubset = 4;

bool IsPow2(uint32_t m) { return m != 0 && (m & (m - 1)) == 0; }

// kl:B: B * head_dim bits per vector (rounded down), less the norm's; 8 codebooks.
Result<CodecParams> ResolveTransform(const CodecSpec& spec, uint32_t head_dim,
                                     const std::string& where) {
  CodecParams p;
  p.kind = CodecKind::kTransform;
  p.head_dim = head_dim;
  if (head_dim < 16 || head_dim > kMaxTransformHeadDim || head_dim % 8 != 0) {
    return Status::InvalidArgument("codec: kl needs a head_dim that is a multiple of 8 from 16 to " +
                                   std::to_string(kMaxTransformHeadDim) + where);
  }
  if (spec.kl_milli < 1000 || spec.kl_milli > 8000) {
    return Status::InvalidArgument("codec: kl:B needs 1 <= B <= 8" + where);
  }
  if (spec.norm_dtype != DType::kF32 && spec.norm_dtype != DType::kF16) {
    return Status::InvalidArgument("codec: kl norm dtype must be f16 or f32" + where);
  }
  p.norm_dtype = spec.norm_dtype;
  p.code_bits = KlCodeBits(spec.kl_milli, head_dim, spec.norm_dtype);
  if (p.code_bits == 0) return Status::InvalidArgument("codec: kl:B leaves no index byte" + where);
  for (uint8_t bits = 1; bits <= 8; ++bits) {
    SubsetParams s;
    s.channels = static_cast<uint16_t>(head_dim);
    s.bits = bits;
    s.rotation = RotationKind::kAuto;  // none
    const auto cb = LloydMaxCodebook(kGaussianDim, bits);
    if (!cb) return Status::Internal("codec: no Gaussian codebook of " + std::to_string(bits));
    s.centroids.assign(cb->centroids.begin(), cb->centroids.end());
    p.subsets.push_back(std::move(s));
  }
  return p;
}

}  // namespace

Result<CodecParams> ResolveParams(const CodecSpec& spec, uint32_t head_dim) {
  CodecParams p;
  p.kind = spec.kind;
  p.head_dim = head_dim;
  const std::string where =
      " (" + FormatCodecSpec(spec) + ", head_dim " + std::to_string(head_dim) + ")";
  if (head_dim == 0 || head_dim > 65535) {
    return Status::InvalidArgument("codec: head_dim must be 1..65535" + where);
  }
  if (spec.kind == CodecKind::kRaw) {
    p.raw_dtype = spec.raw_dtype;
    return p;
  }
  if (spec.kind == CodecKind::kTransform) return ResolveTransform(spec, head_dim, where);
  if (spec.kind != CodecKind::kTurboQuant) return Status::InvalidArgument("codec: unknown kind");
  if (head_dim < 16)
    return Status::InvalidArgument("codec: TurboQuant needs head_dim >= 16" + where);
  if (spec.bits < 1 || spec.bits > 8)
    return Status::InvalidArgument("codec: bits must be 1..8" + where);
  if (spec.qjl && (spec.outlier_bits != 0 || spec.bits < 2)) {
    return Status::InvalidArgument("codec: qjl needs an unsplit codec with b >= 2" + where);
  }
  if (spec.norm_dtype != DType::kF32 && spec.norm_dtype != DType::kF16) {
    return Status::InvalidArgument("codec: norm dtype must be f32 or f16" + where);
  }
  p.norm_dtype = spec.norm_dtype;
  p.norm_correction = spec.norm_correction;
  p.qjl = spec.qjl;
  struct Part {
    uint32_t channels;
    uint8_t bits;
  };
  std::vector<Part> parts;
  if (spec.outlier_bits != 0) {
    if (spec.outlier_bits > 8)
      return Status::InvalidArgument("codec: outlier bits must be 1..8" + where);
    uint64_t k = spec.outlier_channels;
    if (k == 0) {
      if (spec.outlier_den == 0 || spec.outlier_num == 0 || spec.outlier_num >= spec.outlier_den) {
        return Status::InvalidArgument("codec: bad outlier fraction" + where);
      }
      k = uint64_t{head_dim} * spec.outlier_num / spec.outlier_den;
    }
    if (k < kMinSubset || k + kMinSubset > head_dim) {
      return Status::InvalidArgument("codec: split of " + std::to_string(k) +
                                     " outlier channels leaves a subset under " +
                                     std::to_string(kMinSubset) + " channels" + where);
    }
    parts.push_back({static_cast<uint32_t>(k), spec.outlier_bits});
    parts.push_back({static_cast<uint32_t>(head_dim - k), spec.bits});
  } else {
    parts.push_back({head_dim, static_cast<uint8_t>(spec.qjl ? spec.bits - 1 : spec.bits)});
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    SubsetParams s;
    s.channels = static_cast<uint16_t>(parts[i].channels);
    s.bits = parts[i].bits;
    s.rotation = spec.rotation;
    if (s.rotation == RotationKind::kAuto) {
      s.rotation = IsPow2(s.channels) ? RotationKind::kHadamard : RotationKind::kKronecker;
    } else if ((s.rotation == RotationKind::kHadamard || s.rotation == RotationKind::kHadamard2) &&
               !IsPow2(s.channels)) {
      return Status::InvalidArgument("codec: rot=" + std::string(RotationKindName(s.rotation)) +
                                     " needs a power-of-two subset, got " +
                                     std::to_string(s.channels) + " channels" + where);
    }
    s.seed = DeriveSeed(spec.seed, i);
    const auto cb = LloydMaxCodebook(s.channels, s.bits);
    if (!cb) return Status::Internal("codec: no codebook for " + std::to_string(s.channels));
    s.centroids.assign(cb->centroids.begin(), cb->centroids.end());
    p.subsets.push_back(std::move(s));
  }
  if (p.qjl) p.qjl_seed = DeriveSeed(spec.seed, kQjlSalt);
  return p;
}

Status CheckVectors(const char* what, const void* p, DType dtype, size_t n, size_t stride,
                    uint32_t head_dim) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(std::string(what) + ": " + why);
  };
  if (static_cast<uint8_t>(dtype) > static_cast<uint8_t>(DType::kBF16)) return bad("unknown dtype");
  if (n == 0) return Status::Ok();
  if (p == nullptr) return bad("null vector pointer");
  if (stride < head_dim) {
    return bad("stride " + std::to_string(stride) + " < head_dim " + std::to_string(head_dim));
  }
  if (stride > std::numeric_limits<size_t>::max() / 4 / n) return bad("n * stride overflows");
  return Status::Ok();
}

Status CheckMeanScale(size_t mean, size_t scale, uint32_t head_dim, size_t n) {
  if (mean == head_dim && scale == n) return Status::Ok();
  return Status::InvalidArgument("DecodeAdd: " + std::to_string(mean) + " mean and " +
                                 std::to_string(scale) + " scale values for head_dim " +
                                 std::to_string(head_dim) + " and " + std::to_string(n) +
                                 " vectors");
}

Status CheckSpan(const char* what, size_t have, size_t n, size_t per_item) {
  if (per_item != 0 && n > std::numeric_limits<size_t>::max() / per_item) {
    return Status::InvalidArgument(std::string(what) + ": size overflows");
  }
  if (have < n * per_item) {
    return Status::InvalidArgument(std::string(what) + ": " + std::to_string(have) +
                                   " bytes, need " + std::to_string(n * per_item));
  }
  return Status::Ok();
}

}  // namespace codec

Result<std::unique_ptr<Codec>> Codec::Create(const CodecSpec& spec, uint32_t head_dim) {
  TQKV_ASSIGN_OR_RETURN(CodecParams params, codec::ResolveParams(spec, head_dim));
  return FromParams(params);
}

Status Codec::DecodeAdd(std::span<const uint8_t>, size_t, std::span<const uint8_t>,
                        std::span<const float>, std::span<const float>, void*, DType, size_t,
                        ThreadPool*) const {
  return Status::InvalidArgument("DecodeAdd: codec " + CodecLabel(params()) +
                                 " has no offset decode (TurboQuant only)");
}

Result<std::unique_ptr<Codec>> Codec::FromParams(const CodecParams& params) {
  TQKV_RETURN_IF_ERROR(ValidateCodecParams(params));
  if (params.kind == CodecKind::kRaw) return codec::MakeRawCodec(params);
  if (params.kind == CodecKind::kTransform) return codec::MakeTransformCodec(params);
  return codec::MakeTurboQuantCodec(params);
}

}  // namespace tqkv
