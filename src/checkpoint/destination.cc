#include "checkpoint/destination.h"

namespace tqkv {

Status CheckGeometry(const ContainerHeader& h, const ModelGeometry& want, const std::string& what) {
  if (h.geometry == want) return Status::Ok();
  auto str = [](const ModelGeometry& g) {
    return std::to_string(g.layers) + " layers x " + std::to_string(g.kv_heads) + " KV heads x " +
           std::to_string(g.head_dim) + " dims";
  };
  return Status::InvalidArgument(what + " holds " + str(h.geometry) + " (model '" + h.model +
                                 "'), expected " + str(want));
}

Status RefuseRagged(const ContainerHeader& h, std::string_view what) {
  if (!IsRagged(h)) return Status::Ok();
  return Status::Unsupported(
      std::string(what) + " needs one token count for every layer, and this session's layers " +
      "hold different counts (a llama.cpp sliding-window state, format version 7); such a " +
      "session is restored whole: tqkv llama export, tqkv.llama, tqkv decompress or Restore");
}

Status CheckTokens(const ContainerHeader& h, uint64_t room, std::string_view key) {
  TQKV_RETURN_IF_ERROR(RefuseRagged(h, "restore " + std::string(key) + " into these tensors"));
  if (h.tokens == room) return Status::Ok();
  return Status::InvalidArgument(std::string(key) + " holds " + std::to_string(h.tokens) +
                                 " tokens, the destination has room for " + std::to_string(room));
}

Status CheckCacheTokens(const ContainerHeader& h, const KvCache& dst, std::string_view key) {
  if (!IsRagged(h) && !dst.ragged()) return CheckTokens(h, dst.tokens(), key);
  for (uint32_t l = 0; l < h.geometry.layers && l < dst.geometry().layers; ++l) {
    if (dst.tokens() != h.tokens || dst.layer_tokens(l) != LayerTokens(h, l)) {
      return Status::InvalidArgument(
          std::string(key) + " holds " + std::to_string(LayerTokens(h, l)) + " tokens in layer " +
          std::to_string(l) + " (of " + std::to_string(h.tokens) +
          "), the destination has room for " + std::to_string(dst.layer_tokens(l)) + " (of " +
          std::to_string(dst.tokens()) + ")");
    }
  }
  return Status::Ok();
}

Status CheckDestinationShape(const LayoutTensors& dst, std::string_view key) {
  const ModelGeometry& g = dst.geometry;
  if (dst.k.size() != g.layers || dst.v.size() != g.layers) {
    return Status::InvalidArgument("restore " + std::string(key) + ": " +
                                   std::to_string(g.layers) + " layers but " +
                                   std::to_string(dst.k.size()) + " K and " +
                                   std::to_string(dst.v.size()) + " V tensors");
  }
  for (uint32_t l = 0; l < g.layers; ++l) {
    if ((dst.k[l] == nullptr || dst.v[l] == nullptr) && dst.tokens > 0) {
      return Status::InvalidArgument("restore " + std::string(key) + ": layer " +
                                     std::to_string(l) + " has no tensor");
    }
  }
  TQKV_RETURN_IF_ERROR(ValidateKvLayout(dst.layout, g, dst.tokens, dst.tensor_elems)
                           .WithContext("restore " + std::string(key)));
  if (!dst.v_layout) return Status::Ok();
  return ValidateKvLayout(*dst.v_layout, g, dst.tokens, dst.tensor_elems)
      .WithContext("restore " + std::string(key) + " (V)");
}

Status CheckDestination(const LayoutTensors& dst, const ContainerHeader& h, std::string_view key) {
  TQKV_RETURN_IF_ERROR(CheckDestinationShape(dst, key));
  TQKV_RETURN_IF_ERROR(CheckGeometry(h, dst.geometry, std::string(key)));
  return CheckTokens(h, dst.tokens, key);
}

}  // namespace tqkv
