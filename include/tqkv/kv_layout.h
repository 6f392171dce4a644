// KV tensors in the layouts engines keep them in, read into and written from the canonical layout
// of kv_cache.h one layer at a time: token-major [tokens][kv_heads][head_dim] views with other
// strides ([kv_heads][tokens][head_dim] as in transformers) and paged blocks (vLLM style:
// [blocks][block_tokens][kv_heads][head_dim] plus a block table saying which block holds which
// tokens). The canonical contiguous layout needs none of this: KvCache views it without a copy.
#ifndef TQKV_INCLUDE_TQKV_KV_LAYOUT_H_
#define TQKV_INCLUDE_TQKV_KV_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tqkv/kv_cache.h"
#include "tqkv/kv_source.h"
#include "tqkv/status.h"
#include "tqkv/types.h"

namespace tqkv {

// Where element (token t, head h, channel c) of one layer's K or V tensor lives, in elements from
// the tensor's base pointer:
//   unpaged (block_tokens == 0): t * token_stride + h * head_stride + c * dim_stride
//   paged:   block_ids[t / block_tokens] * block_stride + (t % block_tokens) * token_stride + ...
// Strides may be any non-negative values (they come from an array's strides); every layer's K and
// V tensors share the layout.
struct KvLayout {
  int64_t token_stride = 0, head_stride = 0, dim_stride = 1;
  uint64_t block_tokens = 0;       // 0: not paged
  int64_t block_stride = 0;
  std::vector<int64_t> block_ids;  // paged: one per block_tokens tokens (the last may be partial)

  // The canonical layout for `geometry`: token_stride kv_heads * head_dim, head_stride head_dim.
  static KvLayout Canonical(const ModelGeometry& geometry);
  bool IsCanonical(const ModelGeometry& geometry) const;

  // Element offset of (token, head, channel 0); the layout must be valid for the token.
  int64_t Offset(uint64_t token, size_t head) const {
    const int64_t row = block_tokens == 0
                            ? static_cast<int64_t>(token) * token_stride
                            : block_ids[token / block_tokens] * block_stride +
                                  static_cast<int64_t>(token % block_tokens) * token_stride;
    return row + static_cast<int64_t>(head) * head_stride;
  }
  // How many of the `count` tokens from `token` on lie in token's block (all when not paged):
  // a run whose vectors are token_stride elements apart.
  uint64_t RunTokens(uint64_t token, uint64_t count) const {
    if (block_tokens == 0) return count;
    const uint64_t left = block_tokens - token % block_tokens;
    return left < count ? left : count;
  }
};

// InvalidArgument unless every element of `tokens` tokens lies inside a tensor of
// `tensor_elems` elements (negative strides and block ids refused; a paged layout needs
// ceil(tokens / block_tokens) block ids), so a wrong stride or block id can't read or write
// outside the caller's array.
Status ValidateKvLayout(const KvLayout& layout, const ModelGeometry& geometry, uint64_t tokens,
                        uint64_t tensor_elems);

// Copies one layer's tensor between `layout` at `src`/`dst` and the canonical layout
// (tokens * kv_heads * head_dim contiguous elements of `dtype`). The layout must have been
// validated; rows with dim_stride 1 are copied whole.
void GatherLayer(const void* src, const KvLayout& layout, const ModelGeometry& geometry,
                 uint64_t tokens, DType dtype, void* canonical);
void ScatterLayer(const void* canonical, const KvLayout& layout, const ModelGeometry& geometry,
                  uint64_t tokens, DType dtype, void* dst);

// Per-layer K and V tensors in caller memory, all in one layout: layer l's are k[l] and v[l], each
// `tensor_elems` elements of `dtype` (ValidateKvLayout bounds every element by it).
struct LayoutTensors {
  ModelGeometry geometry;
  DType dtype = DType::kF16;
  uint64_t tokens = 0;
  KvLayout layout;
  uint64_t tensor_elems = 0;
  std::vector<void*> k, v;
};

// Whether RestoreInto (checkpoint.h) decodes straight into tensors of `layout`: each head's
// channels contiguous (dim_stride 1) and, within a run of tokens, vectors at least head_dim
// elements apart. Otherwise it decodes a layer into a staging buffer and scatters it.
bool DecodesInPlace(const KvLayout& layout, const ModelGeometry& geometry, uint64_t tokens);

// A session held in caller memory in `layout`, as a KvSource for Checkpoint(): each ReadLayer
// gathers one layer into the canonical layout (memory: one layer, not the session).
class LayoutKvSource final : public KvSource {
 public:
  // k[l] and v[l]: layer l's tensors, each valid for the layout (ValidateKvLayout).
  LayoutKvSource(std::string model, ModelGeometry geometry, DType dtype, uint64_t tokens,
                 KvLayout layout, std::vector<const void*> k, std::vector<const void*> v);
  const std::string& model() const override { return model_; }
  const ModelGeometry& geometry() const override { return geometry_; }
  DType dtype() const override { return dtype_; }
  uint64_t tokens() const override { return tokens_; }
  Status ReadLayer(uint32_t layer, void* k, void* v) override;
  // Canonical tensors for every layer are encoded where they are, without a gather.
  bool InMemory() const override;
  std::pair<const void*, const void*> LayerInMemory(uint32_t layer) const override {
    return {k_[layer], v_[layer]};
  }

 private:
  std::string model_;
  ModelGeometry geometry_;
  DType dtype_;
  uint64_t tokens_;
  KvLayout layout_;
  std::vector<const void*> k_, v_;
};

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_KV_LAYOUT_H_
