// The shape of a session's KV cache: layers, KV heads, head dimension. The container, the codec
// pipeline and the KV views all speak it, so it lives at the ground.
#ifndef TQKV_INCLUDE_TQKV_GEOMETRY_H_
#define TQKV_INCLUDE_TQKV_GEOMETRY_H_

#include <cstddef>
#include <cstdint>

#include "tqkv/status.h"
#include "tqkv/types.h"

namespace tqkv {

struct ModelGeometry {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;

  // Elements of one token's K (or V) in one layer.
  size_t token_elems() const { return static_cast<size_t>(kv_heads) * head_dim; }
  // Bytes of the whole session at `dtype` (K and V, every layer).
  uint64_t SessionBytes(uint64_t tokens, DType dtype) const {
    return 2ull * layers * tokens * token_elems() * DTypeSize(dtype);
  }
  bool operator==(const ModelGeometry&) const = default;
};

// Largest geometry tqkv accepts from a user or a container header (docs/format.md "Limits"):
// far above any model, small enough that per-layer and per-head tables stay small.
inline constexpr uint32_t kMaxLayers = 65536;
inline constexpr uint32_t kMaxKvHeads = 65536;
inline constexpr uint32_t kMaxHeadDim = 65535;
// InvalidArgument unless every dimension is in [1, its kMax*].
Status ValidateGeometry(const ModelGeometry& g);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_GEOMETRY_H_
