// DescribeContainer: the figures `tqkv inspect` shows, derived from a parsed header and index.
#include "tqkv/describe.h"

#include "tqkv/container.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace tqkv {

ContainerDescription DescribeContainer(const ContainerReader& reader) {
  ContainerDescription d;
  d.header = reader.header();
  d.chunks = reader.chunks();
  d.file_bytes = reader.file_bytes();
  const ContainerHeader& h = d.header;
  d.fp16_bytes = SessionTensorBytes(h, DType::kF16);
  d.ratio = d.file_bytes ? static_cast<double>(d.fp16_bytes) / d.file_bytes : 0.0;
  const double values = 2.0 * static_cast<double>(HeldTokens(h)) * h.geometry.token_elems();
  d.bits_per_value = h.tokens ? 8.0 * d.file_bytes / values : 0.0;
  for (const auto& c : h.codecs) d.codecs.push_back(CodecLabel(c));
  for (uint32_t l = 0; l < h.layer_codec.size(); ++l) {
    d.layer_codecs.push_back(
        JoinKvLabels(d.codecs[LayerCodecIndex(h, l, 0)], d.codecs[LayerCodecIndex(h, l, 1)]));
  }
  d.codec = d.layer_codecs.empty() ? CodecLabel(h.codecs[0]) : d.layer_codecs[0];
  return d;
}

std::string_view ChunkTypeLabel(const ChunkEntry& e) {
  return e.type == ChunkType::kGroupMeta   ? "meta"
         : e.type == ChunkType::kExactRows ? "exact"
         : e.type == ChunkType::kKeyMeans  ? "means"
         : e.kv                            ? "V"
                                           : "K";
}

namespace {

nlohmann::json TensorErrorJson(const TensorCodecError& e) {
  return {{"rel_err", RelativeError(e)}, {"shared", SharedFraction(e)},
          {"err", e.err},   {"var", e.var},  {"energy", e.energy}};
}

// The guard's figures (format version 6); {"recorded": false} for older files.
nlohmann::json GuardJson(const ContainerHeader& h) {
  using json = nlohmann::json;
  if (h.guard_stride == 0) return {{"recorded", false}};
  json layers = json::array();
  double max_rel = 0;
  for (size_t l = 0; l < h.codec_error.size() / 2; ++l) {
    layers.push_back({{"layer", l},
                      {"k", TensorErrorJson(h.codec_error[2 * l])},
                      {"v", TensorErrorJson(h.codec_error[2 * l + 1])}});
    for (int kv = 0; kv < 2; ++kv) max_rel = std::max(max_rel, RelativeError(h.codec_error[2 * l + kv]));
  }
  json exceeded = json::array();
  for (uint32_t i : GuardExceeded(h.codec_error, kGuardThreshold)) {
    exceeded.push_back("layer " + std::to_string(i / 2) + (i % 2 ? " V" : " K"));
  }
  return {{"recorded", true}, {"sample_stride", h.guard_stride}, {"max_rel_err", max_rel},
          {"threshold", kGuardThreshold}, {"exceeded", exceeded}, {"layers", layers}};
}

}  // namespace

std::string ContainerDescriptionJson(const ContainerDescription& d, bool with_chunks) {
  using json = nlohmann::json;
  const ContainerHeader& h = d.header;
  json j;
  j["model"] = h.model;
  j["tokens"] = h.tokens;
  j["layers"] = h.geometry.layers;
  j["kv_heads"] = h.geometry.kv_heads;
  j["head_dim"] = h.geometry.head_dim;
  j["source_dtype"] = std::string(DTypeName(h.source_dtype));
  j["token_block"] = h.token_block;
  j["exact_tokens"] = {{"first", h.exact_head}, {"last", h.exact_tail}};
  j["engine_state_bytes"] = h.engine_state.size();
  j["key_means"] = {{"block", h.key_mean_block},
                    {"dtype", h.key_mean_block ? std::string(DTypeName(h.key_mean_dtype)) : "none"}};
  // Version 7: the tokens each layer holds (every layer holds `tokens` when absent).
  if (IsRagged(h)) j["layer_tokens"] = h.layer_tokens;
  j["format_version"] = ContainerVersionFor(h);
  j["payload_alignment"] = h.payload_alignment;  // version 9 when not 4096
  j["file_bytes"] = d.file_bytes;
  j["fp16_bytes"] = d.fp16_bytes;
  j["ratio"] = d.ratio;
  j["bits_per_value"] = d.bits_per_value;
  j["codec"] = d.codec;
  j["codecs"] = d.codecs;
  j["layer_codec"] = h.layer_codec;
  j["layer_codec_v"] = h.layer_codec_v.empty() ? h.layer_codec : h.layer_codec_v;
  j["layer_codecs"] = d.layer_codecs;
  j["guard"] = GuardJson(h);
  j["allocated_bits"] = h.allocated_bits;
  if (with_chunks) {
    json chunks = json::array();
    for (const auto& e : d.chunks) {
      chunks.push_back({{"type", std::string(ChunkTypeLabel(e))},
                        {"layer", e.layer},
                        {"token_begin", e.token_begin},
                        {"token_count", e.token_count},
                        {"offset", e.offset},
                        {"size", e.size},
                        {"checksum", e.checksum}});
    }
    j["chunks"] = chunks;
  }
  // The model name is bytes from the file; JSON must be UTF-8 (invalid bytes become U+FFFD).
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace tqkv
