// Synthetic KV data (docs/codec.md, "Synthetic data"). Uses the project's deterministic PRNG and
// elementary functions (src/common/prng.h), so a seed gives the same bits on every machine.
#include "tqkv/synthetic.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "codec/kernels/kernels.h"
#include "common/prng.h"

namespace tqkv {
namespace {

// Per-group constants of the kv distribution.
struct GroupModel {
  std::vector<float> bias;   // per channel
  std::vector<float> scale;  // per channel noise standard deviation
};

constexpr uint64_t kGroupSalt = 0x67726f7570;  // "group"
constexpr uint64_t kTokenSalt = 0x746f6b656e;  // "token"

GroupModel MakeGroup(uint64_t seed, uint32_t layer, int kv, uint32_t head, uint32_t d) {
  Prng prng(DeriveSeed(seed ^ kGroupSalt, layer, static_cast<uint64_t>(kv), head));
  GroupModel g;
  g.bias.resize(d);
  g.scale.resize(d);
  const bool is_k = kv == 0;
  const double bias_sd = is_k ? 0.5 : 0.2;
  for (uint32_t c = 0; c < d; ++c) {
    g.bias[c] = static_cast<float>(bias_sd * prng.Gaussian());
    // Mild per-channel spread of the noise level: 0.75 .. 1.25.
    g.scale[c] = static_cast<float>(0.75 + 0.5 * prng.UniformDouble());
  }
  // High-magnitude channels: K gets d/32 (>= 2) of them as whole RoPE pairs in the slow-rotating
  // upper half (where real K outliers sit), 8-20x; V gets d/64 (>= 1) single channels, 2-4x.
  const uint32_t half_pairs = d / 4;  // pairs in the upper half start at pair index d/4
  if (is_k && d >= 8) {
    const uint32_t pairs = std::max<uint32_t>(1, d / 64);
    std::vector<uint32_t> chosen;
    while (chosen.size() < pairs) {
      const uint32_t p = half_pairs + static_cast<uint32_t>(prng.Next() % (d / 2 - half_pairs));
      if (std::find(chosen.begin(), chosen.end(), p) != chosen.end()) continue;
      chosen.push_back(p);
      const double mag = 8.0 + 12.0 * prng.UniformDouble();
      for (uint32_t c : {2 * p, 2 * p + 1}) {
        g.bias[c] = static_cast<float>(mag * (prng.UniformDouble() < 0.5 ? -0.7 : 0.7));
        g.scale[c] = static_cast<float>(mag * 0.5);
      }
    }
  } else if (!is_k) {
    const uint32_t count = std::max<uint32_t>(1, d / 64);
    for (uint32_t i = 0; i < count; ++i) {
      const uint32_t c = static_cast<uint32_t>(prng.Next() % d);
      const double mag = 2.0 + 2.0 * prng.UniformDouble();
      g.scale[c] = static_cast<float>(mag);
      g.bias[c] = static_cast<float>(mag * 0.3 * (prng.UniformDouble() < 0.5 ? -1.0 : 1.0));
    }
  }
  return g;
}

// Approximately standard normal noise from one 64-bit draw: the sum of its four 16-bit parts
// (Irwin-Hall, |z| <= 3.46) scaled to unit variance. ~30x cheaper than the polar method, and
// kv data only needs a KV-like shape, not exact Gaussian tails (`gaussian` data keeps them).
inline float FastNormal(uint64_t r) {
  const int32_t sum = static_cast<int32_t>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) +
                                           ((r >> 32) & 0xFFFF) + (r >> 48));
  constexpr float kScale = 1.7320508075688772f / 65536.0f;  // sqrt(3) / 2^16
  return static_cast<float>(sum - 2 * 65535) * kScale;
}

// The SIMD table's conversion: the same bits as the scalar one (KernelsSimd tests), a fifth of
// `tqkv capacity`'s time as a per-element switch.
void Store(const float* v, uint32_t d, DType dtype, void* out) {
  kernels::ActiveKernels().from_f32(v, d, dtype, out);
}

Status CheckArgs(const ModelGeometry& g, uint32_t layer, int kv, uint32_t head, uint64_t t0,
                 uint64_t t1, DType dtype, const void* out) {
  if (g.head_dim < 2) return Status::InvalidArgument("synthetic: head_dim < 2");
  if (layer >= g.layers || head >= g.kv_heads || (kv != 0 && kv != 1)) {
    return Status::InvalidArgument("synthetic: group (" + std::to_string(layer) + ", " +
                                   std::to_string(kv) + ", " + std::to_string(head) +
                                   ") outside the geometry");
  }
  if (t1 < t0) return Status::InvalidArgument("synthetic: t1 < t0");
  if (static_cast<uint8_t>(dtype) > static_cast<uint8_t>(DType::kBF16)) {
    return Status::InvalidArgument("synthetic: unknown dtype");
  }
  if (t1 > t0 && out == nullptr) return Status::InvalidArgument("synthetic: null output");
  return Status::Ok();
}

}  // namespace

std::optional<SyntheticKind> ParseSyntheticKind(std::string_view name) {
  if (name == "gaussian") return SyntheticKind::kGaussian;
  if (name == "kv") return SyntheticKind::kKv;
  return std::nullopt;
}

SyntheticKv::SyntheticKv(SyntheticKind kind, ModelGeometry geometry, uint64_t seed,
                         double rope_base)
    : kind_(kind), geometry_(geometry), seed_(seed), rope_base_(rope_base) {
  if (kind_ != SyntheticKind::kKv || geometry_.head_dim < 2) return;
  // The per-pair frequencies and the sin, cos of (l * f_i) for l < kChunk: the same for every
  // chunk, layer and head (recomputed per chunk and layer, they were 15 % of `tqkv capacity`).
  const uint32_t pairs = geometry_.head_dim / 2;
  rope_freq_.resize(pairs);
  const double log_base = DetLog(rope_base_);
  for (uint32_t i = 0; i < pairs; ++i) {
    rope_freq_[i] = DetExp(-2.0 * i / geometry_.head_dim * log_base);
  }
  rope_low_.resize(kChunk * pairs * 2);
  for (uint64_t l = 0; l < kChunk; ++l) {
    for (uint32_t i = 0; i < pairs; ++i) {
      DetSinCos(static_cast<double>(l) * rope_freq_[i], &rope_low_[(l * pairs + i) * 2],
                &rope_low_[(l * pairs + i) * 2 + 1]);
    }
  }
}

Status SyntheticKv::FillGroup(uint32_t layer, int kv, uint32_t head, uint64_t t0, uint64_t t1,
                              DType dtype, void* out, size_t stride) const {
  TQKV_RETURN_IF_ERROR(CheckArgs(geometry_, layer, kv, head, t0, t1, dtype, out));
  if (t1 > t0 && stride < geometry_.head_dim) {
    return Status::InvalidArgument("synthetic: stride < head_dim");
  }
  std::vector<double> rope;
  for (uint64_t c0 = t0; c0 < t1; c0 += kChunk) {
    const uint64_t c1 = std::min(t1, c0 + kChunk);
    if (kind_ == SyntheticKind::kKv && kv == 0) RopeTable(c0, c1, &rope);
    FillChunk(layer, kv, head, c0, c1, rope, dtype,
              static_cast<uint8_t*>(out) + (c0 - t0) * stride * DTypeSize(dtype), stride);
  }
  return Status::Ok();
}

void SyntheticKv::RopeTable(uint64_t t0, uint64_t t1, std::vector<double>* table) const {
  // theta = pos * f_i with pos = 256 * hi + lo: sin/cos of (hi * 256 * f_i) by the series once per
  // 256-token block, of (lo * f_i) from a 256-entry table, combined by angle addition. A token's
  // values depend only on its absolute position, never on the requested range.
  const uint32_t pairs = geometry_.head_dim / 2;
  const std::vector<double>& freq = rope_freq_;
  const std::vector<double>& lo = rope_low_;
  table->resize((t1 - t0) * pairs * 2);
  std::vector<double> hi(pairs * 2);
  uint64_t hi_block = ~uint64_t{0};
  double* p = table->data();
  for (uint64_t t = t0; t < t1; ++t) {
    if (t / kChunk != hi_block) {
      hi_block = t / kChunk;
      const double base = static_cast<double>(hi_block * kChunk);
      for (uint32_t i = 0; i < pairs; ++i) DetSinCos(base * freq[i], &hi[2 * i], &hi[2 * i + 1]);
    }
    const double* l = &lo[(t % kChunk) * pairs * 2];
    for (uint32_t i = 0; i < pairs; ++i, p += 2) {
      const double sh = hi[2 * i], ch = hi[2 * i + 1], sl = l[2 * i], cl = l[2 * i + 1];
      p[0] = sh * cl + ch * sl;
      p[1] = ch * cl - sh * sl;
    }
  }
}

void SyntheticKv::FillChunk(uint32_t layer, int kv, uint32_t head, uint64_t t0, uint64_t t1,
                            const std::vector<double>& rope, DType dtype, uint8_t* dst,
                            size_t stride) const {
  const uint32_t d = geometry_.head_dim;
  std::vector<float> v(d);
  const size_t pitch = stride * DTypeSize(dtype);
  if (kind_ == SyntheticKind::kGaussian) {
    for (uint64_t t = t0; t < t1; ++t) {
      Prng prng(DeriveSeed(seed_ ^ kTokenSalt, layer * 2ull + kv, head, t));
      for (uint32_t c = 0; c < d; ++c) v[c] = static_cast<float>(prng.Gaussian());
      Store(v.data(), d, dtype, dst + (t - t0) * pitch);
    }
    return;
  }
  const GroupModel g = MakeGroup(seed_, layer, kv, head, d);
  const uint32_t pairs = d / 2;
  for (uint64_t t = t0; t < t1; ++t) {
    Prng prng(DeriveSeed(seed_ ^ kTokenSalt, layer * 2ull + kv, head, t));
    for (uint32_t c = 0; c < d; ++c) v[c] = g.bias[c] + g.scale[c] * FastNormal(prng.Next());
    if (kv == 0) {
      const double* sc = &rope[(t - t0) * pairs * 2];
      for (uint32_t i = 0; i < pairs; ++i) {
        const double s = sc[2 * i], c = sc[2 * i + 1];
        const double a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = static_cast<float>(a * c - b * s);
        v[2 * i + 1] = static_cast<float>(a * s + b * c);
      }
    }
    Store(v.data(), d, dtype, dst + (t - t0) * pitch);
  }
}

Status SyntheticKv::FillLayer(uint32_t layer, int kv, uint64_t t0, uint64_t t1, DType dtype,
                              void* out) const {
  TQKV_RETURN_IF_ERROR(CheckArgs(geometry_, layer, kv, 0, t0, t1, dtype, out));
  const size_t head_bytes = size_t{geometry_.head_dim} * DTypeSize(dtype);
  const size_t token_bytes = geometry_.token_elems() * DTypeSize(dtype);
  // Token chunks outermost: the RoPE table of a chunk is shared by every head.
  std::vector<double> rope;
  for (uint64_t c0 = t0; c0 < t1; c0 += kChunk) {
    const uint64_t c1 = std::min(t1, c0 + kChunk);
    if (kind_ == SyntheticKind::kKv && kv == 0) RopeTable(c0, c1, &rope);
    for (uint32_t h = 0; h < geometry_.kv_heads; ++h) {
      FillChunk(layer, kv, h, c0, c1, rope, dtype,
                static_cast<uint8_t*>(out) + (c0 - t0) * token_bytes + h * head_bytes,
                geometry_.token_elems());
    }
  }
  return Status::Ok();
}

Status SyntheticKv::FillCache(const KvCache& cache) const {
  if (!(cache.geometry() == geometry_))
    return Status::InvalidArgument("synthetic: geometry differs");
  TQKV_RETURN_IF_ERROR(cache.Validate());
  for (uint32_t l = 0; l < geometry_.layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      TQKV_RETURN_IF_ERROR(FillLayer(l, kv, 0, cache.tokens(), cache.dtype(), cache.tensor(l, kv)));
    }
  }
  return Status::Ok();
}

}  // namespace tqkv
