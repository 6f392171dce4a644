// Codec spec strings: "fp16", "tq3", "tq2.5,norm=f16", "tq:b=3,rot=haar,seed=7".
#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/codec.h"
#include "codec/codec_internal.h"

namespace tqkv {

Status codec::BadSpec(std::string_view spec, const std::string& why) {
  return Status::InvalidArgument("codec spec '" + std::string(spec) + "': " + why);
}

namespace {

using codec::BadSpec;

bool ParseUint(std::string_view s, uint64_t max, uint64_t* out) {
  if (s.empty()) return false;
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s.remove_prefix(2);
    base = 16;
  }
  uint64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || p != s.data() + s.size() || v > max) return false;
  *out = v;
  return true;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos == std::string_view::npos ? pos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return parts;
}

// "K@B" (exact count) or "N/D@B" (fraction of head_dim); "none" or "0" removes the split.
Status ParseSplit(std::string_view spec, std::string_view v, CodecSpec* out) {
  if (v == "none" || v == "0") {
    out->outlier_bits = 0;
    out->outlier_channels = 0;
    out->outlier_num = 1;
    out->outlier_den = 4;
    return Status::Ok();
  }
  const size_t at = v.find('@');
  if (at == std::string_view::npos)
    return BadSpec(spec, "split wants K@B or N/D@B, got '" + std::string(v) + "'");
  uint64_t bits = 0;
  if (!ParseUint(v.substr(at + 1), 8, &bits) || bits < 1) {
    return BadSpec(spec, "split bits must be 1..8 in '" + std::string(v) + "'");
  }
  const std::string_view count = v.substr(0, at);
  const size_t slash = count.find('/');
  if (slash == std::string_view::npos) {
    uint64_t k = 0;
    if (!ParseUint(count, 65535, &k) || k == 0) {
      return BadSpec(spec, "split channel count must be 1..65535 in '" + std::string(v) + "'");
    }
    out->outlier_channels = static_cast<uint16_t>(k);
    out->outlier_num = 1;
    out->outlier_den = 4;
  } else {
    uint64_t num = 0, den = 0;
    if (!ParseUint(count.substr(0, slash), 65535, &num) ||
        !ParseUint(count.substr(slash + 1), 65535, &den) || num == 0 || num >= den) {
      return BadSpec(spec, "split fraction must be N/D with 0 < N < D in '" + std::string(v) + "'");
    }
    out->outlier_channels = 0;
    out->outlier_num = static_cast<uint16_t>(num);
    out->outlier_den = static_cast<uint16_t>(den);
  }
  out->outlier_bits = static_cast<uint8_t>(bits);
  return Status::Ok();
}

Status ApplyModifier(std::string_view spec, std::string_view kv, CodecSpec* out,
                     std::vector<std::string_view>* seen) {
  const size_t eq = kv.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    return BadSpec(spec, "expected key=value, got '" + std::string(kv) + "'");
  }
  const std::string_view key = kv.substr(0, eq);
  const std::string_view v = kv.substr(eq + 1);
  for (auto s : *seen) {
    if (s == key) return BadSpec(spec, "key '" + std::string(key) + "' given twice");
  }
  seen->push_back(key);
  uint64_t n = 0;
  if (key == "b") {
    if (!ParseUint(v, 8, &n) || n < 1)
      return BadSpec(spec, "b must be 1..8, got '" + std::string(v) + "'");
    out->bits = static_cast<uint8_t>(n);
  } else if (key == "split") {
    return ParseSplit(spec, v, out);
  } else if (key == "rot") {
    if (v == "auto") {
      out->rotation = RotationKind::kAuto;
    } else if (v == "hd") {
      out->rotation = RotationKind::kHadamard;
    } else if (v == "hd2") {
      out->rotation = RotationKind::kHadamard2;
    } else if (v == "haar") {
      out->rotation = RotationKind::kHaar;
    } else if (v == "kron") {
      out->rotation = RotationKind::kKronecker;
    } else {
      return BadSpec(spec, "rot must be auto, hd, hd2, haar or kron, got '" + std::string(v) + "'");
    }
  } else if (key == "seed") {
    if (!ParseUint(v, UINT64_MAX, &n)) {
      return BadSpec(spec, "seed must be an unsigned 64-bit number");
    }
    out->seed = n;
  } else if (key == "norm") {
    if (v == "f32" || v == "fp32") {
      out->norm_dtype = DType::kF32;
    } else if (v == "f16" || v == "fp16") {
      out->norm_dtype = DType::kF16;
    } else {
      return BadSpec(spec, "norm must be f32 or f16, got '" + std::string(v) + "'");
    }
  } else if (key == "nc" || key == "qjl") {
    if (v != "0" && v != "1") return BadSpec(spec, std::string(key) + " must be 0 or 1");
    (key == "nc" ? out->norm_correction : out->qjl) = (v == "1");
  } else {
    return BadSpec(spec,
                   "unknown key '" + std::string(key) + "' (b, split, rot, seed, norm, nc, qjl)");
  }
  return Status::Ok();
}

// "kl:B[,norm=f16|f32]": B bits per value, 1 <= B <= 8, at most three decimals.
Result<CodecSpec> ParseTransformSpec(std::string_view spec) {
  CodecSpec out;
  out.kind = CodecKind::kTransform;
  out.norm_dtype = DType::kF16;
  const std::vector<std::string_view> parts = Split(spec.substr(3), ',');
  const std::string_view b = parts[0];
  const size_t dot = b.find('.');
  const std::string_view whole = b.substr(0, dot);
  const std::string_view frac = dot == std::string_view::npos ? std::string_view{} : b.substr(dot + 1);
  uint64_t w = 0, f = 0;
  const bool frac_ok = dot == std::string_view::npos ||
                       (!frac.empty() && frac.size() <= 3 && ParseUint(frac, 999, &f));
  if (whole.size() != 1 || !ParseUint(whole, 8, &w) || !frac_ok || frac.find('x') != frac.npos) {
    return BadSpec(spec,
                   "kl:B wants B bits per value, 1 to 8 with at most 3 decimals (e.g. kl:2.5)");
  }
  for (size_t i = frac.size(); i < 3; ++i) f *= 10;
  const uint64_t milli = w * 1000 + f;
  if (milli < 1000 || milli > 8000) return BadSpec(spec, "kl:B wants 1 <= B <= 8");
  out.kl_milli = static_cast<uint32_t>(milli);
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string_view kv = parts[i];
    if (kv == "norm=f16" || kv == "norm=fp16") {
      out.norm_dtype = DType::kF16;
    } else if (kv == "norm=f32" || kv == "norm=fp32") {
      out.norm_dtype = DType::kF32;
    } else {
      return BadSpec(spec, "kl:B takes only norm=f16|f32, got '" + std::string(kv) + "'");
    }
  }
  return out;
}

struct Preset {
  std::string_view name;
  uint8_t bits, outlier_bits;
};
constexpr Preset kSplitPresets[] = {{"tq2.5", 2, 4}, {"tq3.5", 3, 5}};

}  // namespace

Result<CodecSpec> ParseCodecSpec(std::string_view spec) {
  CodecSpec out;
  if (spec.empty()) return BadSpec(spec, "empty");
  if (spec.substr(0, 3) == "kl:") return ParseTransformSpec(spec);
  std::string_view head = spec;
  std::string_view rest;
  bool general = false;
  const size_t colon = spec.find(':');
  const size_t comma = spec.find(',');
  if (colon != std::string_view::npos && (comma == std::string_view::npos || colon < comma)) {
    head = spec.substr(0, colon);
    rest = spec.substr(colon + 1);
    if (head != "tq") {
      return BadSpec(spec, "only 'tq:' takes the general key=value form (and 'kl:B')");
    }
    general = true;
    if (rest.empty()) return BadSpec(spec, "no keys after 'tq:'");
  } else if (comma != std::string_view::npos) {
    head = spec.substr(0, comma);
    rest = spec.substr(comma + 1);
    if (rest.empty()) return BadSpec(spec, "trailing ','");
  }
  if (head == "fp16" || head == "f16" || head == "bf16" || head == "fp32" || head == "f32") {
    if (!rest.empty()) return BadSpec(spec, "raw codecs take no modifiers");
    out.kind = CodecKind::kRaw;
    out.raw_dtype = *ParseDType(head);
    return out;
  }
  out.kind = CodecKind::kTurboQuant;
  bool matched = general;
  for (const auto& p : kSplitPresets) {
    if (head == p.name) {
      out.bits = p.bits;
      out.outlier_bits = p.outlier_bits;
      matched = true;
    }
  }
  if (!matched && head.size() == 3 && head.substr(0, 2) == "tq" && head[2] >= '1' &&
      head[2] <= '8') {
    out.bits = static_cast<uint8_t>(head[2] - '0');
    matched = true;
  }
  if (!matched) {
    return BadSpec(spec, "unknown codec '" + std::string(head) +
                             "' (fp16, bf16, fp32, tq1..tq8, tq2.5, tq3.5, tq:key=value,..., "
                             "kl:B)");
  }
  std::vector<std::string_view> seen;
  if (!rest.empty()) {
    for (std::string_view kv : Split(rest, ',')) {
      TQKV_RETURN_IF_ERROR(ApplyModifier(spec, kv, &out, &seen));
    }
  }
  if (out.qjl && out.outlier_bits != 0) return BadSpec(spec, "qjl=1 needs an unsplit codec");
  if (out.qjl && out.bits < 2) {
    return BadSpec(spec, "qjl=1 needs b >= 2 (b-1 mse bits + 1 QJL bit)");
  }
  return out;
}

std::string FormatCodecSpec(const CodecSpec& spec) {
  if (spec.kind == CodecKind::kRaw) {
    switch (spec.raw_dtype) {
      case DType::kF16:
        return "fp16";
      case DType::kBF16:
        return "bf16";
      case DType::kF32:
        return "fp32";
    }
    return "fp16";
  }
  if (spec.kind == CodecKind::kTransform) {
    char b[16];
    std::snprintf(b, sizeof b, "%u.%03u", spec.kl_milli / 1000, spec.kl_milli % 1000);
    std::string s = b;
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
    s = "kl:" + s;
    if (spec.norm_dtype == DType::kF32) s += ",norm=f32";
    return s;
  }
  const CodecSpec defaults;
  std::string s;
  bool preset_split = false;
  if (spec.outlier_bits != 0 && spec.outlier_channels == 0 && spec.outlier_num == 1 &&
      spec.outlier_den == 4) {
    for (const auto& p : kSplitPresets) {
      if (spec.bits == p.bits && spec.outlier_bits == p.outlier_bits) {
        s = p.name;
        preset_split = true;
      }
    }
  }
  if (!preset_split) s = "tq" + std::to_string(spec.bits);
  if (spec.outlier_bits != 0 && !preset_split) {
    s += ",split=";
    if (spec.outlier_channels > 0) {
      s += std::to_string(spec.outlier_channels);
    } else {
      s += std::to_string(spec.outlier_num) + "/" + std::to_string(spec.outlier_den);
    }
    s += "@" + std::to_string(spec.outlier_bits);
  }
  if (spec.rotation != defaults.rotation)
    s += ",rot=" + std::string(RotationKindName(spec.rotation));
  if (spec.seed != defaults.seed) {
    const std::string dec = std::to_string(spec.seed);
    char hex[32];
    std::snprintf(hex, sizeof(hex), "0x%llx", static_cast<unsigned long long>(spec.seed));
    s += ",seed=" + (std::string(hex).size() < dec.size() ? std::string(hex) : dec);
  }
  if (spec.norm_dtype != defaults.norm_dtype) s += ",norm=f16";
  if (spec.norm_correction) s += ",nc=1";
  if (spec.qjl) s += ",qjl=1";
  return s;
}

}  // namespace tqkv
