#include "checkpoint/key_means.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "codec/kernels/kernels.h"
#include "format/container_layout.h"
#include "tqkv/codec.h"
#include "tqkv/thread_pool.h"

namespace tqkv {
namespace {

// `v` as stored in `dtype` (f32 or f16), or 0 when it is not finite there.
float Storable(double v, DType dtype) {
  const float f = static_cast<float>(v);
  const float s = dtype == DType::kF16 ? HalfToFloat(FloatToHalf(f)) : f;
  return std::isfinite(s) ? s : 0.0f;
}

void Put(uint8_t* p, DType dtype, float v) {
  if (dtype == DType::kF16) {
    format::StoreU16(p, FloatToHalf(v));
  } else {
    format::StoreU32(p, std::bit_cast<uint32_t>(v));
  }
}

// Row `at` of `d` elements as floats, with this CPU's conversion kernel (bit-identical to
// LoadAsFloat; tests/codec/kernels_test.cc).
void RowToFloat(const void* k, DType dtype, size_t at, size_t d, float* dst) {
  const auto* p = static_cast<const uint8_t*>(k) + at * DTypeSize(dtype);
  kernels::ActiveKernels().to_f32(p, dtype, d, dst);
}

bool Finite(const float* x, size_t d) {
  bool ok = true;
  for (size_t i = 0; i < d; ++i) ok &= std::isfinite(x[i]);
  return ok;
}

}  // namespace

void ComputeKeyMeans(const ContainerHeader& h, uint32_t layer, const void* k, DType dtype,
                     std::span<uint8_t> out, ThreadPool* pool) {
  const size_t heads = h.geometry.kv_heads, d = h.geometry.head_dim, row = heads * d;
  const uint64_t blocks = KeyMeanBlocks(h, layer), tokens = LayerTokens(h, layer);
  const DType md = h.key_mean_dtype;
  const size_t msize = DTypeSize(md);
  uint8_t* alphas = out.data() + blocks * row * msize;
  // Each (head, block) pair writes only its own mean and coefficients.
  (void)ParallelForEach(pool, static_cast<size_t>(heads * blocks), 4, [&](size_t item) -> Status {
      const size_t hd = item / blocks;
      const uint64_t b = item % blocks;
      const uint64_t lo = b * h.key_mean_block;
      const uint64_t hi = std::min<uint64_t>(tokens, lo + h.key_mean_block);
      std::vector<float> x((hi - lo) * d), mu(d);
      std::vector<uint8_t> finite(hi - lo);
      std::vector<double> acc(d, 0.0);
      uint64_t count = 0;
      for (uint64_t t = lo; t < hi; ++t) {
        float* r = x.data() + (t - lo) * d;
        RowToFloat(k, dtype, t * row + hd * d, d, r);
        finite[t - lo] = Finite(r, d);
        if (!finite[t - lo]) continue;  // decodes to NaN anyway; must not poison μ
        for (size_t i = 0; i < d; ++i) acc[i] += r[i];
        ++count;
      }
      double mm = 0;
      for (size_t i = 0; i < d; ++i) {
        mu[i] = count ? Storable(acc[i] / static_cast<double>(count), md) : 0.0f;
        mm += static_cast<double>(mu[i]) * mu[i];
        Put(out.data() + ((hd * blocks + b) * d + i) * msize, md, mu[i]);
      }
      for (uint64_t t = lo; t < hi; ++t) {
        const float* r = x.data() + (t - lo) * d;
        float a = 0.0f;
        if (mm > 0 && finite[t - lo]) {
          double dot = 0;
          for (size_t i = 0; i < d; ++i) dot += static_cast<double>(r[i]) * mu[i];
          a = Storable(dot / mm, md);
        }
        Put(alphas + (hd * tokens + t) * msize, md, a);
      }
      return Status::Ok();
  });
}

KeyMeans KeyMeansAsF32(const ContainerHeader& h, uint32_t layer, std::span<const uint8_t> payload) {
  const bool half = h.key_mean_dtype == DType::kF16;
  std::vector<float> all(payload.size() / (half ? 2 : 4));
  for (size_t i = 0; i < all.size(); ++i) {
    all[i] = half ? HalfToFloat(format::LoadU16(payload.data() + 2 * i))
                  : std::bit_cast<float>(format::LoadU32(payload.data() + 4 * i));
  }
  const size_t nm = std::min<size_t>(all.size(), KeyMeanBlocks(h, layer) * h.geometry.token_elems());
  KeyMeans m;
  m.means.assign(all.begin(), all.begin() + nm);
  m.alphas.assign(all.begin() + nm, all.end());
  return m;
}

void CenterKeys(const ContainerHeader& h, uint32_t layer, const void* k, DType dtype,
                const KeyMeans& m, float* out, ThreadPool* pool) {
  const size_t heads = h.geometry.kv_heads, d = h.geometry.head_dim, row = heads * d;
  const uint64_t blocks = KeyMeanBlocks(h, layer), tokens = LayerTokens(h, layer);
  (void)ParallelForEach(pool, static_cast<size_t>(tokens), 256, [&](size_t i) -> Status {
    const uint64_t t = i;
    const uint64_t b = t / h.key_mean_block;
    for (size_t hd = 0; hd < heads; ++hd) {
      const float* mu = m.means.data() + (hd * blocks + b) * d;
      const float a = m.alphas[hd * tokens + t];
      const size_t at = t * row + hd * d;
      RowToFloat(k, dtype, at, d, out + at);
      for (size_t i = 0; i < d; ++i) out[at + i] -= a * mu[i];
    }
    return Status::Ok();
  });
}

Status DecodeCenteredKeys(const ContainerHeader& h, uint32_t layer, const Codec& codec,
                          const KeyMeans& m, uint32_t head, uint64_t token_begin, size_t n,
                          std::span<const uint8_t> codes, std::span<const uint8_t> meta, void* out,
                          DType dtype, size_t stride, ThreadPool* pool) {
  const size_t d = h.geometry.head_dim, code_bytes = codec.code_bytes();
  const uint64_t blocks = KeyMeanBlocks(h, layer), tokens = LayerTokens(h, layer);
  if (m.means.size() != blocks * h.geometry.kv_heads * d ||
      m.alphas.size() != tokens * h.geometry.kv_heads || token_begin + n > tokens) {
    return Status::Internal("key means of the wrong size");
  }
  const std::span<const float> means(m.means), alphas(m.alphas);
  auto* dst = static_cast<uint8_t*>(out);
  // One DecodeAdd per mean block (at most key_mean_block tokens), the blocks spread over the
  // pool: one call over the whole range would need a mean per vector, and a pool inside each
  // short call would leave it mostly idle.
  const uint64_t first = token_begin / h.key_mean_block;
  const uint64_t runs = n == 0 ? 0 : (token_begin + n - 1) / h.key_mean_block - first + 1;
  const size_t grain = std::max<size_t>(1, 256 / std::max<uint64_t>(1, h.key_mean_block));
  return ParallelForEach(pool, static_cast<size_t>(runs), grain, [&](size_t r) {
    const uint64_t b = first + r;
    const uint64_t t = std::max<uint64_t>(token_begin, b * h.key_mean_block);
    const uint64_t end = std::min<uint64_t>(token_begin + n, (b + 1) * h.key_mean_block);
    const size_t i = static_cast<size_t>(t - token_begin), run = static_cast<size_t>(end - t);
    return codec.DecodeAdd(codes.subspan(i * code_bytes, run * code_bytes), run, meta,
                           means.subspan((head * blocks + b) * d, d),
                           alphas.subspan(head * tokens + t, run),
                           dst + i * stride * DTypeSize(dtype), dtype, stride, nullptr);
  });
}

}  // namespace tqkv
