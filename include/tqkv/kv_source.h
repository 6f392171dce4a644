// A session produced one layer at a time, so a session larger than memory can be checkpointed
// (checkpoint.h reads it; synthetic_source.h and the model produce it). Beside kv_cache.h, so the
// producers need nothing from the checkpoint pipeline.
#ifndef TQKV_INCLUDE_TQKV_KV_SOURCE_H_
#define TQKV_INCLUDE_TQKV_KV_SOURCE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tqkv/kv_cache.h"
#include "tqkv/status.h"
#include "tqkv/types.h"

namespace tqkv {

class KvSource {
 public:
  virtual ~KvSource() = default;
  virtual const std::string& model() const = 0;
  virtual const ModelGeometry& geometry() const = 0;
  virtual DType dtype() const = 0;
  virtual uint64_t tokens() const = 0;
  // Per layer, the tokens it holds (KvCache::SetLayerTokens's rules); empty, the default: every
  // layer holds tokens(). The session is then written as a ragged container (format version 7).
  virtual std::vector<uint64_t> layer_tokens() const { return {}; }
  // Fills k and v (layer_tokens or tokens × kv_heads × head_dim elements of dtype() each) with
  // layer `layer`.
  virtual Status ReadLayer(uint32_t layer, void* k, void* v) = 0;
  // Whether every layer is already in memory in that form: then Checkpoint encodes from
  // LayerInMemory's tensors instead of copying them with ReadLayer.
  virtual bool InMemory() const { return false; }
  // Layer `layer`'s K and V (as ReadLayer would fill them), valid while the source lives; only
  // called when InMemory().
  virtual std::pair<const void*, const void*> LayerInMemory(uint32_t layer) const {
    (void)layer;
    return {nullptr, nullptr};
  }
};

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_KV_SOURCE_H_
