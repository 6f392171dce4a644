// KvCache: one session's KV cache as views over caller memory, in the canonical layout.
//
// Canonical layout: per layer, one K and one V tensor, token-major [tokens][kv_heads][head_dim],
// contiguous, of one element type. A "group" is (layer, K or V, KV head): the vectors of one head
// across the session's tokens, head_dim elements each, kv_heads * head_dim elements apart.
#ifndef TQKV_INCLUDE_TQKV_KV_CACHE_H_
#define TQKV_INCLUDE_TQKV_KV_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/geometry.h"
#include "tqkv/status.h"
#include "tqkv/types.h"

namespace tqkv {

struct ModelPreset {
  std::string_view name;
  ModelGeometry geometry;
};
// qwen2.5-7b (28, 4, 128), llama-3.1-8b (32, 8, 128), qwen2.5-0.5b (24, 2, 64), smollm2-135m (30, 3, 64).
const std::vector<ModelPreset>& ModelPresets();
Result<ModelPreset> FindModelPreset(std::string_view name);

// Non-owning view of a session. Pointers stay owned by the caller.
class KvCache {
 public:
  KvCache() = default;
  KvCache(std::string model, ModelGeometry geometry, DType dtype, uint64_t tokens);

  const std::string& model() const { return model_; }
  const ModelGeometry& geometry() const { return geometry_; }
  DType dtype() const { return dtype_; }
  uint64_t tokens() const { return tokens_; }
  // Bytes of one layer's K (or V) tensor.
  size_t tensor_bytes() const { return tokens_ * geometry_.token_elems() * DTypeSize(dtype_); }

  // Points layer `layer`'s K and V at caller memory of tensor_bytes() each.
  void SetLayer(uint32_t layer, void* k, void* v);
  void* k(uint32_t layer) const { return k_[layer]; }
  void* v(uint32_t layer) const { return v_[layer]; }
  // kv = 0 for K, 1 for V.
  void* tensor(uint32_t layer, int kv) const { return kv == 0 ? k_[layer] : v_[layer]; }
  // OK when every layer has both tensors set.
  Status Validate() const;

 private:
  std::string model_;
  ModelGeometry geometry_;
  DType dtype_ = DType::kF16;
  uint64_t tokens_ = 0;
  std::vector<void*> k_, v_;
};

// A KvCache that owns its memory (64-byte aligned, one allocation per tensor).
class KvCacheBuffer {
 public:
  static Result<std::unique_ptr<KvCacheBuffer>> Allocate(std::string model, ModelGeometry geometry,
                                                        DType dtype, uint64_t tokens);
  const KvCache& cache() const { return cache_; }
  KvCache& cache() { return cache_; }

 private:
  KvCacheBuffer() = default;
  KvCache cache_;
  std::vector<std::unique_ptr<uint8_t[], void (*)(uint8_t*)>> blocks_;
};

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_KV_CACHE_H_
