// Tokenizers of the reference engine:
//  - ScoreTokenizer: SentencePiece-style greedy merge by score (llama2.c tokenizer.bin, e.g.
//    tok512.bin; also GGUF tokenizer.ggml.model == "llama"), with byte fallback <0xXX>.
//  - BpeTokenizer: GPT-2 byte-level BPE with merge ranks (GGUF tokenizer.ggml.model == "gpt2",
//    e.g. SmolLM2), with the "smollm" pre-tokenizer: every digit alone, then the GPT-2 split
//    ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+), implemented by
//    hand. Unicode letter/number classes are approximated: ASCII exactly; outside ASCII, a small
//    table of spaces, punctuation/symbol blocks and digit blocks, everything else a letter.
#ifndef TQKV_SRC_MODEL_TOKENIZER_H_
#define TQKV_SRC_MODEL_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tqkv/status.h"

namespace tqkv::model {

class GgufFile;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of `text` (BOS first when add_bos). parse_special: control tokens written in the
  // text (e.g. "<|im_start|>") become their ids instead of being tokenized as text.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                                      bool parse_special = false) const = 0;
  // Text of a whole id sequence. ScoreTokenizer drops BOS/EOS and the dummy-prefix space of the
  // first piece; BpeTokenizer renders control tokens (e.g. "<|im_end|>") verbatim.
  virtual std::string Decode(std::span<const int32_t> ids) const = 0;
  // The raw vocabulary entry of `id` ("" when out of range).
  std::string_view Piece(int32_t id) const;
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  size_t vocab_size() const { return pieces_.size(); }
  // Whether the model's metadata asks for a BOS at the start of a prompt.
  bool add_bos_default() const { return add_bos_default_; }

 protected:
  std::vector<std::string> pieces_;
  std::unordered_map<std::string, int32_t> index_;  // piece -> first id with it
  std::vector<uint8_t> is_control_;
  int32_t bos_id_ = 1;
  int32_t eos_id_ = 2;
  bool add_bos_default_ = true;
  void BuildIndex();
  // Splits text at control-token matches; fills (text-span, -1) or ({}, id) segments.
  void SplitSpecial(std::string_view text, bool parse_special,
                    std::vector<std::pair<std::string_view, int32_t>>* out) const;
};

class ScoreTokenizer final : public Tokenizer {
 public:
  // llama2.c tokenizer.bin: i32 max_token_length, then vocab_size x (f32 score, i32 len, bytes).
  static Result<std::unique_ptr<ScoreTokenizer>> LoadLlama2c(const std::string& path,
                                                             uint32_t vocab_size);
  // GGUF tokenizer.ggml.model == "llama" (pieces use U+2581 for spaces).
  static Result<std::unique_ptr<ScoreTokenizer>> FromGguf(const GgufFile& gguf);

  std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                              bool parse_special = false) const override;
  std::string Decode(std::span<const int32_t> ids) const override;

 private:
  void EncodeText(std::string_view text, std::vector<int32_t>* out) const;
  int32_t ByteToken(uint8_t byte) const;
  std::vector<float> scores_;
  bool spm_spaces_ = false;  // pieces spell spaces as U+2581
  bool add_space_prefix_ = true;
  std::vector<int32_t> byte_tokens_;  // byte -> id of <0xXX>, -1 if none
};

class BpeTokenizer final : public Tokenizer {
 public:
  static Result<std::unique_ptr<BpeTokenizer>> FromGguf(const GgufFile& gguf);

  std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                              bool parse_special = false) const override;
  std::string Decode(std::span<const int32_t> ids) const override;

  // The pre-tokenizer alone (exposed for tests): byte ranges of `text` split into words.
  static std::vector<std::string_view> PreTokenize(std::string_view text);

 private:
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  std::unordered_map<std::string, int32_t> merge_rank_;  // "left right" -> rank
  int32_t unk_id_ = -1;
};

// Creates the tokenizer that a GGUF file's tokenizer.ggml.* metadata describes.
Result<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufFile& gguf);

}  // namespace tqkv::model

#endif  // TQKV_SRC_MODEL_TOKENIZER_H_
