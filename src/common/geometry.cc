#include "tqkv/geometry.h"

#include <string>

namespace tqkv {

Status ValidateGeometry(const ModelGeometry& g) {
  const auto in = [](uint32_t v, uint32_t max) { return v >= 1 && v <= max; };
  if (in(g.layers, kMaxLayers) && in(g.kv_heads, kMaxKvHeads) && in(g.head_dim, kMaxHeadDim)) {
    return Status::Ok();
  }
  return Status::InvalidArgument(
      "geometry " + std::to_string(g.layers) + " layers x " + std::to_string(g.kv_heads) +
      " KV heads x " + std::to_string(g.head_dim) + " dims: each must be at least 1 (at most " +
      std::to_string(kMaxLayers) + " layers, " + std::to_string(kMaxKvHeads) + " KV heads, " +
      std::to_string(kMaxHeadDim) + " dims)");
}

}  // namespace tqkv
