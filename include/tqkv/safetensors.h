// safetensors import/export of a KvCache (the ecosystem's tensor file format).
//
// Tensor names: "layers.<i>.k" and "layers.<i>.v" for i in [0, layers), each of shape
// [tokens, kv_heads, head_dim] (the canonical layout) and dtype F16, BF16 or F32.
// __metadata__: {"format": "tqkv-kv-cache", "model": "<name>"}. In PyTorch:
//   safetensors.torch.save_file({f"layers.{i}.k": k[i].contiguous(), ...}, "s.safetensors",
//                               metadata={"format": "tqkv-kv-cache", "model": "qwen2.5-7b"})
#ifndef TQKV_INCLUDE_TQKV_SAFETENSORS_H_
#define TQKV_INCLUDE_TQKV_SAFETENSORS_H_

#include <memory>
#include <string>

#include "tqkv/kv_cache.h"
#include "tqkv/status.h"

namespace tqkv {

// Writes the cache to `path` (atomically: temp file + rename).
Status WriteSafetensors(const KvCache& cache, const std::string& path);
// Reads a cache written as above (any of the three dtypes; all tensors must share one; layers
// of different token counts make a ragged cache, KvCache::layer_tokens).
// Sizes in the header are checked against the file before anything is allocated.
Result<std::unique_ptr<KvCacheBuffer>> ReadSafetensors(const std::string& path);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_SAFETENSORS_H_
