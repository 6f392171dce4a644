// Synthetic head vectors for tests and benchmarks, deterministic from a seed.
//
// `gaussian`: i.i.d. N(0, 1) elements.
// `kv`: KV-cache-like vectors (docs/codec.md, "Synthetic data"). Per group (layer, K or V, KV head)
// a per-channel bias, a few high-magnitude channels, RoPE-like rotation of channel pairs for K,
// and Gaussian noise; V is milder than K. Every token's vector depends only on (seed, layer, kv,
// head, token), so any token range of a session can be generated on its own, layer by layer.
#ifndef TQKV_INCLUDE_TQKV_SYNTHETIC_H_
#define TQKV_INCLUDE_TQKV_SYNTHETIC_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "tqkv/kv_cache.h"
#include "tqkv/status.h"
#include "tqkv/types.h"

namespace tqkv {

enum class SyntheticKind : uint8_t { kGaussian = 0, kKv = 1 };
std::optional<SyntheticKind> ParseSyntheticKind(std::string_view name);

class SyntheticKv {
 public:
  // geometry.head_dim >= 2 (even for RoPE pairs; an odd last channel is left unrotated).
  SyntheticKv(SyntheticKind kind, ModelGeometry geometry, uint64_t seed,
              double rope_base = 10000.0);

  SyntheticKind kind() const { return kind_; }
  const ModelGeometry& geometry() const { return geometry_; }

  // Tokens [t0, t1) of group (layer, kv = 0 for K / 1 for V, head): t1 - t0 vectors of head_dim
  // elements of `dtype`, vector i at out + i * stride elements.
  Status FillGroup(uint32_t layer, int kv, uint32_t head, uint64_t t0, uint64_t t1, DType dtype,
                   void* out, size_t stride) const;
  // Tokens [t0, t1) of one layer's K (kv = 0) or V (kv = 1) tensor in the canonical token-major
  // layout [t1 - t0][kv_heads][head_dim] (tqkv/kv_cache.h).
  Status FillLayer(uint32_t layer, int kv, uint64_t t0, uint64_t t1, DType dtype, void* out) const;
  // Every layer of a KvCache view, tokens [0, cache.tokens()).
  Status FillCache(const KvCache& cache) const;

 private:
  static constexpr uint64_t kChunk = 256;  // tokens per RoPE table
  // sin, cos of pos * base^(-2i/d) for pos in [t0, t1), pair i: [(t - t0) * d/2 + i] * 2 + {0, 1}.
  void RopeTable(uint64_t t0, uint64_t t1, std::vector<double>* table) const;
  void FillChunk(uint32_t layer, int kv, uint32_t head, uint64_t t0, uint64_t t1,
                 const std::vector<double>& rope, DType dtype, uint8_t* dst, size_t stride) const;

  SyntheticKind kind_;
  ModelGeometry geometry_;
  uint64_t seed_;
  double rope_base_;
  std::vector<double> rope_freq_;  // kv: base^(-2i/d) of pair i
  std::vector<double> rope_low_;   // kv: sin, cos of l * rope_freq_[i], l < kChunk: [l * d/2 + i] * 2
};

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_SYNTHETIC_H_
