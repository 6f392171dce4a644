// K/V codec specs: "k4v2", "k3.5v2.5", "k:tq4,norm=f16/v:tq2", or a plain spec for both.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <string>
#include <string_view>

#include "tqkv/codec.h"
#include "codec/codec_internal.h"

namespace tqkv {
namespace {

using codec::BadSpec;

// A preset's bits as written after "tq" ("4", "2.5"), or empty when `label` is no bare preset.
std::string_view PresetBits(std::string_view label) {
  if (label.size() < 3 || label.substr(0, 2) != "tq") return {};
  const std::string_view bits = label.substr(2);
  for (char c : bits) {
    if ((c < '0' || c > '9') && c != '.') return {};
  }
  return bits;
}

// "kAvB": A and B as in "tqA" / "tqB", plain presets only.
Result<KvCodecSpec> ParsePresetFamily(std::string_view spec) {
  const size_t v = spec.find('v');
  const std::string_view a = spec.substr(1, v == std::string_view::npos ? v : v - 1);
  const std::string_view b = v == std::string_view::npos ? std::string_view{} : spec.substr(v + 1);
  const auto preset = [&](std::string_view bits, const char* which) -> Result<CodecSpec> {
    if (bits.empty() || PresetBits("tq" + std::string(bits)) != bits) {
      return BadSpec(spec, std::string(which) + " bits must be 1..8, 2.5 or 3.5 (kAvB, e.g. k4v2; "
                                                "k:SPEC/v:SPEC for anything else)");
    }
    auto parsed = ParseCodecSpec("tq" + std::string(bits));
    if (!parsed.ok()) return BadSpec(spec, std::string(which) + ": " + parsed.status().message());
    return parsed;
  };
  if (v == std::string_view::npos) {
    return BadSpec(spec, "expected kAvB (e.g. k4v2) or k:SPEC/v:SPEC");
  }
  TQKV_ASSIGN_OR_RETURN(CodecSpec k, preset(a, "K"));
  TQKV_ASSIGN_OR_RETURN(CodecSpec vs, preset(b, "V"));
  return KvCodecSpec{k, vs};
}

// "k:SPEC/v:SPEC", each part a plain spec.
Result<KvCodecSpec> ParseGeneral(std::string_view spec) {
  const size_t sep = spec.find("/v:");
  if (sep == std::string_view::npos) return BadSpec(spec, "k:SPEC wants /v:SPEC after it");
  const std::string_view k = spec.substr(2, sep - 2), v = spec.substr(sep + 3);
  const auto part = [&](std::string_view text, const char* which) -> Result<CodecSpec> {
    if (text.empty()) return BadSpec(spec, std::string("empty ") + which + " spec");
    if (text.find("/v:") != std::string_view::npos || text.substr(0, 2) == "k:" ||
        text.substr(0, 2) == "v:") {
      return BadSpec(spec, std::string(which) + " spec holds another K/V spec");
    }
    auto parsed = ParseCodecSpec(text);
    if (!parsed.ok()) return BadSpec(spec, std::string(which) + ": " + parsed.status().message());
    return parsed;
  };
  TQKV_ASSIGN_OR_RETURN(CodecSpec ks, part(k, "K"));
  TQKV_ASSIGN_OR_RETURN(CodecSpec vs, part(v, "V"));
  return KvCodecSpec{ks, vs};
}

constexpr std::string_view kFamilyNames[] = {"tq", "kl", "all"};

// "auto:B[,from=tq|kl|all]": the bit allocator's budget and candidates; the codecs are
// placeholders until the checkpoint picks.
Result<KvCodecSpec> ParseAuto(std::string_view spec) {
  std::string_view b = spec.substr(5), from = "tq";
  if (const size_t comma = b.find(','); comma != std::string_view::npos) {
    from = b.substr(comma + 1);
    b = b.substr(0, comma);
    if (from.substr(0, 5) != "from=") {
      return BadSpec(spec, "auto:B takes one modifier, from=tq|kl|all (the candidate codecs)");
    }
    from = from.substr(5);
  }
  double bits = 0;
  const auto [ptr, ec] = std::from_chars(b.data(), b.data() + b.size(), bits);
  if (b.empty() || ec != std::errc() || ptr != b.data() + b.size() || !std::isfinite(bits) ||
      bits <= 0 || bits > 64) {
    return BadSpec(spec, "auto:B wants a budget of bits per value in (0, 64] (e.g. auto:3.4)");
  }
  TQKV_ASSIGN_OR_RETURN(CodecSpec placeholder, ParseCodecSpec(kAllocatorPlanCodec));
  KvCodecSpec out{placeholder, placeholder, bits};
  for (size_t i = 0; i < std::size(kFamilyNames); ++i) {
    if (from == kFamilyNames[i]) {
      out.auto_from = static_cast<AllocatorFamily>(i);
      return out;
    }
  }
  return BadSpec(spec, "from= must be tq (TurboQuant's presets), kl (the transform codec) or all");
}

}  // namespace

Result<KvCodecSpec> ParseKvCodecSpec(std::string_view spec) {
  if (spec.substr(0, 5) == "auto:") return ParseAuto(spec);
  if (spec.substr(0, 2) == "k:") return ParseGeneral(spec);
  if (!spec.empty() && spec[0] == 'k' && spec.substr(0, 3) != "kl:") return ParsePresetFamily(spec);
  if (spec.substr(0, 2) == "v:") return BadSpec(spec, "the K part comes first: k:SPEC/v:SPEC");
  TQKV_ASSIGN_OR_RETURN(CodecSpec both, ParseCodecSpec(spec));
  return KvCodecSpec{both, both};
}

std::string JoinKvLabels(const std::string& k, const std::string& v) {
  if (k == v) return k;
  const std::string_view a = PresetBits(k), b = PresetBits(v);
  if (!a.empty() && !b.empty()) return "k" + std::string(a) + "v" + std::string(b);
  return "k:" + k + "/v:" + v;
}

std::string FormatKvCodecSpec(const KvCodecSpec& spec) {
  if (spec.auto_bits > 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "auto:%g", spec.auto_bits);
    if (spec.auto_from == AllocatorFamily::kTurboQuant) return buf;
    return std::string(buf) + ",from=" +
           std::string(kFamilyNames[static_cast<size_t>(spec.auto_from)]);
  }
  return JoinKvLabels(FormatCodecSpec(spec.k), FormatCodecSpec(spec.v));
}

}  // namespace tqkv
