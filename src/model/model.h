// A Llama-architecture model loaded for the reference engine: configuration, weights (views into
// the memory-mapped file, kept in their stored type: f32/f16/bf16/q8_0/q4_0/q4_1) and tokenizer.
//
// Formats:
//  - llama2.c legacy checkpoints (.bin, v0): 7 x i32 header then f32 tensors; a negative
//    vocab_size means a separate classifier follows. Tokenizer: tok<vocab>.bin next to it.
//  - GGUF v2/v3 with general.architecture == "llama" (llama.* metadata, blk.N.* tensors,
//    output.weight optional: absent = tied to token_embd.weight), tokenizer.ggml.* metadata.
#ifndef TQKV_SRC_MODEL_MODEL_H_
#define TQKV_SRC_MODEL_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/ggml_types.h"
#include "model/gguf.h"
#include "model/mapped_file.h"
#include "model/tokenizer.h"
#include "tqkv/kv_cache.h"
#include "tqkv/status.h"

namespace tqkv::model {

// How RoPE pairs the dimensions of a head: (2i, 2i+1) as in Meta/llama2.c/GGUF-llama, or
// (i, i + rope_dim/2) as in Hugging Face Llama checkpoints.
enum class RopeLayout { kInterleaved = 0, kHalfSplit = 1 };

enum class ModelFormat { kLlama2c = 0, kGguf = 1 };

struct LlamaConfig {
  uint32_t dim = 0;
  uint32_t hidden_dim = 0;
  uint32_t n_layers = 0;
  uint32_t n_heads = 0;
  uint32_t n_kv_heads = 0;
  uint32_t vocab_size = 0;
  uint32_t context_length = 0;
  uint32_t head_dim = 0;
  uint32_t rope_dim = 0;  // rotated dimensions per head (<= head_dim, even)
  float rope_freq_base = 10000.0f;
  float norm_eps = 1e-5f;
  RopeLayout rope_layout = RopeLayout::kInterleaved;

  uint32_t kv_dim() const { return n_kv_heads * head_dim; }
  uint32_t q_dim() const { return n_heads * head_dim; }
  ModelGeometry geometry() const { return {n_layers, n_kv_heads, head_dim}; }
};

// A 2-D weight: `rows` rows of `cols` elements (ggml ne[0] = cols), row-major in the file.
struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  uint64_t cols = 0;
  uint64_t rows = 0;
  uint64_t row_bytes = 0;
  const uint8_t* data = nullptr;
  const uint8_t* row(uint64_t r) const { return data + r * row_bytes; }
};

struct LayerWeights {
  std::vector<float> attn_norm;  // [dim]
  std::vector<float> ffn_norm;   // [dim]
  WeightMatrix wq;               // [q_dim rows][dim]
  WeightMatrix wk;               // [kv_dim][dim]
  WeightMatrix wv;               // [kv_dim][dim]
  WeightMatrix wo;               // [dim][q_dim]
  WeightMatrix w_gate;           // [hidden][dim]  (llama2.c w1)
  WeightMatrix w_up;             // [hidden][dim]  (llama2.c w3)
  WeightMatrix w_down;           // [dim][hidden]  (llama2.c w2)
};

struct LlamaWeights {
  WeightMatrix token_embd;  // [vocab][dim]
  std::vector<LayerWeights> layers;
  std::vector<float> output_norm;  // [dim]
  WeightMatrix output;             // [vocab][dim]; same as token_embd when tied
  bool tied_output = false;
};

struct ModelLoadOptions {
  // llama2.c only: tokenizer file; empty = "tok<vocab>.bin" next to the checkpoint if present.
  std::string tokenizer_path;
};

class Model {
 public:
  // Detects the format from the file's first bytes ("GGUF" magic, else llama2.c).
  static Result<std::unique_ptr<Model>> Load(const std::string& path,
                                             const ModelLoadOptions& options = {});
  static Result<std::unique_ptr<Model>> LoadLlama2c(const std::string& path,
                                                    const ModelLoadOptions& options = {});
  static Result<std::unique_ptr<Model>> LoadGguf(const std::string& path);

  const LlamaConfig& config() const { return config_; }
  const LlamaWeights& weights() const { return weights_; }
  // Null when the model came without a tokenizer.
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  ModelFormat format() const { return format_; }
  // "smollm2-135m" (GGUF general.basename-size_label), else the file's stem ("stories260K").
  const std::string& name() const { return name_; }
  ModelGeometry geometry() const { return config_.geometry(); }
  // The parsed GGUF (metadata, tensor table); null for llama2.c checkpoints.
  const GgufFile* gguf() const { return gguf_.get(); }

 private:
  Model() = default;
  LlamaConfig config_;
  LlamaWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelFormat format_ = ModelFormat::kLlama2c;
  std::string name_;
  std::shared_ptr<const MappedFile> file_;
  std::unique_ptr<GgufFile> gguf_;
};

}  // namespace tqkv::model

#endif  // TQKV_SRC_MODEL_MODEL_H_
