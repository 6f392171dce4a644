#include "tqkv/kv_layout.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "kv/transpose.h"

namespace tqkv {
namespace {

using Wide = unsigned __int128;  // offsets of hostile strides must not wrap while checked

// One element of canonical (token t, head h, channel c) <-> its place in the layout.
template <typename T>
inline void Move(const T* src, T* dst, size_t from, size_t to) {
  dst[to] = src[from];
}

// Strided channels (vLLM's CPU keys: channel-major blocks): element by element, channels outer
// so that the layout side walks tokens, which lie token_stride apart; a run of consecutive
// 16-bit tokens is a matrix transpose.
template <typename T>
void CopyStrided(const KvLayout& l, const ModelGeometry& g, uint64_t tokens, const T* src, T* dst,
                 bool to_canonical) {
  const size_t heads = g.kv_heads, d = g.head_dim;
  for (uint64_t t0 = 0; t0 < tokens;) {
    const uint64_t n = l.RunTokens(t0, tokens - t0);
    for (size_t h = 0; h < heads; ++h) {
      const int64_t base = l.Offset(t0, h);
      if constexpr (sizeof(T) == 2) {
        if (l.token_stride == 1) {
          const size_t row = heads * d, canon = (t0 * heads + h) * d;
          const auto* s16 = reinterpret_cast<const uint16_t*>(src);
          auto* d16 = reinterpret_cast<uint16_t*>(dst);
          if (to_canonical) {  // [d][n] at dim_stride -> [n][d] at row
            Transpose16(s16 + base, l.dim_stride, d16 + canon, row, d, n);
          } else {
            Transpose16(s16 + canon, row, d16 + base, l.dim_stride, n, d);
          }
          continue;
        }
      }
      for (size_t c = 0; c < d; ++c) {
        const int64_t laid = base + static_cast<int64_t>(c) * l.dim_stride;
        for (uint64_t i = 0; i < n; ++i) {
          const size_t canon = ((t0 + i) * heads + h) * d + c;
          const size_t at = static_cast<size_t>(laid + static_cast<int64_t>(i) * l.token_stride);
          if (to_canonical) Move(src, dst, at, canon); else Move(src, dst, canon, at);
        }
      }
    }
    t0 += n;
  }
}

// Tiled blocks (KvTiles): element pairs, in the tile's order within each block and head.
template <typename T>
void CopyTiled(const KvLayout& l, const ModelGeometry& g, uint64_t tokens, const T* src, T* dst,
               bool to_canonical) {
  const size_t heads = g.kv_heads, d = g.head_dim;
  for (uint64_t t = 0; t < tokens; ++t) {
    const uint64_t b = t / l.block_tokens, in = t % l.block_tokens;
    for (size_t h = 0; h < heads; ++h) {
      const int64_t region = l.base + l.block_ids[b] * l.block_stride +
                             static_cast<int64_t>(h) * l.head_stride;
      const size_t canon = (t * heads + h) * d;
      for (size_t c = 0; c < d; ++c) {
        const size_t at = static_cast<size_t>(region + l.TiledOffset(in, c, d));
        if (to_canonical) Move(src, dst, at, canon + c); else Move(src, dst, canon + c, at);
      }
    }
  }
}

// Copies one layer between the layout and the canonical layout; to_canonical picks the direction.
void CopyLayer(const KvLayout& l, const ModelGeometry& g, uint64_t tokens, DType dtype,
               const uint8_t* src, uint8_t* dst, bool to_canonical) {
  const size_t es = DTypeSize(dtype), heads = g.kv_heads, d = g.head_dim;
  const auto typed = [&](auto tag) {
    using T = decltype(tag);
    const T* s = reinterpret_cast<const T*>(src);
    T* o = reinterpret_cast<T*>(dst);
    if (l.tiles != KvTiles::kNone) {
      CopyTiled<T>(l, g, tokens, s, o, to_canonical);
    } else {
      CopyStrided<T>(l, g, tokens, s, o, to_canonical);
    }
  };
  if (l.tiles != KvTiles::kNone || (l.dim_stride != 1 && d > 1)) {
    if (es == 2) return typed(uint16_t{});
    if (es == 4) return typed(uint32_t{});
  }
  const size_t vec = d * es;
  for (uint64_t t = 0; t < tokens; ++t) {
    const int64_t row = l.Offset(t, 0);
    for (size_t h = 0; h < heads; ++h) {
      const size_t canon = (t * heads + h) * vec;                             // bytes
      const int64_t base = row + static_cast<int64_t>(h) * l.head_stride;  // elements
      const size_t n = l.dim_stride == 1 ? 1 : d;  // whole rows when the channels are contiguous
      const size_t bytes = l.dim_stride == 1 ? vec : es;
      for (size_t c = 0; c < n; ++c) {
        const size_t laid = (base + static_cast<int64_t>(c) * l.dim_stride) * es;
        if (to_canonical) {
          std::memcpy(dst + canon + c * es, src + laid, bytes);
        } else {
          std::memcpy(dst + laid, src + canon + c * es, bytes);
        }
      }
    }
  }
}

}  // namespace

KvLayout KvLayout::Canonical(const ModelGeometry& g) {
  KvLayout l;
  l.token_stride = static_cast<int64_t>(g.token_elems());
  l.head_stride = g.head_dim;
  l.dim_stride = 1;
  return l;
}

bool KvLayout::IsCanonical(const ModelGeometry& g) const {
  return block_tokens == 0 && base == 0 && tiles == KvTiles::kNone && dim_stride == 1 && head_stride == static_cast<int64_t>(g.head_dim) &&
         token_stride == static_cast<int64_t>(g.token_elems());
}

bool DecodesInPlace(const KvLayout& l, const ModelGeometry& g, uint64_t tokens) {
  if (l.tiles != KvTiles::kNone) return false;
  if (l.dim_stride != 1 && g.head_dim > 1) return false;
  // Runs of one token need no stride between vectors.
  const bool single = tokens <= 1 || l.block_tokens == 1;
  return single || l.token_stride >= static_cast<int64_t>(g.head_dim);
}

bool DecodesInPlace(const LayoutTensors& dst) {
  return DecodesInPlace(dst.layout, dst.geometry, dst.tokens) &&
         (!dst.v_layout || DecodesInPlace(*dst.v_layout, dst.geometry, dst.tokens));
}

Status ValidateKvLayout(const KvLayout& l, const ModelGeometry& g, uint64_t tokens,
                        uint64_t tensor_elems) {
  if (g.kv_heads == 0 || g.head_dim == 0) return Status::InvalidArgument("layout: empty geometry");
  if (l.token_stride < 0 || l.head_stride < 0 || l.dim_stride < 0 || l.block_stride < 0 ||
      l.base < 0) {
    return Status::InvalidArgument("layout: negative strides are not supported");
  }
  const bool tiled = l.tiles != KvTiles::kNone;
  if (tiled && (l.tiles > KvTiles::kChannelGroups16 || l.block_tokens == 0 ||
                l.block_tokens % 16 != 0 || g.head_dim % 16 != 0)) {
    return Status::InvalidArgument("layout: a tiled layout needs blocks and head_dim of multiples "
                                   "of 16 tokens and channels");
  }
  if (tokens == 0) return Status::Ok();
  // The furthest element of one token row: (kv_heads - 1, head_dim - 1); tiled: of a whole block.
  const Wide row_span =
      Wide(l.base) + Wide(g.kv_heads - 1) * Wide(l.head_stride) +
      (tiled ? Wide(l.block_tokens) * g.head_dim - 1 : Wide(g.head_dim - 1) * Wide(l.dim_stride));
  Wide last = 0;
  if (l.block_tokens == 0) {
    last = Wide(tokens - 1) * Wide(l.token_stride) + row_span;
  } else {
    const uint64_t blocks = (tokens + l.block_tokens - 1) / l.block_tokens;
    if (l.block_ids.size() < blocks) {
      return Status::InvalidArgument("layout: " + std::to_string(tokens) + " tokens in blocks of " +
                                     std::to_string(l.block_tokens) + " need " +
                                     std::to_string(blocks) + " block ids, got " +
                                     std::to_string(l.block_ids.size()));
    }
    for (uint64_t b = 0; b < blocks; ++b) {
      if (l.block_ids[b] < 0) {
        return Status::InvalidArgument("layout: block id " + std::to_string(l.block_ids[b]) +
                                       " is negative");
      }
      const uint64_t in_block = std::min<uint64_t>(l.block_tokens, tokens - b * l.block_tokens);
      const Wide end = Wide(l.block_ids[b]) * Wide(l.block_stride) +
                       (tiled ? 0 : Wide(in_block - 1) * Wide(l.token_stride)) + row_span;
      if (end > last) last = end;
    }
  }
  if (last >= Wide(tensor_elems)) {
    return Status::InvalidArgument("layout: element offset " +
                                   std::to_string(static_cast<unsigned long long>(
                                       last > Wide(UINT64_MAX) ? UINT64_MAX : uint64_t(last))) +
                                   " lies outside the tensor's " + std::to_string(tensor_elems) +
                                   " elements (wrong strides, block size or block id)");
  }
  return Status::Ok();
}

void GatherLayer(const void* src, const KvLayout& layout, const ModelGeometry& geometry,
                 uint64_t tokens, DType dtype, void* canonical) {
  CopyLayer(layout, geometry, tokens, dtype, static_cast<const uint8_t*>(src),
            static_cast<uint8_t*>(canonical), true);
}

void ScatterLayer(const void* canonical, const KvLayout& layout, const ModelGeometry& geometry,
                  uint64_t tokens, DType dtype, void* dst) {
  CopyLayer(layout, geometry, tokens, dtype, static_cast<const uint8_t*>(canonical),
            static_cast<uint8_t*>(dst), false);
}

LayoutKvSource::LayoutKvSource(std::string model, ModelGeometry geometry, DType dtype,
                               uint64_t tokens, KvLayout layout, std::vector<const void*> k,
                               std::vector<const void*> v, std::optional<KvLayout> v_layout)
    : model_(std::move(model)), geometry_(geometry), dtype_(dtype), tokens_(tokens),
      layout_(std::move(layout)), v_layout_(std::move(v_layout)), k_(std::move(k)),
      v_(std::move(v)) {}

Status LayoutKvSource::ReadLayer(uint32_t layer, void* k, void* v) {
  if (layer >= k_.size() || layer >= v_.size()) {
    return Status::InvalidArgument("layout source: no layer " + std::to_string(layer));
  }
  GatherLayer(k_[layer], layout_, geometry_, tokens_, dtype_, k);
  GatherLayer(v_[layer], v_layout_ ? *v_layout_ : layout_, geometry_, tokens_, dtype_, v);
  return Status::Ok();
}

bool LayoutKvSource::InMemory() const {
  if (!layout_.IsCanonical(geometry_) || (v_layout_ && !v_layout_->IsCanonical(geometry_)) ||
      k_.size() != geometry_.layers ||
      v_.size() != geometry_.layers) {
    return false;
  }
  for (uint32_t l = 0; l < geometry_.layers; ++l) {
    if (k_[l] == nullptr || v_[l] == nullptr) return false;
  }
  return true;
}

}  // namespace tqkv
