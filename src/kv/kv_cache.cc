#include "tqkv/kv_cache.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "tqkv/aligned_buffer.h"
#include "tqkv/checked.h"

namespace tqkv {

const std::vector<ModelPreset>& ModelPresets() {
  static const std::vector<ModelPreset> presets = {
      {"qwen2.5-7b", {28, 4, 128}},
      {"llama-3.1-8b", {32, 8, 128}},
      {"qwen2.5-0.5b", {24, 2, 64}},
      {"smollm2-135m", {30, 3, 64}},
  };
  return presets;
}

Result<ModelPreset> FindModelPreset(std::string_view name) {
  std::string known;
  for (const auto& p : ModelPresets()) {
    if (p.name == name) return p;
    known.append(known.empty() ? "" : ", ").append(p.name);
  }
  return Status::InvalidArgument("unknown model preset '" + std::string(name) + "' (known: " +
                                 known + ")");
}

KvCache::KvCache(std::string model, ModelGeometry geometry, DType dtype, uint64_t tokens)
    : model_(std::move(model)),
      geometry_(geometry),
      dtype_(dtype),
      tokens_(tokens),
      k_(geometry.layers, nullptr),
      v_(geometry.layers, nullptr) {}

Status KvCache::SetLayerTokens(std::vector<uint64_t> layer_tokens) {
  if (!layer_tokens.empty()) {
    if (layer_tokens.size() != geometry_.layers) {
      return Status::InvalidArgument("KvCache: " + std::to_string(layer_tokens.size()) +
                                     " layer token counts for " +
                                     std::to_string(geometry_.layers) + " layers");
    }
    bool shorter = false, full = false;
    for (size_t l = 0; l < layer_tokens.size(); ++l) {
      if (layer_tokens[l] == 0 || layer_tokens[l] > tokens_) {
        return Status::InvalidArgument("KvCache: layer " + std::to_string(l) + " holds " +
                                       std::to_string(layer_tokens[l]) + " tokens (1 to " +
                                       std::to_string(tokens_) + ")");
      }
      shorter |= layer_tokens[l] < tokens_;
      full |= layer_tokens[l] == tokens_;
    }
    if (!full) {
      return Status::InvalidArgument("KvCache: no layer holds all " + std::to_string(tokens_) +
                                     " tokens (tokens() is the largest layer's count)");
    }
    if (!shorter) layer_tokens.clear();  // every layer full: rectangular
  }
  layer_tokens_ = std::move(layer_tokens);
  return Status::Ok();
}

size_t KvCache::tensor_bytes() const {
  TQKV_CHECK(layer_tokens_.empty());
  return tokens_ * geometry_.token_elems() * DTypeSize(dtype_);
}

void KvCache::SetLayer(uint32_t layer, void* k, void* v) {
  TQKV_CHECK(layer < geometry_.layers);
  k_[layer] = k;
  v_[layer] = v;
}

Status KvCache::Validate() const {
  if (geometry_.layers == 0 || geometry_.kv_heads == 0 || geometry_.head_dim == 0) {
    return Status::InvalidArgument("KvCache: empty geometry");
  }
  for (uint32_t l = 0; l < geometry_.layers; ++l) {
    if (layer_tokens(l) > 0 && (k_[l] == nullptr || v_[l] == nullptr)) {
      return Status::InvalidArgument("KvCache: layer " + std::to_string(l) + " has no K or V");
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<KvCacheBuffer>> KvCacheBuffer::Allocate(std::string model,
                                                               ModelGeometry geometry, DType dtype,
                                                               uint64_t tokens) {
  return Allocate(std::move(model), geometry, dtype, tokens, {});
}

Result<std::unique_ptr<KvCacheBuffer>> KvCacheBuffer::Allocate(std::string model,
                                                               ModelGeometry geometry, DType dtype,
                                                               uint64_t tokens,
                                                               std::vector<uint64_t> layer_tokens) {
  TQKV_RETURN_IF_ERROR(ValidateGeometry(geometry));
  TQKV_ASSIGN_OR_RETURN(const uint64_t largest,
                        SizeProduct("KV cache tensor (tokens x KV heads x head_dim x dtype)",
                                    {tokens, geometry.kv_heads, geometry.head_dim,
                                     DTypeSize(dtype)}));
  (void)largest;  // every layer's tensor is at most this: the products below cannot overflow
  std::unique_ptr<KvCacheBuffer> buf(new KvCacheBuffer());
  buf->cache_ = KvCache(std::move(model), geometry, dtype, tokens);
  TQKV_RETURN_IF_ERROR(buf->cache_.SetLayerTokens(std::move(layer_tokens)));
  for (uint32_t l = 0; l < geometry.layers; ++l) {
    const uint64_t bytes = buf->cache_.tensor_bytes(l);
    // Big tensors: 2 MiB-aligned and huge-page backed, so first touch runs ~5x faster.
    const size_t align = bytes >= (4u << 20) ? (2u << 20) : 64;
    const size_t alloc = AlignUp(bytes, align);  // bytes <= PTRDIFF_MAX: cannot wrap
    void* p[2];
    for (int kv = 0; kv < 2; ++kv) {
      p[kv] = std::aligned_alloc(align, alloc == 0 ? align : alloc);
      if (p[kv] != nullptr && align > 64) madvise(p[kv], alloc, MADV_HUGEPAGE);
      if (p[kv] == nullptr) {
        return Status::ResourceExhausted("KV cache: out of memory allocating " +
                                         std::to_string(geometry.layers) + " x 2 tensors of " +
                                         std::to_string(alloc) + " bytes");
      }
      buf->blocks_.emplace_back(static_cast<uint8_t*>(p[kv]),
                                [](uint8_t* q) { std::free(q); });
    }
    buf->cache_.SetLayer(l, p[0], p[1]);
  }
  return buf;
}

}  // namespace tqkv
