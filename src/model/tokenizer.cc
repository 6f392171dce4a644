#include "model/tokenizer.h"

#include <array>
#include <climits>
#include <cstdio>
#include <cstring>

#include "model/gguf.h"
#include "model/mapped_file.h"

namespace tqkv::model {
namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581
constexpr uint64_t kMaxVocabEntries = 1u << 22;         // bounds memory for hostile files

// Decodes one UTF-8 sequence at s[i]; returns its length (1 for an invalid byte, cp = ~0u).
size_t DecodeUtf8(std::string_view s, size_t i, uint32_t* cp) {
  const uint8_t c = static_cast<uint8_t>(s[i]);
  size_t len = 0;
  uint32_t v = 0;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    len = 2;
    v = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    v = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    v = c & 0x07;
  } else {
    *cp = ~0u;
    return 1;
  }
  if (i + len > s.size()) {
    *cp = ~0u;
    return 1;
  }
  for (size_t k = 1; k < len; ++k) {
    const uint8_t cc = static_cast<uint8_t>(s[i + k]);
    if ((cc & 0xC0) != 0x80) {
      *cp = ~0u;
      return 1;
    }
    v = (v << 6) | (cc & 0x3F);
  }
  *cp = v;
  return len;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

enum class CpClass { kLetter, kNumber, kSpace, kOther };

bool InRanges(uint32_t cp, std::initializer_list<std::pair<uint32_t, uint32_t>> ranges) {
  for (const auto& r : ranges) {
    if (cp >= r.first && cp <= r.second) return true;
  }
  return false;
}

CpClass Classify(uint32_t cp) {
  if (cp == ~0u) return CpClass::kOther;  // invalid UTF-8 byte
  if (cp < 0x80) {
    if ((cp >= 9 && cp <= 13) || cp == ' ') return CpClass::kSpace;
    if (cp >= '0' && cp <= '9') return CpClass::kNumber;
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CpClass::kLetter;
    return CpClass::kOther;
  }
  if (InRanges(cp, {{0x85, 0x85},
                    {0xA0, 0xA0},
                    {0x1680, 0x1680},
                    {0x2000, 0x200A},
                    {0x2028, 0x2029},
                    {0x202F, 0x202F},
                    {0x205F, 0x205F},
                    {0x3000, 0x3000}})) {
    return CpClass::kSpace;
  }
  if (InRanges(cp, {{0xB2, 0xB3},
                    {0xB9, 0xB9},
                    {0xBC, 0xBE},
                    {0x660, 0x669},
                    {0x6F0, 0x6F9},
                    {0x966, 0x96F},
                    {0x2070, 0x2070},
                    {0x2074, 0x2079},
                    {0x2080, 0x2089},
                    {0x2150, 0x2189},
                    {0x2460, 0x249B},
                    {0x2776, 0x2793},
                    {0x3007, 0x3007},
                    {0x3021, 0x3029},
                    {0xFF10, 0xFF19}})) {
    return CpClass::kNumber;
  }
  if (cp == 0xAA || cp == 0xB5 || cp == 0xBA) return CpClass::kLetter;
  if (InRanges(cp, {{0x80, 0xBF},      {0xD7, 0xD7},     {0xF7, 0xF7},     {0x300, 0x36F},
                    {0x2010, 0x2027},  {0x200B, 0x200F}, {0x2030, 0x205E}, {0x2060, 0x206F},
                    {0x20A0, 0x20FF},  {0x2100, 0x214F}, {0x2190, 0x245F}, {0x2500, 0x2775},
                    {0x2794, 0x2BFF},  {0x3001, 0x3006}, {0x3008, 0x3020}, {0x3030, 0x303F},
                    {0xE000, 0xF8FF},  {0xFE00, 0xFE0F}, {0xFE30, 0xFE4F}, {0xFEFF, 0xFEFF},
                    {0xFF01, 0xFF0F},  {0xFF1A, 0xFF20}, {0xFF3B, 0xFF40}, {0xFF5B, 0xFF65},
                    {0x1F000, 0x1FAFF}})) {
    return CpClass::kOther;
  }
  return CpClass::kLetter;
}

// GPT-2 byte <-> unicode mapping: printable bytes map to themselves, the others to 256 + n.
struct ByteUnicode {
  std::array<std::string, 256> byte_to_str;
  std::array<int16_t, 512> cp_to_byte;  // -1 if not a mapped codepoint
  ByteUnicode() {
    cp_to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      AppendUtf8(cp, &byte_to_str[b]);
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteUnicode& ByteMap() {
  static const ByteUnicode m;
  return m;
}

// A token id from metadata `key` (fallback when absent); Corruption when not an id < n.
Result<int32_t> ReadTokenId(const GgufFile& gguf, std::string_view key, int32_t fallback,
                            size_t n) {
  const GgufValue* v = gguf.Find(key);
  if (v == nullptr) return fallback;
  const auto i = v->AsInt();
  if (!i || *i < -1 || *i >= static_cast<int64_t>(n)) {
    return Status::Corruption("GGUF: " + std::string(key) + " is not a token id < " +
                              std::to_string(n));
  }
  return static_cast<int32_t>(*i);
}

// The vocabulary (tokenizer.ggml.tokens), bounded so a hostile file cannot make it huge.
Result<std::vector<std::string>> ReadTokenPieces(const GgufFile& gguf) {
  const GgufValue* toks = gguf.Find("tokenizer.ggml.tokens");
  if (toks == nullptr || toks->type != GgufValueType::kArray ||
      toks->elem_type != GgufValueType::kString || toks->count == 0 ||
      toks->count > kMaxVocabEntries) {
    return Status::Corruption(
        "GGUF: tokenizer.ggml.tokens missing, empty, too long or not an array of strings");
  }
  std::vector<std::string> pieces;
  pieces.reserve(toks->count);
  for (std::string_view v : toks->ArrayStrings()) pieces.emplace_back(v);
  return pieces;
}

// Control and user-defined tokens (token_type 3 or 4) never come out of text.
void MarkControlTokens(const GgufFile& gguf, std::vector<uint8_t>& is_control) {
  const GgufValue* types = gguf.Find("tokenizer.ggml.token_type");
  if (types == nullptr || types->type != GgufValueType::kArray ||
      types->count != is_control.size()) {
    return;
  }
  for (size_t i = 0; i < is_control.size(); ++i) {
    const int64_t ty = types->ArrayElement(i).AsInt().value_or(1);
    is_control[i] = (ty == 3 || ty == 4) ? 1 : 0;
  }
}

}  // namespace

std::string_view Tokenizer::Piece(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return {};
  return pieces_[id];
}

void Tokenizer::BuildIndex() {
  index_.clear();
  index_.reserve(pieces_.size() * 2);
  for (size_t i = 0; i < pieces_.size(); ++i) index_.emplace(pieces_[i], static_cast<int32_t>(i));
  is_control_.resize(pieces_.size(), 0);
}

void Tokenizer::SplitSpecial(std::string_view text, bool parse_special,
                             std::vector<std::pair<std::string_view, int32_t>>* out) const {
  out->clear();
  std::vector<int32_t> specials;
  if (parse_special) {
    for (size_t i = 0; i < pieces_.size(); ++i) {
      if (is_control_[i] && !pieces_[i].empty()) specials.push_back(static_cast<int32_t>(i));
    }
  }
  if (specials.empty()) {
    if (!text.empty()) out->emplace_back(text, -1);
    return;
  }
  size_t start = 0, i = 0;
  while (i < text.size()) {
    int32_t best = -1;
    size_t best_len = 0;
    for (int32_t id : specials) {
      const std::string& p = pieces_[id];
      if (p.size() > best_len && text.compare(i, p.size(), p) == 0) {
        best = id;
        best_len = p.size();
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    if (i > start) out->emplace_back(text.substr(start, i - start), -1);
    out->emplace_back(std::string_view(), best);
    i += best_len;
    start = i;
  }
  if (start < text.size()) out->emplace_back(text.substr(start), -1);
}

// ---------------------------------------------------------------------------------------------
// ScoreTokenizer

Result<std::unique_ptr<ScoreTokenizer>> ScoreTokenizer::LoadLlama2c(const std::string& path,
                                                                    uint32_t vocab_size) {
  TQKV_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  const uint8_t* d = file->data();
  const size_t size = file->size();
  auto corrupt = [&](size_t off, const std::string& what) {
    return Status::Corruption("tokenizer " + path + " at offset " + std::to_string(off) + ": " +
                              what);
  };
  if (size < 4) return corrupt(0, "truncated header");
  int32_t max_len = 0;
  std::memcpy(&max_len, d, 4);
  if (max_len <= 0) return corrupt(0, "bad max_token_length " + std::to_string(max_len));
  if (vocab_size == 0 || vocab_size > kMaxVocabEntries) {
    return Status::InvalidArgument("tokenizer " + path + ": bad vocab size " +
                                   std::to_string(vocab_size));
  }
  std::unique_ptr<ScoreTokenizer> t(new ScoreTokenizer());
  t->pieces_.reserve(vocab_size);
  t->scores_.reserve(vocab_size);
  size_t off = 4;
  for (uint32_t i = 0; i < vocab_size; ++i) {
    if (size - off < 8) {
      return corrupt(off, "truncated: token " + std::to_string(i) + " of " +
                              std::to_string(vocab_size) + " missing");
    }
    float score;
    int32_t len;
    std::memcpy(&score, d + off, 4);
    std::memcpy(&len, d + off + 4, 4);
    off += 8;
    if (len < 0 || len > max_len || static_cast<size_t>(len) > size - off) {
      return corrupt(off - 4,
                     "bad length " + std::to_string(len) + " of token " + std::to_string(i));
    }
    t->pieces_.emplace_back(reinterpret_cast<const char*>(d + off), static_cast<size_t>(len));
    t->scores_.push_back(score);
    off += len;
  }
  t->BuildIndex();
  t->bos_id_ = 1;
  t->eos_id_ = 2;
  if (vocab_size > 1) t->is_control_[1] = 1;
  if (vocab_size > 2) t->is_control_[2] = 1;
  t->add_bos_default_ = true;
  t->byte_tokens_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = t->index_.find(name);
    if (it != t->index_.end()) t->byte_tokens_[b] = it->second;
  }
  return t;
}

Result<std::unique_ptr<ScoreTokenizer>> ScoreTokenizer::FromGguf(const GgufFile& gguf) {
  const GgufValue* scores = gguf.Find("tokenizer.ggml.scores");
  std::unique_ptr<ScoreTokenizer> t(new ScoreTokenizer());
  TQKV_ASSIGN_OR_RETURN(t->pieces_, ReadTokenPieces(gguf));
  t->scores_.assign(t->pieces_.size(), 0.0f);
  if (scores != nullptr && scores->type == GgufValueType::kArray &&
      scores->count == t->pieces_.size()) {
    for (size_t i = 0; i < t->pieces_.size(); ++i) {
      t->scores_[i] = static_cast<float>(scores->ArrayElement(i).AsDouble().value_or(0.0));
    }
  }
  t->BuildIndex();
  MarkControlTokens(gguf, t->is_control_);
  const size_t n = t->pieces_.size();
  TQKV_ASSIGN_OR_RETURN(t->bos_id_,
                        ReadTokenId(gguf, "tokenizer.ggml.bos_token_id", n > 1 ? 1 : -1, n));
  TQKV_ASSIGN_OR_RETURN(t->eos_id_,
                        ReadTokenId(gguf, "tokenizer.ggml.eos_token_id", n > 2 ? 2 : -1, n));
  const GgufValue* add_bos = gguf.Find("tokenizer.ggml.add_bos_token");
  t->add_bos_default_ = add_bos == nullptr || add_bos->type != GgufValueType::kBool || add_bos->b;
  t->spm_spaces_ = true;
  const GgufValue* prefix = gguf.Find("tokenizer.ggml.add_space_prefix");
  t->add_space_prefix_ = prefix == nullptr || prefix->type != GgufValueType::kBool || prefix->b;
  t->byte_tokens_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = t->index_.find(name);
    if (it != t->index_.end()) t->byte_tokens_[b] = it->second;
  }
  return t;
}

int32_t ScoreTokenizer::ByteToken(uint8_t byte) const {
  if (byte_tokens_[byte] >= 0) return byte_tokens_[byte];
  return 0;  // <unk>
}

void ScoreTokenizer::EncodeText(std::string_view raw, std::vector<int32_t>* out) const {
  if (raw.empty()) return;
  std::string text;
  if (spm_spaces_) {
    if (add_space_prefix_) text.append(kSpmSpace);
    for (char c : raw) {
      if (c == ' ') {
        text.append(kSpmSpace);
      } else {
        text.push_back(c);
      }
    }
  } else {
    text.reserve(raw.size() + 1);
    if (add_space_prefix_) text.push_back(' ');  // llama2.c's dummy prefix
    text.append(raw);
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    const size_t len = DecodeUtf8(text, i, &cp);
    auto it = index_.find(std::string(text.substr(i, len)));
    if (it != index_.end()) {
      ids.push_back(it->second);
    } else {
      for (size_t k = 0; k < len; ++k) ids.push_back(ByteToken(static_cast<uint8_t>(text[i + k])));
    }
    i += len;
  }
  // Greedy merges: repeatedly merge the adjacent pair whose concatenation has the best score.
  std::string merged;
  for (;;) {
    float best_score = -1e10f;
    int32_t best_id = -1;
    size_t best_idx = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      merged.assign(pieces_[ids[i]]).append(pieces_[ids[i + 1]]);
      auto it = index_.find(merged);
      if (it != index_.end() && scores_[it->second] > best_score) {
        best_score = scores_[it->second];
        best_id = it->second;
        best_idx = i;
      }
    }
    if (best_id < 0) break;
    ids[best_idx] = best_id;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best_idx) + 1);
  }
  out->insert(out->end(), ids.begin(), ids.end());
}

std::vector<int32_t> ScoreTokenizer::Encode(std::string_view text, bool add_bos,
                                            bool parse_special) const {
  std::vector<int32_t> out;
  if (add_bos) out.push_back(bos_id_);
  std::vector<std::pair<std::string_view, int32_t>> segs;
  SplitSpecial(text, parse_special, &segs);
  for (const auto& [seg, id] : segs) {
    if (id >= 0) {
      out.push_back(id);
    } else {
      EncodeText(seg, &out);
    }
  }
  return out;
}

std::string ScoreTokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    if (id == bos_id_ || id == eos_id_) continue;
    const std::string_view p = Piece(id);
    std::string text;
    unsigned byte = 0;
    if (p.size() == 6 && p.substr(0, 3) == "<0x" && p[5] == '>' &&
        std::sscanf(std::string(p).c_str(), "<0x%02X>", &byte) == 1) {
      text.push_back(static_cast<char>(byte));
    } else if (spm_spaces_) {
      for (size_t i = 0; i < p.size();) {
        if (p.substr(i, kSpmSpace.size()) == kSpmSpace) {
          text.push_back(' ');
          i += kSpmSpace.size();
        } else {
          text.push_back(p[i++]);
        }
      }
    } else {
      text.assign(p);
    }
    if (first && add_space_prefix_ && !text.empty() && text[0] == ' ') text.erase(0, 1);
    first = false;
    out += text;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// BpeTokenizer

Result<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromGguf(const GgufFile& gguf) {
  const GgufValue* merges = gguf.Find("tokenizer.ggml.merges");
  if (merges == nullptr || merges->type != GgufValueType::kArray ||
      merges->elem_type != GgufValueType::kString || merges->count > kMaxVocabEntries) {
    return Status::Corruption("GGUF: tokenizer.ggml.merges missing or not an array of strings");
  }
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  TQKV_ASSIGN_OR_RETURN(t->pieces_, ReadTokenPieces(gguf));
  t->BuildIndex();
  MarkControlTokens(gguf, t->is_control_);
  const std::vector<std::string_view> merge_list = merges->ArrayStrings();
  t->merge_rank_.reserve(merge_list.size() * 2);
  for (size_t i = 0; i < merge_list.size(); ++i) {
    t->merge_rank_.emplace(std::string(merge_list[i]), static_cast<int32_t>(i));
  }
  const size_t n = t->pieces_.size();
  TQKV_ASSIGN_OR_RETURN(t->bos_id_, ReadTokenId(gguf, "tokenizer.ggml.bos_token_id", -1, n));
  TQKV_ASSIGN_OR_RETURN(t->eos_id_, ReadTokenId(gguf, "tokenizer.ggml.eos_token_id", -1, n));
  TQKV_ASSIGN_OR_RETURN(t->unk_id_, ReadTokenId(gguf, "tokenizer.ggml.unknown_token_id", -1, n));
  const GgufValue* add_bos = gguf.Find("tokenizer.ggml.add_bos_token");
  t->add_bos_default_ = add_bos != nullptr && add_bos->type == GgufValueType::kBool && add_bos->b;
  return t;
}

std::vector<std::string_view> BpeTokenizer::PreTokenize(std::string_view text) {
  struct Cp {
    uint32_t cp;
    CpClass cls;
    size_t off;
  };
  std::vector<Cp> cps;
  cps.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    const size_t len = DecodeUtf8(text, i, &cp);
    cps.push_back({cp, Classify(cp), i});
    i += len;
  }
  const size_t n = cps.size();
  auto off = [&](size_t k) { return k < n ? cps[k].off : text.size(); };
  std::vector<std::string_view> words;
  auto emit = [&](size_t a, size_t b) { words.push_back(text.substr(off(a), off(b) - off(a))); };

  // Pass 1 ("\p{N}"): every number codepoint is its own chunk; pass 2 splits the rest (GPT-2).
  size_t i = 0;
  while (i < n) {
    if (cps[i].cls == CpClass::kNumber) {
      emit(i, i + 1);
      ++i;
      continue;
    }
    size_t chunk_end = i;
    while (chunk_end < n && cps[chunk_end].cls != CpClass::kNumber) ++chunk_end;
    while (i < chunk_end) {
      const uint32_t c = cps[i].cp;
      if (c == '\'' && i + 1 < chunk_end) {
        const uint32_t c1 = cps[i + 1].cp;
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
          emit(i, i + 2);
          i += 2;
          continue;
        }
        if (i + 2 < chunk_end) {
          const uint32_t c2 = cps[i + 2].cp;
          if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
            emit(i, i + 3);
            i += 3;
            continue;
          }
        }
      }
      size_t j = i;
      if (c == ' ' && i + 1 < chunk_end && cps[i + 1].cls != CpClass::kSpace) j = i + 1;
      const CpClass cls = cps[j].cls;
      if (cls == CpClass::kLetter || cls == CpClass::kNumber || cls == CpClass::kOther) {
        size_t k = j;
        while (k < chunk_end && cps[k].cls == cls) ++k;
        emit(i, k);
        i = k;
        continue;
      }
      // Whitespace: \s+(?!\S) then \s+.
      size_t k = i;
      while (k < chunk_end && cps[k].cls == CpClass::kSpace) ++k;
      if (k < chunk_end && k - i >= 2) {
        emit(i, k - 1);
        i = k - 1;
      } else {
        emit(i, k);
        i = k;
      }
    }
  }
  return words;
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  const ByteUnicode& bm = ByteMap();
  std::vector<std::string> syms;
  syms.reserve(word.size());
  for (char c : word) syms.push_back(bm.byte_to_str[static_cast<uint8_t>(c)]);
  std::string key;
  while (syms.size() > 1) {
    int32_t best_rank = INT32_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      key.assign(syms[i]).append(" ").append(syms[i + 1]);
      auto it = merge_rank_.find(key);
      if (it != merge_rank_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == INT32_MAX) break;
    syms[best] += syms[best + 1];
    syms.erase(syms.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  for (const auto& s : syms) {
    auto it = index_.find(s);
    if (it != index_.end()) {
      out->push_back(it->second);
      continue;
    }
    // Not in the vocabulary (a damaged vocabulary): fall back to single byte symbols.
    for (size_t i = 0; i < s.size();) {
      uint32_t cp;
      const size_t len = DecodeUtf8(s, i, &cp);
      auto jt = index_.find(s.substr(i, len));
      if (jt != index_.end()) {
        out->push_back(jt->second);
      } else if (unk_id_ >= 0) {
        out->push_back(unk_id_);
      }
      i += len;
    }
  }
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, bool add_bos,
                                          bool parse_special) const {
  std::vector<int32_t> out;
  if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  std::vector<std::pair<std::string_view, int32_t>> segs;
  SplitSpecial(text, parse_special, &segs);
  for (const auto& [seg, id] : segs) {
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (std::string_view w : PreTokenize(seg)) EncodeWord(w, &out);
  }
  return out;
}

std::string BpeTokenizer::Decode(std::span<const int32_t> ids) const {
  const ByteUnicode& bm = ByteMap();
  std::string out;
  for (int32_t id : ids) {
    const std::string_view p = Piece(id);
    if (!p.empty() && is_control_[static_cast<size_t>(id)]) {
      out.append(p);
      continue;
    }
    for (size_t i = 0; i < p.size();) {
      uint32_t cp;
      const size_t len = DecodeUtf8(p, i, &cp);
      if (cp < bm.cp_to_byte.size() && bm.cp_to_byte[cp] >= 0) {
        out.push_back(static_cast<char>(bm.cp_to_byte[cp]));
      } else {
        out.append(p.substr(i, len));
      }
      i += len;
    }
  }
  return out;
}

Result<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufFile& gguf) {
  const GgufValue* model = gguf.Find("tokenizer.ggml.model");
  if (model == nullptr) return Status::NotFound("GGUF: no tokenizer.ggml.model");
  if (model->type != GgufValueType::kString) {
    return Status::Corruption("GGUF: tokenizer.ggml.model is not a string");
  }
  if (model->str == "gpt2") {
    TQKV_ASSIGN_OR_RETURN(auto t, BpeTokenizer::FromGguf(gguf));
    return std::unique_ptr<Tokenizer>(std::move(t));
  }
  if (model->str == "llama") {
    TQKV_ASSIGN_OR_RETURN(auto t, ScoreTokenizer::FromGguf(gguf));
    return std::unique_ptr<Tokenizer>(std::move(t));
  }
  return Status::Unsupported("GGUF: tokenizer model '" + model->str + "' (supported: gpt2, llama)");
}

}  // namespace tqkv::model
