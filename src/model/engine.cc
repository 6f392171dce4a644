#include "model/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tqkv/types.h"

namespace tqkv::model {
namespace {

constexpr size_t kTokenTile = 64;  // activation rows kept hot in cache while rows stream by
constexpr size_t kRowGrain = 16;   // weight rows per ParallelFor piece (at least)

// out = weight * (x / rms(x)), like llama2.c; fixed sequential order.
void RmsNorm(const float* x, const float* weight, size_t n, float eps, float* out) {
  float ss = 0.0f;
  for (size_t j = 0; j < n; ++j) ss = ss + x[j] * x[j];
  ss = ss / static_cast<float>(n);
  ss = ss + eps;
  const float s = 1.0f / std::sqrt(ss);
  for (size_t j = 0; j < n; ++j) out[j] = weight[j] * (s * x[j]);
}

}  // namespace

const char* ActivationPrecisionName(ActivationPrecision a) {
  return a == ActivationPrecision::kF32 ? "f32" : "q8";
}

LlamaEngine::LlamaEngine(const Model& model, const LlamaConfig& config)
    : model_(model), config_(config) {}

LlamaEngine::~LlamaEngine() = default;

Result<std::unique_ptr<LlamaEngine>> LlamaEngine::Create(const Model& model,
                                                         const EngineOptions& options) {
  LlamaConfig config = model.config();
  if (options.rope_layout) config.rope_layout = *options.rope_layout;
  std::unique_ptr<LlamaEngine> e(new LlamaEngine(model, config));
  e->kernels_ = &ActiveModelKernels();
  e->activations_ = options.activations;
  if (options.pool != nullptr) {
    e->pool_ = options.pool;
  } else {
    e->own_pool_ = std::make_unique<ThreadPool>(options.threads);
    e->pool_ = e->own_pool_.get();
  }
  e->max_tokens_ = options.max_tokens != 0 ? options.max_tokens : config.context_length;
  if (e->max_tokens_ > (1u << 24)) {
    return Status::InvalidArgument("EngineOptions.max_tokens " + std::to_string(e->max_tokens_) +
                                   " is too large");
  }
  e->prefill_chunk_ = std::clamp<uint32_t>(options.prefill_chunk, 1, 4096);
  const size_t c = e->prefill_chunk_;
  const size_t dim = config.dim, qd = config.q_dim(), kv = config.kv_dim();
  const size_t hid = config.hidden_dim;
  const size_t widest = std::max({dim, qd, hid});
  e->x_.resize(c * dim);
  e->xb_.resize(c * std::max(dim, qd));
  e->q_.resize(c * qd);
  e->k_.resize(c * kv);
  e->v_.resize(c * kv);
  e->att_.resize(c * qd);
  e->hb_.resize(c * hid);
  e->hb2_.resize(c * hid);
  e->xq_.resize((c + 3) / 4 * (widest / kQkBlock + 1));
  e->k_cache_.resize(config.n_layers);
  e->v_cache_.resize(config.n_layers);
  e->inv_freq_.resize(config.rope_dim / 2);
  for (size_t i = 0; i < config.rope_dim / 2; ++i) {
    e->inv_freq_[i] = static_cast<float>(
        std::pow(static_cast<double>(config.rope_freq_base),
                 -static_cast<double>(2 * i) / static_cast<double>(config.rope_dim)));
  }
  return e;
}

Status LlamaEngine::EnsureCapacity(uint64_t tokens) {
  if (tokens > max_tokens_) {
    return Status::InvalidArgument("LlamaEngine: " + std::to_string(tokens) +
                                   " tokens exceed max_tokens " + std::to_string(max_tokens_));
  }
  if (tokens <= capacity_) return Status::Ok();
  uint64_t cap = std::max<uint64_t>({tokens, capacity_ * 2, 256});
  cap = std::min<uint64_t>(cap, max_tokens_);
  const size_t kv = config_.kv_dim();
  for (uint32_t l = 0; l < config_.n_layers; ++l) {
    k_cache_[l].resize(cap * kv);
    v_cache_[l].resize(cap * kv);
  }
  capacity_ = cap;
  return Status::Ok();
}

void LlamaEngine::MatMul(const WeightMatrix& w, const float* x, size_t n_tokens, float* out,
                         bool x_is_quantized) {
  const size_t rows = w.rows, cols = w.cols;
  const ModelKernels& k = *kernels_;
  if (activations_ == ActivationPrecision::kF32) {
    if (QuantDotF32Fn fdot = k.quant_dot_f32(w.type)) {
      const size_t nb = cols / kQkBlock;
      ParallelFor(pool_, rows, kRowGrain, [&](size_t r0, size_t r1) {
        for (size_t t0 = 0; t0 < n_tokens; t0 += kTokenTile) {
          const size_t tt = std::min(kTokenTile, n_tokens - t0);
          for (size_t r = r0; r < r1; ++r) {
            fdot(w.row(r), nb, x + t0 * cols, cols, tt, out + t0 * rows + r, rows);
          }
        }
      });
      return;
    }
  } else if (QuantDotFn qdot = k.quant_dot(w.type)) {
    const size_t nb = cols / kQkBlock;
    const size_t groups = (n_tokens + 3) / 4;
    BlockQ8x4* xq = xq_.data();
    if (!x_is_quantized) {
      ParallelFor(pool_, groups, 4, [&](size_t g0, size_t g1) {
        for (size_t g = g0; g < g1; ++g) {
          k.quantize_x4(x + 4 * g * cols, cols, std::min<size_t>(4, n_tokens - 4 * g), cols,
                        xq + g * nb);
        }
      });
    }
    ParallelFor(pool_, rows, kRowGrain, [&](size_t r0, size_t r1) {
      for (size_t t0 = 0; t0 < n_tokens; t0 += kTokenTile) {
        const size_t tt = std::min(kTokenTile, n_tokens - t0);
        for (size_t r = r0; r < r1; ++r) {
          qdot(w.row(r), xq + (t0 / 4) * nb, nb, tt, out + t0 * rows + r, rows);
        }
      }
    });
    return;
  }
  ParallelFor(pool_, rows, kRowGrain, [&](size_t r0, size_t r1) {
    for (size_t t0 = 0; t0 < n_tokens; t0 += kTokenTile) {
      const size_t t1 = std::min(n_tokens, t0 + kTokenTile);
      for (size_t r = r0; r < r1; ++r) {
        const uint8_t* wr = w.row(r);
        for (size_t t = t0; t < t1; ++t) {
          const float* xt = x + t * cols;
          float v;
          switch (w.type) {
            case GgmlType::kF32:
              v = k.dot_f32(reinterpret_cast<const float*>(wr), xt, cols);
              break;
            case GgmlType::kF16:
              v = k.dot_f16(reinterpret_cast<const uint16_t*>(wr), xt, cols);
              break;
            default:
              v = k.dot_bf16(reinterpret_cast<const uint16_t*>(wr), xt, cols);
              break;
          }
          out[t * rows + r] = v;
        }
      }
    }
  });
}

void LlamaEngine::Attention(uint32_t layer, size_t n_tokens, uint64_t pos0) {
  const size_t hd = config_.head_dim, n_heads = config_.n_heads, kv = config_.kv_dim();
  const size_t group = config_.n_heads / config_.n_kv_heads;
  const size_t qd = config_.q_dim();
  const uint16_t* kc = k_cache_[layer].data();
  const uint16_t* vc = v_cache_[layer].data();
  const float scale = std::sqrt(static_cast<float>(hd));
  const ModelKernels& k = *kernels_;
  ParallelFor(pool_, n_tokens * n_heads, 1, [&](size_t i0, size_t i1) {
    std::vector<float> scores(pos0 + n_tokens);
    for (size_t item = i0; item < i1; ++item) {
      const size_t t = item / n_heads, h = item % n_heads;
      const size_t kvh = h / group;
      const uint64_t pos = pos0 + t;
      const float* q = q_.data() + t * qd + h * hd;
      const size_t n_keys = pos + 1;
      k.dot_f16_rows(kc + kvh * hd, kv, n_keys, q, hd, scores.data());
      k.softmax(scores.data(), n_keys, scale);
      k.weighted_sum_f16(scores.data(), vc + kvh * hd, kv, n_keys, hd,
                         att_.data() + t * qd + h * hd);
    }
  });
}

Status LlamaEngine::Run(std::span<const int32_t> tokens, std::vector<float>* logits) {
  const size_t n = tokens.size();
  const LlamaConfig& c = config_;
  const LlamaWeights& w = model_.weights();
  const size_t dim = c.dim, qd = c.q_dim(), kv = c.kv_dim(), hid = c.hidden_dim;
  const size_t hd = c.head_dim, half = c.rope_dim / 2;
  const uint64_t pos0 = position_;
  TQKV_RETURN_IF_ERROR(EnsureCapacity(pos0 + n));

  for (size_t t = 0; t < n; ++t) {
    DequantizeRow(w.token_embd.type, w.token_embd.row(static_cast<uint64_t>(tokens[t])), dim,
                  x_.data() + t * dim);
  }
  // RoPE angles per token: cos/sin of pos * inv_freq[i], computed in double, rounded to float.
  std::vector<float> cos_t(n * half), sin_t(n * half);
  for (size_t t = 0; t < n; ++t) {
    for (size_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(pos0 + t) * static_cast<double>(inv_freq_[i]);
      cos_t[t * half + i] = static_cast<float>(std::cos(a));
      sin_t[t * half + i] = static_cast<float>(std::sin(a));
    }
  }
  auto rope = [&](float* vec, size_t t) {
    const float* cs = cos_t.data() + t * half;
    const float* sn = sin_t.data() + t * half;
    for (size_t i = 0; i < half; ++i) {
      const size_t a = c.rope_layout == RopeLayout::kInterleaved ? 2 * i : i;
      const size_t b = c.rope_layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + half;
      const float x0 = vec[a], x1 = vec[b];
      vec[a] = x0 * cs[i] - x1 * sn[i];
      vec[b] = x0 * sn[i] + x1 * cs[i];
    }
  };

  for (uint32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    for (size_t t = 0; t < n; ++t) {
      RmsNorm(x_.data() + t * dim, lw.attn_norm.data(), dim, c.norm_eps, xb_.data() + t * dim);
    }
    MatMul(lw.wq, xb_.data(), n, q_.data());
    MatMul(lw.wk, xb_.data(), n, k_.data(), lw.wk.type == lw.wq.type);
    MatMul(lw.wv, xb_.data(), n, v_.data(), lw.wv.type == lw.wq.type);
    uint16_t* kc = k_cache_[l].data();
    uint16_t* vc = v_cache_[l].data();
    for (size_t t = 0; t < n; ++t) {
      for (size_t h = 0; h < c.n_heads; ++h) rope(q_.data() + t * qd + h * hd, t);
      for (size_t h = 0; h < c.n_kv_heads; ++h) rope(k_.data() + t * kv + h * hd, t);
      for (size_t j = 0; j < kv; ++j) {
        kc[(pos0 + t) * kv + j] = FloatToHalf(k_[t * kv + j]);
        vc[(pos0 + t) * kv + j] = FloatToHalf(v_[t * kv + j]);
      }
    }
    Attention(l, n, pos0);
    MatMul(lw.wo, att_.data(), n, xb_.data());
    for (size_t i = 0; i < n * dim; ++i) x_[i] = x_[i] + xb_[i];
    for (size_t t = 0; t < n; ++t) {
      RmsNorm(x_.data() + t * dim, lw.ffn_norm.data(), dim, c.norm_eps, xb_.data() + t * dim);
    }
    MatMul(lw.w_gate, xb_.data(), n, hb_.data());
    MatMul(lw.w_up, xb_.data(), n, hb2_.data(), lw.w_up.type == lw.w_gate.type);
    for (size_t i = 0; i < n * hid; ++i) {
      float g = hb_[i];
      g = g * (1.0f / (1.0f + std::exp(-g)));
      hb_[i] = g * hb2_[i];
    }
    MatMul(lw.w_down, hb_.data(), n, xb_.data());
    for (size_t i = 0; i < n * dim; ++i) x_[i] = x_[i] + xb_[i];
  }
  position_ = pos0 + n;
  if (logits != nullptr) {
    RmsNorm(x_.data() + (n - 1) * dim, w.output_norm.data(), dim, c.norm_eps, xb_.data());
    logits->assign(c.vocab_size, 0.0f);
    MatMul(w.output, xb_.data(), 1, logits->data());
  }
  return Status::Ok();
}

Result<std::vector<float>> LlamaEngine::Prefill(std::span<const int32_t> tokens) {
  if (tokens.empty()) return Status::InvalidArgument("LlamaEngine::Prefill: no tokens");
  for (int32_t t : tokens) {
    if (t < 0 || static_cast<uint32_t>(t) >= config_.vocab_size) {
      return Status::InvalidArgument("LlamaEngine: token id " + std::to_string(t) +
                                     " out of range [0, " + std::to_string(config_.vocab_size) +
                                     ")");
    }
  }
  if (position_ + tokens.size() > max_tokens_) {
    return Status::InvalidArgument("LlamaEngine: " + std::to_string(position_ + tokens.size()) +
                                   " tokens exceed max_tokens " + std::to_string(max_tokens_));
  }
  std::vector<float> logits;
  for (size_t i = 0; i < tokens.size(); i += prefill_chunk_) {
    const size_t n = std::min<size_t>(prefill_chunk_, tokens.size() - i);
    const bool last = i + n == tokens.size();
    TQKV_RETURN_IF_ERROR(Run(tokens.subspan(i, n), last ? &logits : nullptr));
  }
  return logits;
}

Result<std::vector<float>> LlamaEngine::Forward(int32_t token) {
  return Prefill(std::span<const int32_t>(&token, 1));
}

KvCache LlamaEngine::CacheView() const {
  KvCache cache(model_.name(), config_.geometry(), DType::kF16, position_);
  for (uint32_t l = 0; l < config_.n_layers; ++l) {
    cache.SetLayer(l, const_cast<uint16_t*>(k_cache_[l].data()),
                   const_cast<uint16_t*>(v_cache_[l].data()));
  }
  return cache;
}

Result<std::unique_ptr<KvCacheBuffer>> LlamaEngine::ExportCache() const {
  TQKV_ASSIGN_OR_RETURN(
      auto buf, KvCacheBuffer::Allocate(model_.name(), config_.geometry(), DType::kF16, position_));
  const size_t bytes = buf->cache().tensor_bytes();
  for (uint32_t l = 0; l < config_.n_layers && bytes > 0; ++l) {
    std::memcpy(buf->cache().k(l), k_cache_[l].data(), bytes);
    std::memcpy(buf->cache().v(l), v_cache_[l].data(), bytes);
  }
  return buf;
}

Status LlamaEngine::ImportCache(const KvCache& cache) {
  if (!(cache.geometry() == config_.geometry())) {
    const ModelGeometry& g = cache.geometry();
    return Status::InvalidArgument(
        "LlamaEngine::ImportCache: cache geometry (" + std::to_string(g.layers) + " layers, " +
        std::to_string(g.kv_heads) + " KV heads, head_dim " + std::to_string(g.head_dim) +
        ") does not match the model (" + std::to_string(config_.n_layers) + ", " +
        std::to_string(config_.n_kv_heads) + ", " + std::to_string(config_.head_dim) + ")");
  }
  TQKV_RETURN_IF_ERROR(cache.Validate());
  if (cache.tokens() > max_tokens_) {
    return Status::InvalidArgument("LlamaEngine::ImportCache: " + std::to_string(cache.tokens()) +
                                   " tokens exceed max_tokens " + std::to_string(max_tokens_));
  }
  TQKV_RETURN_IF_ERROR(EnsureCapacity(cache.tokens()));
  const size_t elems = cache.tokens() * config_.kv_dim();
  for (uint32_t l = 0; l < config_.n_layers && elems > 0; ++l) {
    for (int kvi = 0; kvi < 2; ++kvi) {
      uint16_t* dst = (kvi == 0 ? k_cache_ : v_cache_)[l].data();
      const void* src = cache.tensor(l, kvi);
      if (cache.dtype() == DType::kF16) {
        std::memcpy(dst, src, elems * 2);
      } else {
        for (size_t i = 0; i < elems; ++i) dst[i] = FloatToHalf(LoadAsFloat(src, cache.dtype(), i));
      }
    }
  }
  position_ = cache.tokens();
  return Status::Ok();
}

int32_t ArgMax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

Result<std::vector<int32_t>> GenerateGreedy(LlamaEngine& engine, std::span<const int32_t> prompt,
                                            size_t n, int32_t stop_token) {
  TQKV_ASSIGN_OR_RETURN(std::vector<float> logits, engine.Prefill(prompt));
  std::vector<int32_t> out;
  for (size_t i = 0; i < n; ++i) {
    const int32_t next = ArgMax(logits);
    out.push_back(next);
    if (next == stop_token || i + 1 == n) break;
    TQKV_ASSIGN_OR_RETURN(logits, engine.Forward(next));
  }
  return out;
}

}  // namespace tqkv::model
