// Mean-removed keys: an analysis of what per-block key centering would buy TurboQuant.
//
// Keys of trained models share a large common component per head (about half of their energy on
// SmolLM2-135M), and with RoPE its low-frequency part drifts slowly with position. A data-oblivious
// codec spends its bits on that component. Centering encodes, per (layer, KV head) and block of
// `block` tokens, the residual r = k − α·μ, where μ is the block's mean key and α = k·μ / ‖μ‖²
// (per vector, rounded to f16) so that ‖r‖ ≤ ‖k‖ for every vector, attention sinks included.
// Decoding adds α·μ back. μ is rounded to f16: both would be stored at 16 bits.
//
// Used by `tqkv-bench migrate --center-keys B` to measure the effect on real models; not (yet) a
// container feature. V is left as is.
#ifndef TQKV_SRC_MODEL_KEY_CENTERING_H_
#define TQKV_SRC_MODEL_KEY_CENTERING_H_

#include <cstdint>
#include <vector>

#include "tqkv/kv_cache.h"
#include "tqkv/status.h"

namespace tqkv::model {

struct KeyCentering {
  uint32_t block = 0;         // tokens per mean
  uint64_t tokens = 0;
  ModelGeometry geometry;
  std::vector<float> means;   // [layer][block index][kv head][head_dim], f16-representable
  std::vector<float> alphas;  // [layer][token][kv head], f16-representable
  double energy_fraction = 0; // Σ‖r‖² / Σ‖k‖² over all keys

  // Bits the means and coefficients take at 16 bits each.
  uint64_t StoredBits() const { return 16 * (means.size() + alphas.size()); }
};

// Writes K − α·μ into `residual`'s K tensors and copies V. Both caches: fp16, same geometry and
// token count; `block` ≥ 1.
Result<KeyCentering> CenterKeys(const KvCache& original, uint32_t block, const KvCache& residual);

// Adds α·μ back to the K tensors of `cache` (fp16, the geometry and tokens of `c`).
Status UncenterKeys(const KeyCentering& c, const KvCache& cache);

}  // namespace tqkv::model

#endif  // TQKV_SRC_MODEL_KEY_CENTERING_H_
