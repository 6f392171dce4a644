#include "model/model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstring>

namespace tqkv::model {
namespace {

constexpr uint64_t kMaxDim = 1u << 16;
constexpr uint64_t kMaxLayers = 1024;
constexpr uint64_t kMaxVocab = 1u << 22;
constexpr uint64_t kMaxContext = 1u << 24;

std::string Stem(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const size_t dot = base.find_last_of('.');
  if (dot != std::string::npos && dot > 0) base.resize(dot);
  return base;
}

std::string Dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Status CheckConfig(const LlamaConfig& c, const std::string& what) {
  auto bad = [&](const std::string& m) { return Status::Corruption(what + ": " + m); };
  if (c.dim == 0 || c.dim > kMaxDim) return bad("bad dim " + std::to_string(c.dim));
  if (c.hidden_dim == 0 || c.hidden_dim > 16 * kMaxDim)
    return bad("bad hidden_dim " + std::to_string(c.hidden_dim));
  if (c.n_layers == 0 || c.n_layers > kMaxLayers)
    return bad("bad layer count " + std::to_string(c.n_layers));
  if (c.n_heads == 0 || c.n_heads > c.dim)
    return bad("bad head count " + std::to_string(c.n_heads));
  if (c.n_kv_heads == 0 || c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0) {
    return bad("KV head count " + std::to_string(c.n_kv_heads) + " does not divide head count " +
               std::to_string(c.n_heads));
  }
  if (c.head_dim == 0 || c.head_dim > 4096 || c.head_dim % 2 != 0)
    return bad("bad head_dim " + std::to_string(c.head_dim));
  if (c.rope_dim == 0 || c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return bad("bad RoPE dimension count " + std::to_string(c.rope_dim));
  }
  if (c.vocab_size == 0 || c.vocab_size > kMaxVocab)
    return bad("bad vocab size " + std::to_string(c.vocab_size));
  if (c.context_length == 0 || c.context_length > kMaxContext) {
    return bad("bad context length " + std::to_string(c.context_length));
  }
  if (!(c.rope_freq_base > 0.0f) || !(c.norm_eps > 0.0f) || c.norm_eps > 1.0f) {
    return bad("bad RoPE base or norm epsilon");
  }
  return Status::Ok();
}

WeightMatrix F32Matrix(const uint8_t* data, uint64_t rows, uint64_t cols) {
  WeightMatrix m;
  m.type = GgmlType::kF32;
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = cols * 4;
  m.data = data;
  return m;
}

std::vector<float> F32Vector(const uint8_t* data, uint64_t n) {
  std::vector<float> v(n);
  std::memcpy(v.data(), data, n * 4);
  return v;
}

}  // namespace

Result<std::unique_ptr<Model>> Model::Load(const std::string& path,
                                           const ModelLoadOptions& options) {
  TQKV_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  uint32_t magic = 0;
  if (file->size() >= 4) std::memcpy(&magic, file->data(), 4);
  if (magic == kGgufMagic) return LoadGguf(path);
  return LoadLlama2c(path, options);
}

Result<std::unique_ptr<Model>> Model::LoadLlama2c(const std::string& path,
                                                  const ModelLoadOptions& options) {
  TQKV_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  const std::string what = "llama2.c checkpoint " + path;
  if (file->size() < 28) {
    return Status::Corruption(what + ": truncated header (" + std::to_string(file->size()) +
                              " of 28 bytes)");
  }
  int32_t h[7];
  std::memcpy(h, file->data(), sizeof(h));
  for (int i = 0; i < 7; ++i) {
    if (i != 5 && h[i] <= 0) {
      return Status::Corruption(what + ": header field " + std::to_string(i) + " is " +
                                std::to_string(h[i]));
    }
  }
  if (h[5] == 0 || h[5] == INT32_MIN)
    return Status::Corruption(what + ": vocab_size is " + std::to_string(h[5]));
  std::unique_ptr<Model> m(new Model());
  LlamaConfig& c = m->config_;
  c.dim = static_cast<uint32_t>(h[0]);
  c.hidden_dim = static_cast<uint32_t>(h[1]);
  c.n_layers = static_cast<uint32_t>(h[2]);
  c.n_heads = static_cast<uint32_t>(h[3]);
  c.n_kv_heads = static_cast<uint32_t>(h[4]);
  const bool shared = h[5] > 0;
  c.vocab_size = static_cast<uint32_t>(shared ? h[5] : -h[5]);
  c.context_length = static_cast<uint32_t>(h[6]);
  c.head_dim = c.n_heads > 0 && c.dim % c.n_heads == 0 ? c.dim / c.n_heads : 0;
  c.rope_dim = c.head_dim;
  c.rope_freq_base = 10000.0f;
  c.norm_eps = 1e-5f;
  c.rope_layout = RopeLayout::kInterleaved;
  if (c.n_heads == 0 || c.dim % c.n_heads != 0) {
    return Status::Corruption(what + ": dim " + std::to_string(c.dim) +
                              " is not a multiple of the head count " + std::to_string(c.n_heads));
  }
  TQKV_RETURN_IF_ERROR(CheckConfig(c, what));

  const uint64_t dim = c.dim, hid = c.hidden_dim, L = c.n_layers, V = c.vocab_size;
  const uint64_t kv = c.kv_dim(), seq = c.context_length, hs = c.head_dim;
  const uint64_t floats = V * dim + L * dim + L * dim * dim + 2 * L * kv * dim + L * dim * dim +
                          L * dim + 3 * L * hid * dim + dim + seq * hs + (shared ? 0 : V * dim);
  const uint64_t expected = 28 + floats * 4;
  if (file->size() != expected) {
    return Status::Corruption(what + ": file is " + std::to_string(file->size()) +
                              " bytes, the header implies " + std::to_string(expected) +
                              (file->size() < expected ? " (truncated?)" : " (trailing bytes)"));
  }
  const uint8_t* p = file->data() + 28;
  auto take = [&p](uint64_t n) {
    const uint8_t* q = p;
    p += n * 4;
    return q;
  };
  LlamaWeights& w = m->weights_;
  w.token_embd = F32Matrix(take(V * dim), V, dim);
  w.layers.resize(L);
  for (auto& l : w.layers) l.attn_norm = F32Vector(take(dim), dim);
  for (auto& l : w.layers) l.wq = F32Matrix(take(dim * dim), dim, dim);
  for (auto& l : w.layers) l.wk = F32Matrix(take(kv * dim), kv, dim);
  for (auto& l : w.layers) l.wv = F32Matrix(take(kv * dim), kv, dim);
  for (auto& l : w.layers) l.wo = F32Matrix(take(dim * dim), dim, dim);
  for (auto& l : w.layers) l.ffn_norm = F32Vector(take(dim), dim);
  for (auto& l : w.layers) l.w_gate = F32Matrix(take(hid * dim), hid, dim);
  for (auto& l : w.layers) l.w_down = F32Matrix(take(dim * hid), dim, hid);
  for (auto& l : w.layers) l.w_up = F32Matrix(take(hid * dim), hid, dim);
  w.output_norm = F32Vector(take(dim), dim);
  take(seq * hs);  // freq_cis_real and freq_cis_imag (seq x hs/2 each): recomputed instead
  w.tied_output = shared;
  w.output = shared ? w.token_embd : F32Matrix(take(V * dim), V, dim);

  m->format_ = ModelFormat::kLlama2c;
  m->name_ = Stem(path);
  m->file_ = std::move(file);

  std::string tok_path = options.tokenizer_path;
  if (tok_path.empty()) {
    const std::string guess = Dir(path) + "/tok" + std::to_string(c.vocab_size) + ".bin";
    if (FileExists(guess)) tok_path = guess;
  }
  if (!tok_path.empty()) {
    auto tok = ScoreTokenizer::LoadLlama2c(tok_path, c.vocab_size);
    if (!tok.ok()) return tok.status();
    m->tokenizer_ = std::move(tok).value();
  }
  return m;
}

Result<std::unique_ptr<Model>> Model::LoadGguf(const std::string& path) {
  TQKV_ASSIGN_OR_RETURN(auto gguf, GgufFile::Open(path));
  const GgufFile& g = *gguf;
  const std::string what = "GGUF " + path;
  TQKV_ASSIGN_OR_RETURN(std::string arch, g.GetString("general.architecture"));
  if (arch != "llama") {
    return Status::Unsupported(what + ": architecture '" + arch + "' (supported: llama)");
  }
  std::unique_ptr<Model> m(new Model());
  LlamaConfig& c = m->config_;
  auto u32 = [&](const std::string& key, uint64_t fallback, bool required) -> Result<uint32_t> {
    Result<uint64_t> v = required ? g.GetUint(key) : g.GetUintOr(key, fallback);
    if (!v.ok())
      return v.status().IsNotFound() ? Status::Corruption(v.status().message()) : v.status();
    if (*v > UINT32_MAX) return Status::Corruption(what + ": '" + key + "' out of range");
    return static_cast<uint32_t>(*v);
  };
  TQKV_ASSIGN_OR_RETURN(c.n_layers, u32("llama.block_count", 0, true));
  TQKV_ASSIGN_OR_RETURN(c.dim, u32("llama.embedding_length", 0, true));
  TQKV_ASSIGN_OR_RETURN(c.n_heads, u32("llama.attention.head_count", 0, true));
  TQKV_ASSIGN_OR_RETURN(c.n_kv_heads, u32("llama.attention.head_count_kv", c.n_heads, false));
  TQKV_ASSIGN_OR_RETURN(c.hidden_dim, u32("llama.feed_forward_length", 0, true));
  TQKV_ASSIGN_OR_RETURN(c.context_length, u32("llama.context_length", 2048, false));
  if (c.n_heads == 0 || c.dim % c.n_heads != 0) {
    return Status::Corruption(what + ": embedding_length " + std::to_string(c.dim) +
                              " is not a multiple of head_count " + std::to_string(c.n_heads));
  }
  TQKV_ASSIGN_OR_RETURN(c.head_dim, u32("llama.attention.key_length", c.dim / c.n_heads, false));
  TQKV_ASSIGN_OR_RETURN(uint32_t v_len, u32("llama.attention.value_length", c.head_dim, false));
  if (v_len != c.head_dim) return Status::Unsupported(what + ": value_length != key_length");
  TQKV_ASSIGN_OR_RETURN(c.rope_dim, u32("llama.rope.dimension_count", c.head_dim, false));
  TQKV_ASSIGN_OR_RETURN(double base, g.GetDoubleOr("llama.rope.freq_base", 10000.0));
  TQKV_ASSIGN_OR_RETURN(double eps, g.GetDoubleOr("llama.attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_freq_base = static_cast<float>(base);
  c.norm_eps = static_cast<float>(eps);
  c.rope_layout = RopeLayout::kInterleaved;  // llama.cpp's converter permutes Q/K to this layout

  const GgufTensorInfo* emb = g.FindTensor("token_embd.weight");
  if (emb == nullptr) return Status::Corruption(what + ": no tensor token_embd.weight");
  if (emb->ne[1] > UINT32_MAX) return Status::Corruption(what + ": bad vocabulary size");
  c.vocab_size = static_cast<uint32_t>(emb->ne[1]);
  TQKV_RETURN_IF_ERROR(CheckConfig(c, what));
  if (const GgufValue* vs = g.Find("llama.vocab_size")) {
    if (vs->AsUint().value_or(0) != c.vocab_size) {
      return Status::Corruption(what + ": llama.vocab_size disagrees with token_embd.weight");
    }
  }

  auto matrix = [&](const std::string& name, uint64_t cols, uint64_t rows) -> Result<WeightMatrix> {
    const GgufTensorInfo* t = g.FindTensor(name);
    if (t == nullptr) return Status::Corruption(what + ": no tensor " + name);
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1) {
      return Status::Corruption(what + ": tensor " + name + " has shape [" +
                                std::to_string(t->ne[0]) + ", " + std::to_string(t->ne[1]) +
                                ", ...], expected [" + std::to_string(cols) + ", " +
                                std::to_string(rows) + "]");
    }
    const size_t elem_align = t->type == GgmlType::kF32                                   ? 4
                              : (t->type == GgmlType::kF16 || t->type == GgmlType::kBF16) ? 2
                                                                                          : 1;
    if (reinterpret_cast<uintptr_t>(t->data) % elem_align != 0) {
      return Status::Unsupported(what + ": tensor " + name + " data is misaligned");
    }
    WeightMatrix mat;
    mat.type = t->type;
    mat.cols = cols;
    mat.rows = rows;
    mat.row_bytes = *GgmlRowBytes(t->type, cols);
    mat.data = t->data;
    return mat;
  };
  auto vec = [&](const std::string& name, uint64_t n) -> Result<std::vector<float>> {
    const GgufTensorInfo* t = g.FindTensor(name);
    if (t == nullptr) return Status::Corruption(what + ": no tensor " + name);
    if (t->elements != n || t->ne[0] != n) {
      return Status::Corruption(what + ": tensor " + name + " has " + std::to_string(t->elements) +
                                " elements, expected " + std::to_string(n));
    }
    std::vector<float> v(n);
    DequantizeRow(t->type, t->data, n, v.data());
    return v;
  };

  LlamaWeights& w = m->weights_;
  const uint64_t dim = c.dim, qd = c.q_dim(), kv = c.kv_dim(), hid = c.hidden_dim;
  TQKV_ASSIGN_OR_RETURN(w.token_embd, matrix("token_embd.weight", dim, c.vocab_size));
  w.layers.resize(c.n_layers);
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& lw = w.layers[l];
    TQKV_ASSIGN_OR_RETURN(lw.attn_norm, vec(p + "attn_norm.weight", dim));
    TQKV_ASSIGN_OR_RETURN(lw.ffn_norm, vec(p + "ffn_norm.weight", dim));
    TQKV_ASSIGN_OR_RETURN(lw.wq, matrix(p + "attn_q.weight", dim, qd));
    TQKV_ASSIGN_OR_RETURN(lw.wk, matrix(p + "attn_k.weight", dim, kv));
    TQKV_ASSIGN_OR_RETURN(lw.wv, matrix(p + "attn_v.weight", dim, kv));
    TQKV_ASSIGN_OR_RETURN(lw.wo, matrix(p + "attn_output.weight", qd, dim));
    TQKV_ASSIGN_OR_RETURN(lw.w_gate, matrix(p + "ffn_gate.weight", dim, hid));
    TQKV_ASSIGN_OR_RETURN(lw.w_up, matrix(p + "ffn_up.weight", dim, hid));
    TQKV_ASSIGN_OR_RETURN(lw.w_down, matrix(p + "ffn_down.weight", hid, dim));
  }
  TQKV_ASSIGN_OR_RETURN(w.output_norm, vec("output_norm.weight", dim));
  if (g.FindTensor("output.weight") != nullptr) {
    TQKV_ASSIGN_OR_RETURN(w.output, matrix("output.weight", dim, c.vocab_size));
    w.tied_output = false;
  } else {
    w.output = w.token_embd;
    w.tied_output = true;
  }

  if (g.Find("tokenizer.ggml.model") != nullptr) {
    auto tok = TokenizerFromGguf(g);
    if (!tok.ok()) return tok.status().WithContext(what);
    m->tokenizer_ = std::move(tok).value();
  }

  // Name: "<basename>-<size_label>" lowercased (e.g. smollm2-135m), else general.name, else stem.
  auto str = [&](const char* key) -> std::string {
    const GgufValue* v = g.Find(key);
    return v != nullptr && v->type == GgufValueType::kString ? v->str : std::string();
  };
  std::string name = str("general.basename");
  if (!name.empty() && !str("general.size_label").empty()) name += "-" + str("general.size_label");
  if (name.empty()) name = str("general.name");
  if (name.empty()) name = Stem(path);
  for (char& ch : name) {
    ch = ch == ' ' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  }
  m->name_ = name;
  m->format_ = ModelFormat::kGguf;
  m->gguf_ = std::move(gguf);
  return m;
}

}  // namespace tqkv::model
