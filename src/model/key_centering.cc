#include "model/key_centering.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "tqkv/types.h"

namespace tqkv::model {
namespace {

float RoundF16(float x) { return HalfToFloat(FloatToHalf(x)); }

Status CheckCache(const KvCache& c, const ModelGeometry& g, uint64_t tokens, const char* what) {
  if (c.dtype() != DType::kF16) {
    return Status::InvalidArgument(std::string(what) + ": key centering needs an fp16 cache");
  }
  if (!(c.geometry() == g) || c.tokens() != tokens) {
    return Status::InvalidArgument(std::string(what) + ": geometry or tokens differ");
  }
  return c.Validate();
}

}  // namespace

Result<KeyCentering> CenterKeys(const KvCache& original, uint32_t block, const KvCache& residual) {
  if (block == 0) return Status::InvalidArgument("key centering block must be at least 1 token");
  const ModelGeometry& g = original.geometry();
  TQKV_RETURN_IF_ERROR(CheckCache(original, g, original.tokens(), "original"));
  TQKV_RETURN_IF_ERROR(CheckCache(residual, g, original.tokens(), "residual"));
  KeyCentering c;
  c.block = block;
  c.tokens = original.tokens();
  c.geometry = g;
  const size_t heads = g.kv_heads, d = g.head_dim, row = heads * d;
  const uint64_t n = c.tokens, blocks = (n + block - 1) / block;
  c.means.assign(g.layers * blocks * row, 0.f);
  c.alphas.assign(g.layers * n * heads, 0.f);
  double e_all = 0, e_res = 0;
  std::vector<double> acc(row);
  for (uint32_t l = 0; l < g.layers; ++l) {
    const auto* k = static_cast<const uint16_t*>(original.k(l));
    auto* r = static_cast<uint16_t*>(residual.k(l));
    for (uint64_t b = 0; b < blocks; ++b) {
      const uint64_t lo = b * block, hi = std::min<uint64_t>(n, lo + block);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (uint64_t t = lo; t < hi; ++t) {
        for (size_t i = 0; i < row; ++i) acc[i] += HalfToFloat(k[t * row + i]);
      }
      float* mu = &c.means[(l * blocks + b) * row];
      for (size_t i = 0; i < row; ++i) mu[i] = RoundF16(static_cast<float>(acc[i] / (hi - lo)));
      for (uint64_t t = lo; t < hi; ++t) {
        for (size_t h = 0; h < heads; ++h) {
          const uint16_t* x = k + t * row + h * d;
          const float* m = mu + h * d;
          double dot = 0, mm = 0;
          for (size_t i = 0; i < d; ++i) {
            dot += static_cast<double>(HalfToFloat(x[i])) * m[i];
            mm += static_cast<double>(m[i]) * m[i];
          }
          const float a = mm > 0 ? RoundF16(static_cast<float>(dot / mm)) : 0.f;
          c.alphas[(l * n + t) * heads + h] = a;
          for (size_t i = 0; i < d; ++i) {
            const float xv = HalfToFloat(x[i]);
            const float rv = xv - a * m[i];
            e_all += static_cast<double>(xv) * xv;
            e_res += static_cast<double>(rv) * rv;
            r[t * row + h * d + i] = FloatToHalf(rv);
          }
        }
      }
    }
    if (residual.v(l) != original.v(l)) {
      std::memcpy(residual.v(l), original.v(l), original.tensor_bytes());
    }
  }
  c.energy_fraction = e_all > 0 ? e_res / e_all : 0.0;
  return c;
}

Status UncenterKeys(const KeyCentering& c, const KvCache& cache) {
  TQKV_RETURN_IF_ERROR(CheckCache(cache, c.geometry, c.tokens, "restored"));
  const size_t heads = c.geometry.kv_heads, d = c.geometry.head_dim, row = heads * d;
  const uint64_t n = c.tokens, blocks = (n + c.block - 1) / c.block;
  for (uint32_t l = 0; l < c.geometry.layers; ++l) {
    auto* k = static_cast<uint16_t*>(cache.k(l));
    for (uint64_t t = 0; t < n; ++t) {
      const float* mu = &c.means[(l * blocks + t / c.block) * row];
      for (size_t h = 0; h < heads; ++h) {
        const float a = c.alphas[(l * n + t) * heads + h];
        uint16_t* x = k + t * row + h * d;
        for (size_t i = 0; i < d; ++i) x[i] = FloatToHalf(HalfToFloat(x[i]) + a * mu[h * d + i]);
      }
    }
  }
  return Status::Ok();
}

}  // namespace tqkv::model
