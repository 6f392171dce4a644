// Writes the stories260K llama2.c checkpoint as a GGUF llama model (test helper), so the GGUF
// loader, the quantized kernels and both RoPE layouts can be checked against the .bin path.
#ifndef TQKV_TESTS_MODEL_STORIES_CONVERTER_H_
#define TQKV_TESTS_MODEL_STORIES_CONVERTER_H_

#include <string>
#include <vector>

#include "model/model.h"
#include "model_test_util.h"

namespace tqkv::model::testing {

struct ConvertOptions {
  GgmlType type = GgmlType::kF32;  // for matrices whose rows are a multiple of 32 (else f32)
  bool half_split = false;         // permute Q/K rows to the Hugging Face RoPE layout
  bool separate_output = false;    // write output.weight instead of tying it
  bool with_tokenizer = true;
};

inline std::vector<float> MatrixFloats(const WeightMatrix& m) {
  std::vector<float> v(m.rows * m.cols);
  for (uint64_t r = 0; r < m.rows; ++r)
    DequantizeRow(m.type, m.row(r), m.cols, v.data() + r * m.cols);
  return v;
}

// Rows of a [heads * hd][cols] matrix reordered from interleaved to half-split RoPE pairs:
// half-split row (h, j * hd/2 + i) = interleaved row (h, 2i + j).
inline std::vector<float> ToHalfSplit(const std::vector<float>& w, size_t heads, size_t hd,
                                      size_t cols) {
  std::vector<float> out(w.size());
  for (size_t h = 0; h < heads; ++h) {
    for (size_t i = 0; i < hd / 2; ++i) {
      for (size_t j = 0; j < 2; ++j) {
        const float* src = w.data() + (h * hd + 2 * i + j) * cols;
        std::copy(src, src + cols, out.data() + (h * hd + j * hd / 2 + i) * cols);
      }
    }
  }
  return out;
}

inline std::string StoriesAsGguf(const Model& m, const ConvertOptions& o) {
  const LlamaConfig& c = m.config();
  const LlamaWeights& w = m.weights();
  GgufBuilder b;
  b.KvStr("general.architecture", "llama");
  b.KvStr("general.basename", "Stories");
  b.KvStr("general.size_label", "260K");
  b.KvU32("llama.block_count", c.n_layers);
  b.KvU32("llama.context_length", c.context_length);
  b.KvU32("llama.embedding_length", c.dim);
  b.KvU32("llama.feed_forward_length", c.hidden_dim);
  b.KvU32("llama.attention.head_count", c.n_heads);
  b.KvU32("llama.attention.head_count_kv", c.n_kv_heads);
  b.KvF32("llama.rope.freq_base", c.rope_freq_base);
  b.KvF32("llama.attention.layer_norm_rms_epsilon", c.norm_eps);
  b.KvU32("llama.rope.dimension_count", c.rope_dim);
  b.KvU32("general.alignment", 32);
  if (o.with_tokenizer && m.tokenizer() != nullptr) {
    const Tokenizer& t = *m.tokenizer();
    std::vector<std::string> pieces;
    std::vector<float> scores;
    std::vector<int32_t> types;
    // llama2.c's export turned U+2581 into spaces; GGUF SentencePiece vocabularies keep it.
    const std::vector<float> tok_scores = [&] {
      std::vector<float> s;
      const std::string raw = ReadFile(StoriesTok());
      size_t off = 4;
      for (size_t i = 0; i < t.vocab_size(); ++i) {
        float sc;
        int32_t len;
        std::memcpy(&sc, raw.data() + off, 4);
        std::memcpy(&len, raw.data() + off + 4, 4);
        s.push_back(sc);
        off += 8 + static_cast<size_t>(len);
      }
      return s;
    }();
    for (size_t i = 0; i < t.vocab_size(); ++i) {
      std::string p(t.Piece(static_cast<int32_t>(i)));
      std::string q;
      for (char ch : p) {
        if (ch == ' ') {
          q += "\xE2\x96\x81";
        } else {
          q.push_back(ch);
        }
      }
      pieces.push_back(q);
      scores.push_back(tok_scores[i]);
      types.push_back(i == 0 ? 2 : (i <= 2 ? 3 : (i <= 258 ? 6 : 1)));
    }
    b.KvStr("tokenizer.ggml.model", "llama");
    b.KvStrArray("tokenizer.ggml.tokens", pieces);
    b.KvArray<float>("tokenizer.ggml.scores", GgufValueType::kFloat32, scores);
    b.KvArray<int32_t>("tokenizer.ggml.token_type", GgufValueType::kInt32, types);
    b.KvU32("tokenizer.ggml.bos_token_id", 1);
    b.KvU32("tokenizer.ggml.eos_token_id", 2);
  }
  auto mat = [&](const std::string& name, const WeightMatrix& wm, bool permute, size_t heads) {
    std::vector<float> v = MatrixFloats(wm);
    if (permute && o.half_split) v = ToHalfSplit(v, heads, c.head_dim, wm.cols);
    const GgmlType t = wm.cols % 32 == 0                                         ? o.type
                       : (o.type == GgmlType::kF16 || o.type == GgmlType::kBF16) ? o.type
                                                                                 : GgmlType::kF32;
    b.Matrix(name, wm.cols, wm.rows, t, v.data());
  };
  mat("token_embd.weight", w.token_embd, false, 0);
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const LayerWeights& lw = w.layers[l];
    b.Vector(p + "attn_norm.weight", c.dim, lw.attn_norm.data());
    mat(p + "attn_q.weight", lw.wq, true, c.n_heads);
    mat(p + "attn_k.weight", lw.wk, true, c.n_kv_heads);
    mat(p + "attn_v.weight", lw.wv, false, 0);
    mat(p + "attn_output.weight", lw.wo, false, 0);
    b.Vector(p + "ffn_norm.weight", c.dim, lw.ffn_norm.data());
    mat(p + "ffn_gate.weight", lw.w_gate, false, 0);
    mat(p + "ffn_down.weight", lw.w_down, false, 0);
    mat(p + "ffn_up.weight", lw.w_up, false, 0);
  }
  b.Vector("output_norm.weight", c.dim, w.output_norm.data());
  if (o.separate_output) mat("output.weight", w.output, false, 0);
  return b.Build();
}

}  // namespace tqkv::model::testing

#endif  // TQKV_TESTS_MODEL_STORIES_CONVERTER_H_
