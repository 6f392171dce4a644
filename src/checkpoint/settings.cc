// The checkpoint settings resolver and the parsers of its text forms (include/tqkv/settings.h).
#include "tqkv/settings.h"

#include <charconv>
#include <string>

namespace tqkv {

Result<CheckpointOptions> ResolveCheckpointOptions(const CheckpointSettings& s) {
  CheckpointOptions opts;
  const std::string codec = s.codec.value_or(std::string(kDefaultCodec));
  TQKV_ASSIGN_OR_RETURN(const KvCodecSpec spec, ParseKvCodecSpec(codec));
  SetCodec(opts, spec);
  for (const std::string& lc : s.layer_codecs) {
    TQKV_ASSIGN_OR_RETURN(LayerCodec l, ParseLayerCodec(lc));
    opts.layer_overrides.push_back(std::move(l));
  }
  ExactTokens et = DefaultExactTokens(opts);  // depends on every codec above
  if (s.exact_tokens) {
    TQKV_ASSIGN_OR_RETURN(et, ParseExactTokens(*s.exact_tokens));
  }
  opts.exact_head = et.head;
  opts.exact_tail = et.tail;
  if (s.key_means) {
    TQKV_ASSIGN_OR_RETURN(const KeyMeanSetting km, ParseKeyMeans(*s.key_means));
    opts.key_mean_block = km.block;
    opts.key_mean_dtype = km.dtype;
  }
  opts.strict = s.strict.value_or(false);
  opts.guard = s.guard.value_or(true);
  if (s.alignment) {
    if (!ValidPayloadAlignment(*s.alignment)) {
      return Status::InvalidArgument("alignment " + std::to_string(*s.alignment) +
                                     ": expected a power of two from 64 to 4096 bytes");
    }
    opts.alignment = static_cast<uint32_t>(*s.alignment);
  }
  return opts;
}

ResolvedSettings DescribeSettings(const CheckpointSettings& s, const CheckpointOptions& o) {
  ResolvedSettings r;
  r.codec = s.codec.value_or(std::string(kDefaultCodec));
  r.layer_codecs = s.layer_codecs;
  r.exact_tokens = std::to_string(o.exact_head) + "," + std::to_string(o.exact_tail);
  r.key_means = FormatKeyMeans({o.key_mean_block, o.key_mean_dtype});
  r.strict = o.strict;
  r.guard = o.guard;
  r.alignment = o.alignment;
  return r;
}

Result<LayerCodec> ParseLayerCodec(std::string_view text) {
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos || colon == 0) {
    return Status::InvalidArgument("layer codec '" + std::string(text) + "': expected L:SPEC");
  }
  uint32_t layer = 0;
  for (char c : text.substr(0, colon)) {
    if (c < '0' || c > '9' || layer > 100000) {
      return Status::InvalidArgument("layer codec '" + std::string(text) + "': bad layer number");
    }
    layer = layer * 10 + static_cast<uint32_t>(c - '0');
  }
  TQKV_ASSIGN_OR_RETURN(KvCodecSpec spec, ParseKvCodecSpec(text.substr(colon + 1)));
  if (spec.auto_bits > 0) {
    return Status::InvalidArgument("layer codec '" + std::string(text) +
                                   "': auto:B is a session's codec, not a layer's");
  }
  LayerCodec out{layer, spec.k, std::nullopt};
  if (!spec.same()) out.v_spec = spec.v;
  return out;
}

void SetCodec(CheckpointOptions& options, const KvCodecSpec& spec) {
  options.codec = spec.k;
  options.v_codec.reset();
  if (!spec.same()) options.v_codec = spec.v;
  options.allocate_bits = spec.auto_bits;
  options.allocate_from = spec.auto_from;
}

namespace {
bool Lossy(const CodecSpec& spec) { return spec.kind != CodecKind::kRaw; }
}  // namespace

bool AnyLossyCodec(const CheckpointOptions& options) {
  if (options.allocate_bits > 0 || Lossy(options.codec) ||
      (options.v_codec && Lossy(*options.v_codec))) {
    return true;
  }
  for (const LayerCodec& l : options.layer_overrides) {
    if (Lossy(l.spec) || (l.v_spec && Lossy(*l.v_spec))) return true;
  }
  return false;
}

ExactTokens DefaultExactTokens(const CheckpointOptions& options) {
  return AnyLossyCodec(options) ? kDefaultExactTokens : ExactTokens{};
}

Result<ExactTokens> ParseExactTokens(std::string_view text) {
  const auto bad = [&] {
    return Status::InvalidArgument("exact tokens '" + std::string(text) +
                                   "': expected FIRST,LAST (e.g. 4,128)");
  };
  const size_t comma = text.find(',');
  if (comma == std::string_view::npos) return bad();
  ExactTokens out;
  uint32_t* fields[2] = {&out.head, &out.tail};
  const std::string_view parts[2] = {text.substr(0, comma), text.substr(comma + 1)};
  for (int i = 0; i < 2; ++i) {
    const char* end = parts[i].data() + parts[i].size();
    auto [ptr, ec] = std::from_chars(parts[i].data(), end, *fields[i]);
    if (parts[i].empty() || ec != std::errc() || ptr != end) return bad();
  }
  return out;
}

Result<KeyMeanSetting> ParseKeyMeans(std::string_view text) {
  const auto bad = [&] {
    return Status::InvalidArgument("key means '" + std::string(text) +
                                   "': expected off, session or a block of tokens (e.g. 128), "
                                   "optionally followed by ,f16 or ,f32");
  };
  KeyMeanSetting out;
  std::string_view block = text;
  const size_t comma = text.find(',');
  if (comma != std::string_view::npos) {
    block = text.substr(0, comma);
    const std::string_view dtype = text.substr(comma + 1);
    if (dtype == "f16") {
      out.dtype = DType::kF16;
    } else if (dtype == "f32") {
      out.dtype = DType::kF32;
    } else {
      return bad();
    }
  }
  if (block == "off") {
    out.block = 0;
  } else if (block == "session") {
    out.block = kKeyMeanPerSession;
  } else {
    const char* end = block.data() + block.size();
    auto [ptr, ec] = std::from_chars(block.data(), end, out.block);
    if (block.empty() || ec != std::errc() || ptr != end) return bad();
  }
  return out;
}

std::string FormatKeyMeans(const KeyMeanSetting& s) {
  const std::string block = s.block == 0                    ? "off"
                            : s.block == kKeyMeanPerSession ? "session"
                                                            : std::to_string(s.block);
  return s.block != 0 && s.dtype == DType::kF32 ? block + ",f32" : block;
}


}  // namespace tqkv
