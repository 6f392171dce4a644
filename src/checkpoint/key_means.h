// Mean-removed keys (docs/format.md §5, format version 4): what a checkpoint stores per (layer,
// KV head) — the keys' mean over each block of key_mean_block tokens and one coefficient per key
// — the residuals it encodes, and the decoders' view of the stored values.
//
// Why: keys share a large common component per head (a K bias on Qwen2.5 holds up to 99.7 % of
// layer 0's key energy). TurboQuant's error scales with a vector's whole norm while attention
// only sees what varies between tokens, so the codec encodes r = k − α·μ and decoders add α·μ
// back. α = k·μ / |μ|² (rounded to the stored dtype) keeps |r| <= |k| for every key, attention
// sinks included (with α = 1 a sink's residual can grow: docs/lab/accuracy-log.md).
#ifndef TQKV_SRC_CHECKPOINT_KEY_MEANS_H_
#define TQKV_SRC_CHECKPOINT_KEY_MEANS_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tqkv/container.h"
#include "tqkv/status.h"
#include "tqkv/types.h"

namespace tqkv {

// The key-means payload of layer `layer` (KeyMeanValues × DTypeSize(key_mean_dtype) bytes) from
// its K tensor `k` in the canonical layout [LayerTokens][kv_heads][head_dim] of `dtype`:
// * means [kv_head][block][head_dim]: per head and block, the mean (in double, tokens in order)
//   of the block's keys whose elements are all finite (0 when none are), rounded to f32 and then
//   to the stored dtype; a value that is not finite there is stored as 0;
// * coefficients [kv_head][token]: α = (k·μ) / (μ·μ) in double over the stored μ, rounded to f32
//   and the stored dtype; 0 when μ·μ = 0 or α is not finite there or k is not finite.
// `pool` (may be null) spreads the (head, block) pairs; the bytes do not depend on it.
void ComputeKeyMeans(const ContainerHeader& h, uint32_t layer, const void* k, DType dtype,
                     std::span<uint8_t> out, ThreadPool* pool = nullptr);

// A key-means payload as f32 values (f16 converted exactly).
struct KeyMeans {
  std::vector<float> means;   // [kv_head][block][head_dim]
  std::vector<float> alphas;  // [kv_head][token]
};
KeyMeans KeyMeansAsF32(const ContainerHeader& h, uint32_t layer, std::span<const uint8_t> payload);

// The residual the K codes hold: per token and head, float(k) − α·μ in f32 (the product rounded,
// then the difference), into `out` (LayerTokens × kv_heads × head_dim floats, canonical layout).
// `pool` (may be null) spreads the tokens.
void CenterKeys(const ContainerHeader& h, uint32_t layer, const void* k, DType dtype,
                const KeyMeans& m, float* out, ThreadPool* pool = nullptr);

// Decodes the K codes of head `head`, tokens [token_begin, token_begin + n), of a layer with key
// means: Codec::DecodeAdd per run of tokens in one mean block. `out` points at the head's first
// element of token token_begin, `stride` elements between tokens.
Status DecodeCenteredKeys(const ContainerHeader& h, uint32_t layer, const Codec& codec,
                          const KeyMeans& m, uint32_t head, uint64_t token_begin, size_t n,
                          std::span<const uint8_t> codes, std::span<const uint8_t> meta, void* out,
                          DType dtype, size_t stride, ThreadPool* pool);

}  // namespace tqkv

#endif  // TQKV_SRC_CHECKPOINT_KEY_MEANS_H_
