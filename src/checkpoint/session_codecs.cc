#include "checkpoint/session_codecs.h"

#include <algorithm>
#include <string>

namespace tqkv {

Result<SessionCodecs> ResolveSessionCodecs(const CheckpointOptions& options,
                                           const ModelGeometry& geometry) {
  SessionCodecs out;
  std::vector<CodecSpec> specs;
  const auto index_of = [&](const CodecSpec& s) {
    auto it = std::find(specs.begin(), specs.end(), s);
    if (it == specs.end()) it = specs.insert(specs.end(), s);
    return static_cast<uint16_t>(it - specs.begin());
  };
  out.layer_codec.assign(geometry.layers, index_of(options.codec));
  out.layer_codec_v.assign(geometry.layers, index_of(options.v_codec.value_or(options.codec)));
  for (const auto& o : options.layer_overrides) {
    if (o.layer >= geometry.layers) {
      return Status::InvalidArgument("layer override for layer " + std::to_string(o.layer) +
                                     ", but the model has " + std::to_string(geometry.layers));
    }
    out.layer_codec[o.layer] = index_of(o.spec);
    out.layer_codec_v[o.layer] = index_of(o.v_spec.value_or(o.spec));
  }
  for (const auto& s : specs) {
    auto codec = Codec::Create(s, geometry.head_dim);
    if (!codec.ok()) return codec.status().WithContext("codec " + FormatCodecSpec(s));
    out.codecs.push_back(std::move(codec).value());
  }
  return out;
}

Result<SessionCodecs> SessionCodecsFromHeader(const ContainerHeader& header) {
  SessionCodecs out;
  for (const auto& p : header.codecs) {
    TQKV_ASSIGN_OR_RETURN(auto codec, Codec::FromParams(p));
    out.codecs.push_back(std::move(codec));
  }
  out.layer_codec = header.layer_codec;
  out.layer_codec_v = header.layer_codec_v.empty() ? header.layer_codec : header.layer_codec_v;
  return out;
}

Status CheckGroupMetaChunk(const SessionCodecs& codecs, const ContainerHeader& h,
                           const ChunkEntry& e, std::span<const uint8_t> payload,
                           const std::string& name) {
  const size_t heads = h.geometry.kv_heads;
  size_t at = 0;
  for (int kv = 0; kv < 2; ++kv) {
    const Codec& codec = codecs.of(e.layer, kv);
    const size_t bytes = codec.group_meta_bytes();
    const char* what = codec.params().kind == CodecKind::kTransform ? " kl metadata" : " outlier mask";
    for (size_t head = 0; head < heads; ++head, at += bytes) {
      const std::string where = name + ": layer " + std::to_string(e.layer) + " " +
                                (kv ? "V" : "K") + " head " + std::to_string(head) + what +
                                " at offset " + std::to_string(e.offset);
      if (at + bytes > payload.size()) return Status::Corruption(where + ": the chunk is short");
      Status s = codec.CheckGroupMeta(payload.subspan(at, bytes));
      if (!s.ok()) return Status::Corruption(where + ": " + s.message());
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<Codec>> ExactRowsCodec(const ContainerHeader& header) {
  CodecSpec spec;
  spec.raw_dtype = header.source_dtype;
  return Codec::Create(spec, header.geometry.head_dim);
}

uint32_t DefaultTokenBlock(const SessionCodecs& codecs, const ModelGeometry& geometry) {
  size_t max_code = 1;
  for (const auto& c : codecs.codecs) max_code = std::max(max_code, c->code_bytes());
  const size_t per_token = std::max<size_t>(1, max_code * geometry.kv_heads);
  const size_t target = 2u << 20;
  size_t block = target / per_token / 16 * 16;
  return static_cast<uint32_t>(std::clamp<size_t>(block, 16, 1u << 20));
}

}  // namespace tqkv
