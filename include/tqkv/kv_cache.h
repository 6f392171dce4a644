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
  // The one rule for how many tokens layer `layer` holds: tokens() unless the session is ragged
  // (SetLayerTokens), then its own count; its tensors are [layer_tokens][kv_heads][head_dim].
  uint64_t layer_tokens(uint32_t layer) const {
    return layer_tokens_.empty() ? tokens_ : layer_tokens_[layer];
  }
  // Whether some layer holds fewer than tokens() tokens (a llama.cpp sliding-window layer).
  bool ragged() const { return !layer_tokens_.empty(); }
  // Per layer, the tokens it holds (each in [1, tokens()], the largest equal to tokens()); empty,
  // or every layer full, makes the cache rectangular. InvalidArgument for another count or a
  // value out of range.
  Status SetLayerTokens(std::vector<uint64_t> layer_tokens);
  const std::vector<uint64_t>& layer_token_counts() const { return layer_tokens_; }
  // Bytes of layer `layer`'s K (or V) tensor.
  size_t tensor_bytes(uint32_t layer) const {
    return layer_tokens(layer) * geometry_.token_elems() * DTypeSize(dtype_);
  }
  // Bytes of every layer's K (or V) tensor of a rectangular cache; aborts on a ragged one, whose
  // layers differ (tensor_bytes(layer)).
  size_t tensor_bytes() const;

  // Points layer `layer`'s K and V at caller memory of tensor_bytes(layer) each.
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
  std::vector<uint64_t> layer_tokens_;  // empty: every layer holds tokens_
  std::vector<void*> k_, v_;
};

// A KvCache that owns its memory (64-byte aligned, one allocation per tensor).
class KvCacheBuffer {
 public:
  static Result<std::unique_ptr<KvCacheBuffer>> Allocate(std::string model, ModelGeometry geometry,
                                                        DType dtype, uint64_t tokens);
  // A ragged cache: layer l holds layer_tokens[l] tokens (KvCache::SetLayerTokens's rules; empty:
  // rectangular), and only those are allocated.
  static Result<std::unique_ptr<KvCacheBuffer>> Allocate(std::string model, ModelGeometry geometry,
                                                        DType dtype, uint64_t tokens,
                                                        std::vector<uint64_t> layer_tokens);
  const KvCache& cache() const { return cache_; }
  KvCache& cache() { return cache_; }

 private:
  KvCacheBuffer() = default;
  KvCache cache_;
  std::vector<std::unique_ptr<uint8_t[], void (*)(uint8_t*)>> blocks_;
};

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_KV_CACHE_H_
