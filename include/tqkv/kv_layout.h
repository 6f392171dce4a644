// KV tensors in the layouts engines keep them in, read into and written from the canonical layout
// of kv_cache.h one layer at a time: token-major [tokens][kv_heads][head_dim] views with other
// strides ([kv_heads][tokens][head_dim] as in transformers) and paged blocks (vLLM style:
// [blocks][block_tokens][kv_heads][head_dim] plus a block table saying which block holds which
// tokens). The canonical contiguous layout needs none of this: KvCache views it without a copy.
#ifndef TQKV_INCLUDE_TQKV_KV_LAYOUT_H_
#define TQKV_INCLUDE_TQKV_KV_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tqkv/kv_cache.h"
#include "tqkv/kv_source.h"
#include "tqkv/status.h"
#include "tqkv/types.h"

namespace tqkv {

// Tiled orders of a block's [block_tokens, head_dim] elements that no strides describe: vLLM
// 0.32's CPU cache as its AMX attention kernels write it (bfloat16; docs/vllm.md, "Layouts").
enum class KvTiles : uint8_t {
  kNone = 0,
  // Keys: 16-token groups of channel pairs, [t / 16][c / 2][t % 16][c % 2] (the B tile of QK^T).
  kTokenGroups16 = 1,
  // Values: 16-channel groups of token pairs, [c / 16][t / 2][c % 16][t % 2] (the B tile of PV).
  kChannelGroups16 = 2,
};

// Where element (token t, head h, channel c) of one layer's K or V tensor lives, in elements from
// the tensor's base pointer:
//   unpaged (block_tokens == 0): base + t * token_stride + h * head_stride + c * dim_stride
//   paged:   base + block_ids[t / block_tokens] * block_stride + (t % block_tokens) * token_stride
//            + h * head_stride + c * dim_stride
//   tiled (paged only): base + block_ids[t / block_tokens] * block_stride + h * head_stride
//            + TiledOffset(t % block_tokens, c); token_stride and dim_stride are unused.
// Strides may be any non-negative values (they come from an array's strides).
struct KvLayout {
  int64_t token_stride = 0, head_stride = 0, dim_stride = 1;
  uint64_t block_tokens = 0;       // 0: not paged
  int64_t block_stride = 0;
  std::vector<int64_t> block_ids;  // paged: one per block_tokens tokens (the last may be partial)
  int64_t base = 0;                // elements from the tensor's pointer to element (0, 0, 0)
  KvTiles tiles = KvTiles::kNone;

  // The canonical layout for `geometry`: token_stride kv_heads * head_dim, head_stride head_dim.
  static KvLayout Canonical(const ModelGeometry& geometry);
  bool IsCanonical(const ModelGeometry& geometry) const;

  // Element offset of (token, head, channel 0) in an untiled layout valid for the token.
  int64_t Offset(uint64_t token, size_t head) const {
    const int64_t row = block_tokens == 0
                            ? static_cast<int64_t>(token) * token_stride
                            : block_ids[token / block_tokens] * block_stride +
                                  static_cast<int64_t>(token % block_tokens) * token_stride;
    return base + row + static_cast<int64_t>(head) * head_stride;
  }
  // A tiled layout's offset of (token t, channel c) of a block within its (block, head) region.
  int64_t TiledOffset(uint64_t t, uint64_t c, uint64_t head_dim) const {
    if (tiles == KvTiles::kTokenGroups16) {
      return static_cast<int64_t>(((t / 16) * (head_dim / 2) + c / 2) * 32 + (t % 16) * 2 + c % 2);
    }
    return static_cast<int64_t>(((c / 16) * (block_tokens / 2) + t / 2) * 32 + (c % 16) * 2 +
                                t % 2);
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
// `tensor_elems` elements (negative strides, bases and block ids refused; a paged layout needs
// ceil(tokens / block_tokens) block ids; a tiled one is paged with block_tokens and head_dim
// multiples of 16), so a wrong stride or block id can't read or write outside the caller's array.
Status ValidateKvLayout(const KvLayout& layout, const ModelGeometry& geometry, uint64_t tokens,
                        uint64_t tensor_elems);

// Copies one layer's tensor between `layout` at `src`/`dst` and the canonical layout
// (tokens * kv_heads * head_dim contiguous elements of `dtype`). The layout must have been
// validated; rows with dim_stride 1 are copied whole.
void GatherLayer(const void* src, const KvLayout& layout, const ModelGeometry& geometry,
                 uint64_t tokens, DType dtype, void* canonical);
void ScatterLayer(const void* canonical, const KvLayout& layout, const ModelGeometry& geometry,
                  uint64_t tokens, DType dtype, void* dst);

// Per-layer K and V tensors in caller memory: layer l's are k[l] and v[l], each `tensor_elems`
// elements of `dtype` (ValidateKvLayout bounds every element by it), K's in `layout` and V's in
// `v_layout` when set (vLLM's CPU cache orders K and V differently), else in `layout` too.
struct LayoutTensors {
  ModelGeometry geometry;
  DType dtype = DType::kF16;
  uint64_t tokens = 0;
  KvLayout layout;
  uint64_t tensor_elems = 0;
  std::vector<void*> k, v;
  std::optional<KvLayout> v_layout;

  const KvLayout& layout_of(int kv) const { return kv == 1 && v_layout ? *v_layout : layout; }
  // Both layouts with these block ids (a batch restores each stored object into its own blocks).
  void SetBlockIds(const std::vector<int64_t>& ids) {
    layout.block_ids = ids;
    if (v_layout) v_layout->block_ids = ids;
  }
};

// Whether RestoreInto (checkpoint.h) decodes straight into tensors of `layout`: untiled, each
// head's channels contiguous (dim_stride 1) and, within a run of tokens, vectors at least
// head_dim elements apart. Otherwise it decodes a layer into a staging buffer and scatters it.
bool DecodesInPlace(const KvLayout& layout, const ModelGeometry& geometry, uint64_t tokens);
// Both of dst's layouts.
bool DecodesInPlace(const LayoutTensors& dst);

// A session held in caller memory in `layout`, as a KvSource for Checkpoint(): each ReadLayer
// gathers one layer into the canonical layout (memory: one layer, not the session).
class LayoutKvSource final : public KvSource {
 public:
  // k[l] and v[l]: layer l's tensors, each valid for its layout (ValidateKvLayout); V's in
  // v_layout when set, else in `layout`.
  LayoutKvSource(std::string model, ModelGeometry geometry, DType dtype, uint64_t tokens,
                 KvLayout layout, std::vector<const void*> k, std::vector<const void*> v,
                 std::optional<KvLayout> v_layout = std::nullopt);
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
  std::optional<KvLayout> v_layout_;
  std::vector<const void*> k_, v_;
};

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_KV_LAYOUT_H_
