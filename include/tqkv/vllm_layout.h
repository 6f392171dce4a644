// vLLM 0.32's CPU paged KV cache as tqkv layouts. Its CPU backend keeps a layer as one
// [blocks, kv_heads, block_size, 2 * head_dim] tensor; per block and head the first
// block_size * head_dim elements are K and the rest V, each ordered as the attention ISA's
// reshape_and_cache writes them (csrc/cpu/cpu_attn_vec*.hpp, cpu_attn_amx.hpp):
//   vec, vec16: K channel-major [head_dim][block_size], V token-major [block_size][head_dim];
//   amx (16-bit): K in 16-token groups of channel pairs, V in 16-channel groups of token pairs
//                 (KvTiles), block_size and head_dim multiples of 32.
#ifndef TQKV_INCLUDE_TQKV_VLLM_LAYOUT_H_
#define TQKV_INCLUDE_TQKV_VLLM_LAYOUT_H_

#include <cstdint>
#include <string_view>

#include "tqkv/geometry.h"
#include "tqkv/kv_layout.h"
#include "tqkv/status.h"
#include "tqkv/types.h"

namespace tqkv {

struct VllmCpuLayouts {
  KvLayout k, v;  // both from the layer tensor's pointer (V's base skips K's half)
};

// The layouts of a layer tensor for attention ISA `isa` ("vec", "vec16", "amx"); Unsupported for
// another ISA or a shape that ISA does not take. Block ids are left empty.
Result<VllmCpuLayouts> VllmCpuCacheLayouts(std::string_view isa, const ModelGeometry& geometry,
                                           uint64_t block_size, DType dtype);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_VLLM_LAYOUT_H_
