#include "tqkv/vllm_layout.h"

#include <string>

namespace tqkv {

Result<VllmCpuLayouts> VllmCpuCacheLayouts(std::string_view isa, const ModelGeometry& g,
                                           uint64_t block_size, DType dtype) {
  const int64_t n = static_cast<int64_t>(block_size), d = g.head_dim;
  const int64_t head = 2 * n * d;  // one head's K and V halves
  VllmCpuLayouts out;
  for (KvLayout* l : {&out.k, &out.v}) {
    l->block_tokens = block_size;
    l->head_stride = head;
    l->block_stride = head * g.kv_heads;
  }
  out.v.base = n * d;
  if (isa == "vec" || isa == "vec16") {
    out.k.token_stride = 1;
    out.k.dim_stride = n;
    out.v.token_stride = d;
    out.v.dim_stride = 1;
    return out;
  }
  if (isa == "amx" && DTypeSize(dtype) == 2 && n % 32 == 0 && d % 32 == 0) {
    out.k.tiles = KvTiles::kTokenGroups16;
    out.v.tiles = KvTiles::kChannelGroups16;
    return out;
  }
  return Status::Unsupported("vLLM CPU attention ISA '" + std::string(isa) + "' (" +
                             std::string(DTypeName(dtype)) + ", block " +
                             std::to_string(block_size) + ", head_dim " + std::to_string(d) +
                             "): its cache layout is not known to tqkv (vec, vec16, amx with "
                             "16-bit elements and block and head_dim multiples of 32)");
}

}  // namespace tqkv
