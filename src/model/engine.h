// LlamaEngine: a small deterministic CPU inference engine for Llama-architecture models, used to
// prove that a restored (compressed) KV cache continues a real transformer token-exactly.
//
// Decoder: RMSNorm, RoPE (interleaved or half-split pairs, base from the model), grouped-query
// attention, SwiGLU FFN, tied or separate classifier. The KV cache is kept in fp16 (K after
// RoPE), in tqkv's canonical layout per layer: [tokens][kv_heads][head_dim], so the cache can be
// exported as a tqkv::KvCache view and an fp16 checkpoint of it is lossless.
//
// Quantized weights stay quantized: either activations are quantized to q8 blocks (like
// llama.cpp) and dotted with q4_0/q4_1/q8_0 rows, or (EngineOptions.activations = kF32) they
// stay fp32 and each weight block is dequantized in registers, by AVX2 or scalar kernels;
// f32/f16/bf16 weights use float dots. Matmuls run on a tqkv::ThreadPool, partitioned by output row, so every output element is
// computed by one thread in a fixed order: logits are bit-identical run to run, for any thread
// count, for any SIMD level, and whether tokens come through Prefill (batched) or Forward.
//
// Thread-safety: one engine is used by one thread at a time; distinct engines may share a Model.
#ifndef TQKV_SRC_MODEL_ENGINE_H_
#define TQKV_SRC_MODEL_ENGINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "model/kernels.h"
#include "model/model.h"
#include "tqkv/kv_cache.h"
#include "tqkv/status.h"
#include "tqkv/thread_pool.h"

namespace tqkv::model {

// What quantized (q4_0/q4_1/q8_0) weights are dotted with. kQ8: activations are quantized to
// q8 blocks first (like llama.cpp; integer block dots). kF32: activations stay fp32 and each
// weight block is dequantized in registers (weights stay quantized in memory); logits are then
// a continuous function of the inputs and of the KV cache (no q8 rounding steps). f32/f16/bf16
// weights use float dots either way.
enum class ActivationPrecision { kQ8, kF32 };

// "q8" / "f32".
const char* ActivationPrecisionName(ActivationPrecision a);

struct EngineOptions {
  // Worker threads when `pool` is null (0 = one per hardware thread).
  size_t threads = 0;
  // A pool to run on instead of an own one (not owned; must outlive the engine).
  ThreadPool* pool = nullptr;
  // RoPE layout; default: the model's (interleaved for GGUF llama and llama2.c).
  std::optional<RopeLayout> rope_layout;
  // Maximum tokens in the cache; 0 = the model's context length.
  uint32_t max_tokens = 0;
  // Tokens per batched step of Prefill (bounds scratch memory; results do not depend on it).
  uint32_t prefill_chunk = 256;
  // Activation precision of quantized matmuls.
  ActivationPrecision activations = ActivationPrecision::kQ8;
};

class LlamaEngine {
 public:
  // `model` must outlive the engine.
  static Result<std::unique_ptr<LlamaEngine>> Create(const Model& model,
                                                     const EngineOptions& options = {});
  ~LlamaEngine();
  LlamaEngine(const LlamaEngine&) = delete;
  LlamaEngine& operator=(const LlamaEngine&) = delete;

  // Runs `tokens` at positions position()..position()+n-1 (batched per layer) and returns the
  // logits [vocab] of the last one. InvalidArgument for an empty span, ids out of range, or
  // more tokens than max_tokens().
  Result<std::vector<float>> Prefill(std::span<const int32_t> tokens);
  // Runs one token at position() and returns its logits [vocab].
  Result<std::vector<float>> Forward(int32_t token);

  // Tokens in the cache (= the position of the next token).
  uint64_t position() const { return position_; }
  uint32_t max_tokens() const { return max_tokens_; }
  // Forgets the cache (position 0).
  void Reset() { position_ = 0; }

  // A view of the cache (f16, K after RoPE, canonical layout, tokens = position()). Points into
  // the engine; valid until the next Prefill/Forward/Import/Reset or the engine's destruction.
  KvCache CacheView() const;
  // A copy of the cache that owns its memory.
  Result<std::unique_ptr<KvCacheBuffer>> ExportCache() const;
  // Replaces the cache with `cache` (same geometry; f16 copied exactly, f32/bf16 rounded to
  // f16) and sets position() to its token count. Then Forward continues after it.
  Status ImportCache(const KvCache& cache);

  const Model& model() const { return model_; }
  const LlamaConfig& config() const { return config_; }
  ModelGeometry geometry() const { return config_.geometry(); }
  // The SIMD level of the kernels this engine picked (ActiveSimdLevel() at Create time).
  SimdLevel simd_level() const { return kernels_->level; }
  ActivationPrecision activations() const { return activations_; }

 private:
  LlamaEngine(const Model& model, const LlamaConfig& config);
  Status Run(std::span<const int32_t> tokens, std::vector<float>* logits);
  Status EnsureCapacity(uint64_t tokens);
  // out[t][w.rows] = x[t][w.cols] . w^T. For quantized w, x is first quantized into xq_ unless
  // `x_is_quantized` says xq_ already holds this x (shared inputs of Q/K/V and gate/up).
  void MatMul(const WeightMatrix& w, const float* x, size_t n_tokens, float* out,
              bool x_is_quantized = false);
  void Attention(uint32_t layer, size_t n_tokens, uint64_t pos0);

  const Model& model_;
  LlamaConfig config_;
  const ModelKernels* kernels_ = nullptr;
  std::unique_ptr<ThreadPool> own_pool_;
  ThreadPool* pool_ = nullptr;
  uint32_t max_tokens_ = 0;
  uint32_t prefill_chunk_ = 256;
  ActivationPrecision activations_ = ActivationPrecision::kQ8;
  uint64_t position_ = 0;
  uint64_t capacity_ = 0;                                 // tokens allocated per layer
  std::vector<std::vector<uint16_t>> k_cache_, v_cache_;  // per layer [capacity][kv_dim] f16
  // Per-call scratch, sized for prefill_chunk tokens.
  std::vector<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_;
  std::vector<BlockQ8x4> xq_;    // [ceil(n / 4)][cols / 32]
  std::vector<float> inv_freq_;  // [rope_dim / 2]
};

// Index of the largest logit (the first one on ties).
int32_t ArgMax(std::span<const float> logits);

// Greedy decoding: prefills `prompt` (which must not be empty) then appends `n` argmax tokens,
// feeding each back. Stops early after `stop_token` (if >= 0) was produced. Returns the new ids.
Result<std::vector<int32_t>> GenerateGreedy(LlamaEngine& engine, std::span<const int32_t> prompt,
                                            size_t n, int32_t stop_token = -1);

}  // namespace tqkv::model

#endif  // TQKV_SRC_MODEL_ENGINE_H_
