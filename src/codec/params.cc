// Sizes and validation of resolved codec parameters (no Codec instance needed).
#include <cmath>
#include <string>

#include "tqkv/codec.h"

namespace tqkv {

std::string_view RotationKindName(RotationKind k) {
  switch (k) {
    case RotationKind::kAuto: return "auto";
    case RotationKind::kHadamard: return "hd";
    case RotationKind::kHadamard2: return "hd2";
    case RotationKind::kHaar: return "haar";
    case RotationKind::kKronecker: return "kron";
  }
  return "unknown";
}

uint32_t MaxRotationChannels(RotationKind k) {
  switch (k) {
    case RotationKind::kHadamard:
    case RotationKind::kHadamard2: return 32768;  // the largest power of two below 65536
    case RotationKind::kHaar: return 256;         // 1 MiB to build, 2^25 ops
    // m = q·B: its Haar factor q (the odd part) is held to the Haar limit in ValidateCodecParams.
    case RotationKind::kKronecker: return 32768;
    case RotationKind::kAuto: return 0;
  }
  return 0;
}

// The odd part q of m = q·B (B the largest power of two dividing m): the Kronecker Haar factor.
static uint32_t KroneckerHaarFactor(uint32_t m) { return m == 0 ? 0 : m >> __builtin_ctz(m); }

CodecSetupCost RotationSetupCost(RotationKind k, uint32_t channels) {
  const uint64_t c = channels;
  switch (k) {
    case RotationKind::kHadamard: return {4 * c, c};
    case RotationKind::kHadamard2: return {8 * c, 2 * c};
    // Q and Q^T as floats (a double working copy while building); two Gram-Schmidt passes.
    case RotationKind::kHaar: return {16 * c * c, 2 * c * c * c + c * c};
    case RotationKind::kKronecker: {  // a Haar factor of the odd part, signs of all m
      const CodecSetupCost q =
          RotationSetupCost(RotationKind::kHaar, KroneckerHaarFactor(channels));
      return {q.bytes + 4 * c, q.ops + c};
    }
    case RotationKind::kAuto: return {};
  }
  return {};
}

CodecSetupCost SetupCostOf(const CodecParams& p) {
  CodecSetupCost cost;
  if (p.kind == CodecKind::kTransform) {  // codebooks, thresholds, one rotation per class size
    cost = {8 * 510, 510};
    for (uint32_t m = 8; m <= p.head_dim; m += 8) {
      const CodecSetupCost r = RotationSetupCost(
          (m & (m - 1)) == 0 ? RotationKind::kHadamard : RotationKind::kKronecker, m);
      cost.bytes += r.bytes;
      cost.ops += r.ops;
    }
    return cost;
  }
  for (const auto& s : p.subsets) {
    const CodecSetupCost r = RotationSetupCost(s.rotation, s.channels);
    cost.bytes += r.bytes + 8 * s.centroids.size();  // centroids and thresholds
    cost.ops += r.ops + s.centroids.size();
  }
  if (p.qjl) {
    const uint64_t d = p.head_dim;
    cost.bytes += 4 * d * d;
    cost.ops += d * d;
  }
  return cost;
}

size_t CodeBytesOf(const CodecParams& p) {
  if (p.kind == CodecKind::kRaw) return static_cast<size_t>(p.head_dim) * DTypeSize(p.raw_dtype);
  if (p.kind == CodecKind::kTransform) return DTypeSize(p.norm_dtype) + p.code_bits / 8;
  size_t bytes = 0;
  for (const auto& s : p.subsets) {
    bytes += DTypeSize(p.norm_dtype) + static_cast<size_t>(s.bits) * ((s.channels + 7) / 8);
  }
  if (p.qjl) bytes += 4 + (p.head_dim + 7) / 8;
  return bytes;
}

size_t GroupMetaBytesOf(const CodecParams& p) {
  // bits, means and scales per channel, then the norm scale
  if (p.kind == CodecKind::kTransform) return size_t{5} * p.head_dim + 4;
  return p.kind == CodecKind::kTurboQuant && p.split() ? (p.head_dim + 7) / 8 : 0;
}

static Status ValidateCodebook(const SubsetParams& s, const char* what) {
  if (s.centroids.size() != (size_t{1} << s.bits)) {
    return Status::InvalidArgument(std::string("codec params: ") + what + ": centroid count");
  }
  for (size_t i = 0; i < s.centroids.size(); ++i) {
    if (!std::isfinite(s.centroids[i]) || (i > 0 && !(s.centroids[i] > s.centroids[i - 1]))) {
      return Status::InvalidArgument(std::string("codec params: ") + what +
                                     ": centroids not finite and ascending");
    }
  }
  return Status::Ok();
}

static Status ValidateTransform(const CodecParams& p) {
  auto bad = [](const std::string& why) { return Status::InvalidArgument("codec params: " + why); };
  if (p.head_dim < 16 || p.head_dim > kMaxTransformHeadDim || p.head_dim % 8 != 0) {
    return bad("kl needs a head_dim that is a multiple of 8 from 16 to " +
               std::to_string(kMaxTransformHeadDim));
  }
  if (p.norm_dtype != DType::kF32 && p.norm_dtype != DType::kF16) return bad("kl norm dtype");
  if (p.norm_correction || p.qjl || p.qjl_seed != 0) return bad("kl with nc, qjl or a qjl seed");
  if (p.code_bits < 8 || p.code_bits > 8ull * p.head_dim || p.code_bits % 8 != 0) {
    return bad("kl code bits " + std::to_string(p.code_bits) + " (1.." +
               std::to_string(8ull * p.head_dim) + ", whole bytes)");
  }
  if (p.subsets.size() != 8) return bad("kl needs 8 codebooks");
  for (size_t j = 0; j < 8; ++j) {
    const SubsetParams& s = p.subsets[j];
    if (s.channels != p.head_dim || s.bits != j + 1 || s.rotation != RotationKind::kAuto ||
        s.seed != 0) {
      return bad("kl codebook " + std::to_string(j) + ": channels, bits, rotation or seed");
    }
    TQKV_RETURN_IF_ERROR(ValidateCodebook(s, "kl codebook"));
  }
  return Status::Ok();
}

Status ValidateCodecParams(const CodecParams& p) {
  auto bad = [](const std::string& why) { return Status::InvalidArgument("codec params: " + why); };
  if (p.head_dim == 0 || p.head_dim > 65535) return bad("head_dim " + std::to_string(p.head_dim));
  if (p.kind == CodecKind::kRaw) {
    if (p.raw_dtype != DType::kF16 && p.raw_dtype != DType::kBF16 && p.raw_dtype != DType::kF32) {
      return bad("raw dtype");
    }
    if (!p.subsets.empty()) return bad("raw codec with subsets");
    return Status::Ok();
  }
  if (p.kind == CodecKind::kTransform) return ValidateTransform(p);
  if (p.kind != CodecKind::kTurboQuant) return bad("unknown codec kind");
  if (p.head_dim < 16) return bad("TurboQuant needs head_dim >= 16");
  if (p.subsets.empty() || p.subsets.size() > 2) return bad("1 or 2 subsets");
  if (p.norm_dtype != DType::kF32 && p.norm_dtype != DType::kF16) return bad("norm dtype");
  if (p.qjl && p.split()) return bad("qjl with a split codec");
  if (p.qjl && p.head_dim > kMaxQjlHeadDim) {
    return bad("qjl on head_dim " + std::to_string(p.head_dim) + " (its matrix is dense: at most " +
               std::to_string(kMaxQjlHeadDim) + ")");
  }
  uint32_t total = 0;
  for (const auto& s : p.subsets) {
    if (s.channels == 0) return bad("empty subset");
    if (s.bits < 1 || s.bits > 8) return bad("bits " + std::to_string(s.bits));
    const bool pow2 = (s.channels & (s.channels - 1)) == 0;
    switch (s.rotation) {
      case RotationKind::kHadamard:
      case RotationKind::kHadamard2:
        if (!pow2) return bad("Hadamard rotation on " + std::to_string(s.channels) + " channels");
        break;
      case RotationKind::kHaar:
      case RotationKind::kKronecker: break;
      default: return bad("rotation kind");
    }
    if (s.rotation == RotationKind::kKronecker &&
        KroneckerHaarFactor(s.channels) > MaxRotationChannels(RotationKind::kHaar)) {
      return bad("kron rotation on " + std::to_string(s.channels) + " channels: Haar factor " +
                 std::to_string(KroneckerHaarFactor(s.channels)) + " (at most " +
                 std::to_string(MaxRotationChannels(RotationKind::kHaar)) + ")");
    }
    if (s.channels > MaxRotationChannels(s.rotation)) {
      return bad(std::string(RotationKindName(s.rotation)) + " rotation on " +
                 std::to_string(s.channels) + " channels (at most " +
                 std::to_string(MaxRotationChannels(s.rotation)) + ")");
    }
    if (s.centroids.size() != (size_t{1} << s.bits)) return bad("centroid count");
    for (size_t i = 0; i < s.centroids.size(); ++i) {
      if (!std::isfinite(s.centroids[i])) return bad("non-finite centroid");
      if (i > 0 && !(s.centroids[i] > s.centroids[i - 1])) return bad("centroids not ascending");
    }
    total += s.channels;
  }
  if (total != p.head_dim) return bad("subsets cover " + std::to_string(total) + " of " +
                                      std::to_string(p.head_dim) + " channels");
  return Status::Ok();
}

double Codec::BitsPerValue(size_t vectors_per_group) const {
  const double d = head_dim();
  double bits = 8.0 * code_bytes() / d;
  if (vectors_per_group > 0) bits += 8.0 * group_meta_bytes() / (d * vectors_per_group);
  return bits;
}

}  // namespace tqkv
