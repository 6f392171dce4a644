#include "checkpoint/codec_guard.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "checkpoint/key_means.h"

namespace tqkv {
namespace {

bool FiniteRow(const void* x, DType dtype, size_t at, size_t d) {
  for (size_t i = 0; i < d; ++i) {
    if (!std::isfinite(LoadAsFloat(x, dtype, at + i))) return false;
  }
  return true;
}

// One tensor of one layer: what the codec encodes and how to compare its decode.
struct TensorView {
  const void* x;        // the session's vectors
  DType dtype;
  const void* coded;    // what the codec is given (x, or the keys' f32 residual)
  DType coded_dtype;
  const KeyMeans* means;  // added back to the decode; null when not centered
};

class Measurer {
 public:
  Measurer(const ContainerHeader& h, uint32_t stride, ThreadPool* pool)
      : h_(h), stride_(stride), pool_(pool) {}
  // The layer the next Measure calls are for: its tokens (LayerTokens) are sampled.
  void SetLayer(uint32_t layer) {
    layer_ = layer;
    tokens_ = LayerTokens(h_, layer);
    samples_ = (tokens_ + stride_ - 1) / stride_;
  }

  Result<TensorCodecError> Measure(const Codec& codec, const TensorView& t) {
    const size_t heads = h_.geometry.kv_heads, d = h_.geometry.head_dim, row = heads * d;
    TensorCodecError out;
    if (samples_ == 0) return out;
    std::vector<uint8_t> meta(codec.group_meta_bytes());
    codes_.resize(samples_ * codec.code_bytes());
    decoded_.resize(samples_ * d);
    for (size_t hd = 0; hd < heads; ++hd) {
      const auto* coded = static_cast<const uint8_t*>(t.coded) + hd * d * DTypeSize(t.coded_dtype);
      if (!meta.empty()) {
        TQKV_RETURN_IF_ERROR(codec.SelectGroupMeta(coded, t.coded_dtype, tokens_, row, meta));
      }
      TQKV_RETURN_IF_ERROR(codec.Encode(coded, t.coded_dtype, samples_, stride_ * row, meta,
                                        codes_, pool_));
      TQKV_RETURN_IF_ERROR(
          codec.Decode(codes_, samples_, meta, decoded_.data(), DType::kF32, d, pool_));
      Accumulate(t, hd, &out);
    }
    return out;
  }

 private:
  // Adds head hd's sampled vectors to the sums: the head's mean first, then the deviations.
  void Accumulate(const TensorView& t, size_t hd, TensorCodecError* out) {
    const size_t d = h_.geometry.head_dim, row = h_.geometry.kv_heads * d;
    const uint64_t mean_blocks = t.means ? KeyMeanBlocks(h_, layer_) : 0;
    // Left out, as a non-finite vector is: a finite one the codec stores as NaN (its f32 sum of
    // squares overflows, docs/codec.md §5). Its error has no finite value, and the sums must.
    keep_.assign(samples_, 0);
    std::vector<double> mean(d, 0.0);
    uint64_t count = 0;
    for (uint64_t i = 0; i < samples_; ++i) {
      const uint64_t token = i * stride_;
      const size_t at = token * row + hd * d;
      // Exact rows are restored as they are: no error there, and they still vary.
      const bool exact = token < h_.exact_head || token >= tokens_ - h_.exact_tail;
      if (!FiniteRow(t.x, t.dtype, at, d) ||
          (!exact && !FiniteRow(decoded_.data(), DType::kF32, i * d, d))) {
        continue;
      }
      keep_[i] = 1;
      for (size_t c = 0; c < d; ++c) mean[c] += LoadAsFloat(t.x, t.dtype, at + c);
      ++count;
    }
    if (count == 0) return;
    for (double& m : mean) m /= static_cast<double>(count);
    for (uint64_t i = 0; i < samples_; ++i) {
      if (!keep_[i]) continue;
      const uint64_t token = i * stride_;
      const size_t at = token * row + hd * d;
      const bool exact = token < h_.exact_head || token >= tokens_ - h_.exact_tail;
      const float* r = decoded_.data() + i * d;
      const float* mu = nullptr;
      float alpha = 0;
      if (t.means) {  // the decoders' arithmetic: the product rounded, then the sum
        mu = t.means->means.data() + (hd * mean_blocks + token / h_.key_mean_block) * d;
        alpha = t.means->alphas[hd * tokens_ + token];
      }
      for (size_t c = 0; c < d; ++c) {
        const double x = LoadAsFloat(t.x, t.dtype, at + c);
        float prod = 0;
        if (mu) prod = alpha * mu[c];
        const double xhat = exact ? x
                            : mu  ? static_cast<double>(r[c] + prod)
                                  : static_cast<double>(r[c]);
        out->err += (x - xhat) * (x - xhat);
        out->var += (x - mean[c]) * (x - mean[c]);
        out->energy += x * x;
      }
    }
  }

  const ContainerHeader& h_;
  uint64_t stride_;
  ThreadPool* pool_;
  uint32_t layer_ = 0;
  uint64_t tokens_ = 0;
  uint64_t samples_ = 0;
  std::vector<uint8_t> codes_;
  std::vector<float> decoded_;
  std::vector<uint8_t> keep_;  // per sample: in the sums
};

}  // namespace

uint32_t GuardStride(uint64_t tokens) {
  const uint64_t s = (tokens + kGuardSampleTokens - 1) / kGuardSampleTokens;
  return static_cast<uint32_t>(std::clamp<uint64_t>(s, 1, UINT32_MAX));
}

Result<CandidateErrors> MeasureCodecErrors(const ContainerHeader& h, uint32_t stride,
                                           const LayerTensorsFn& layer_tensors,
                                           const CandidatesFn& candidates, float* residual,
                                           ThreadPool* pool) {
  Measurer measurer(h, stride, pool);
  CandidateErrors errors(h.geometry.layers);
  std::vector<uint8_t> means_bytes;
  for (uint32_t layer = 0; layer < h.geometry.layers; ++layer) {
    const void* tensors[2] = {nullptr, nullptr};
    TQKV_RETURN_IF_ERROR(layer_tensors(layer, tensors));
    measurer.SetLayer(layer);
    std::optional<KeyMeans> means;
    for (int kv = 0; kv < 2; ++kv) {
      for (const Codec* codec : candidates(layer, kv)) {
        TensorView view{tensors[kv], h.source_dtype, tensors[kv], h.source_dtype, nullptr};
        const bool centered = kv == 0 && h.key_mean_block != 0 && h.tokens > 0 &&
                              KindTakesKeyMeans(codec->params().kind);
        if (centered) {
          if (!means) {  // once per layer, as the checkpoint computes them
            means_bytes.resize(KeyMeanValues(h, layer) * DTypeSize(h.key_mean_dtype));
            ComputeKeyMeans(h, layer, tensors[0], h.source_dtype, means_bytes, pool);
            means = KeyMeansAsF32(h, layer, means_bytes);
            // Every token: split codecs choose their outlier channels from all of them.
            CenterKeys(h, layer, tensors[0], h.source_dtype, *means, residual, pool);
          }
          view.coded = residual;
          view.coded_dtype = DType::kF32;
          view.means = &*means;
        }
        TQKV_ASSIGN_OR_RETURN(TensorCodecError e, measurer.Measure(*codec, view));
        errors[layer][kv].push_back(e);
      }
    }
  }
  return errors;
}

}  // namespace tqkv
