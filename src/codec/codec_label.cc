// CodecLabel: the spec a stored codec was resolved from (the inverse of Codec::Create).
#include "codec/codec_internal.h"
#include "tqkv/codec.h"

namespace tqkv {

std::string CodecLabel(const CodecParams& p) {
  if (p.kind == CodecKind::kRaw) {
    switch (p.raw_dtype) {
      case DType::kF16: return "fp16";
      case DType::kBF16: return "bf16";
      case DType::kF32: return "fp32";
    }
  }
  if (p.kind == CodecKind::kTransform) {
    // The shortest B (whole, tenths, hundredths, then thousandths) that resolves to these bits.
    CodecSpec spec;
    spec.kind = CodecKind::kTransform;
    spec.norm_dtype = p.norm_dtype;
    spec.kl_milli = 8000;
    for (uint32_t step : {1000u, 100u, 10u, 1u}) {
      bool found = false;
      for (uint32_t milli = 1000; milli <= 8000 && !found; milli += step) {
        if (codec::KlCodeBits(milli, p.head_dim, p.norm_dtype) == p.code_bits) {
          spec.kl_milli = milli;
          found = true;
        }
      }
      if (found) break;
    }
    return FormatCodecSpec(spec);
  }
  // Rebuild the spec the params were resolved from (seeds aside) and print it.
  CodecSpec spec;
  spec.kind = CodecKind::kTurboQuant;
  const SubsetParams& last = p.subsets.back();
  spec.bits = static_cast<uint8_t>(last.bits + (p.qjl ? 1 : 0));
  if (p.split()) {
    spec.outlier_bits = p.subsets[0].bits;
    if (p.subsets[0].channels * 4u == p.head_dim) {
      spec.outlier_num = 1;
      spec.outlier_den = 4;
    } else {
      spec.outlier_channels = p.subsets[0].channels;
    }
  }
  const bool pow2 = (last.channels & (last.channels - 1)) == 0;
  spec.rotation = (last.rotation == RotationKind::kHadamard && pow2) ||
                          (last.rotation == RotationKind::kKronecker && !pow2)
                      ? RotationKind::kAuto
                      : last.rotation;
  spec.norm_dtype = p.norm_dtype;
  spec.norm_correction = p.norm_correction;
  spec.qjl = p.qjl;
  return FormatCodecSpec(spec);
}

}  // namespace tqkv

namespace tqkv {

std::string KvCodecLabel(const CodecParams& k, const CodecParams& v) {
  return JoinKvLabels(CodecLabel(k), CodecLabel(v));
}

}  // namespace tqkv
