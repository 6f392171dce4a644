// The transform codec "kl:B" (docs/codec.md §11): transform coding fitted per group (layer, K/V,
// KV head) from the session's own vectors at checkpoint time.
//
// Each vector x is coded as its norm n and the unit vector u = x / n. The group metadata holds,
// per channel c, a bit count b_c (0..8), a mean m_c and a scale s_c, and one power-of-two norm
// scale g. b_c comes from reverse water-filling over bundles of 8 channels of similar variance;
// the channels of equal b_c form a class (a multiple of 8 channels) whose values
// w_c = (u_c - m_c) / s_c (s_c: the class's root mean square deviation) are rotated in
// power-of-two Hadamard blocks and quantized as TurboQuant quantizes a subset, the vector's norm
// shared by every block. So blocks decode with TurboQuant's own kernels (every SIMD level,
// bit-identical to the scalar reference), and the rotation keeps a token's outlier in one channel
// from being clipped: quantizing each channel on its own measured 3-4x the mean KL.
//
// Why a diagonal basis and not the session's eigenvectors: on Qwen2.5-Coder-1.5B a dense
// eigenbasis per group lowers the error at a given rate by a further ~25 %, but costs
// 16 * head_dim / N bits per value in f16 (1.0 at N = 2,048, head_dim 128), more than it saves
// below ~8K tokens; block-diagonal and low-rank approximations kept little of its gain
// (docs/lab/kl.md, lab/kl_basis_study.py).
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <queue>
#include <string>
#include <vector>

#include "codec/codec_internal.h"
#include "codec/kernels/kernels.h"
#include "codec/lloyd_max.h"
#include "codec/rotation.h"
#include "common/prng.h"
#include "tqkv/thread_pool.h"

namespace tqkv::codec {
namespace {

constexpr uint32_t kMaxBits = 8;
constexpr uint32_t kBundle = 8;  // channels per allocation unit: every class is a multiple
// Class rotations depend on the class size m only: DeriveSeed(kClassSeed, m).
constexpr uint64_t kClassSeed = 0x7471'6b76'6b6c'0001ull;  // "tqkvkl" + 1

uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// [b]: the Gaussian Lloyd-Max MSE at b bits ([0] = 1), for the encoder's bit allocation only:
// solved on first use, so opening a kl file to decode it does not solve eight codebooks.
const std::array<double, kMaxBits + 1>& GaussianDistortion() {
  static const std::array<double, kMaxBits + 1> table = [] {
    std::array<double, kMaxBits + 1> t{1.0};
    for (uint32_t b = 1; b <= kMaxBits; ++b) {
      const auto cb = LloydMaxCodebook(kGaussianDim, b);
      t[b] = cb ? cb->mse : t[b - 1] / 4;
    }
    return t;
  }();
  return table;
}


// A block: a power-of-two run of one class's channels with its own Hadamard rotation. A class of
// m channels (a multiple of 8) splits into blocks by the binary digits of m, largest first, its
// channels (ascending) taken in that order: every block decodes with the fastest kernels.
struct Block {
  uint32_t dim = 0;
  const uint32_t* channels = nullptr;  // dim channel indices
  size_t planes_offset = 0;            // within a code
  size_t row_offset = 0;               // within a decode row (blocks in code order)
  kernels::SubsetPlan plan;
};

// One group's metadata, unpacked.
struct Group {
  std::vector<float> mean, scale;  // m_c, s_c as stored (f16)
  float g = 1.0f;
  std::vector<uint32_t> classes[kMaxBits + 1];  // [b]: channels with b_c = b, ascending
  std::vector<Block> blocks;                    // classes 1..8 in order, each by its digits
  // Blocks decode into a row (the blocks' channels in block order); channel c is then
  // a[c] * n + b[c] * row[from_row[c]] (kernels' gather_affine).
  std::vector<uint32_t> from_row;  // [c]: channel c's position in a row (0 for a 0-bit channel)
  std::vector<float> a, b;         // m_c * g, and s_c * g or 0 for a 0-bit channel (g exact)
  std::vector<kernels::TransformBlock> rotations;  // the blocks' columns and signs in a row
  // Encode: row position r holds channel row_channel[r] (its mean and scale beside it).
  std::vector<uint32_t> row_channel;
  std::vector<float> row_mean, row_scale;
};

class TransformCodec final : public Codec {
 public:
  explicit TransformCodec(const CodecParams& params) : params_(params) {
    d_ = params_.head_dim;
    norm_bytes_ = DTypeSize(params_.norm_dtype);
    code_bytes_ = norm_bytes_ + params_.code_bits / 8;
    for (uint32_t b = 1; b <= kMaxBits; ++b) {
      const std::vector<float>& c = params_.subsets[b - 1].centroids;
      thresholds_[b].resize(c.size() - 1);
      for (size_t k = 0; k + 1 < c.size(); ++k) thresholds_[b][k] = 0.5f * (c[k] + c[k + 1]);
      largest_centroid_[b] = std::max(std::fabs(c.front()), std::fabs(c.back()));
    }
  }

  const CodecParams& params() const override { return params_; }
  size_t code_bytes() const override { return code_bytes_; }
  size_t group_meta_bytes() const override { return GroupMetaBytesOf(params_); }

  Status CheckGroupMeta(std::span<const uint8_t> meta) const override {
    auto bad = [](const std::string& why) {
      return Status::InvalidArgument("kl group metadata: " + why);
    };
    if (meta.size() != group_meta_bytes()) {
      return bad(std::to_string(meta.size()) + " bytes, need " +
                 std::to_string(group_meta_bytes()));
    }
    uint64_t total = 0;
    uint32_t count[kMaxBits + 1] = {};
    for (uint32_t c = 0; c < d_; ++c) {
      if (meta[c] > kMaxBits) {
        return bad("channel " + std::to_string(c) + " has " + std::to_string(meta[c]) +
                   " bits (at most 8)");
      }
      total += meta[c];
      ++count[meta[c]];
      const uint16_t m = LoadU16(&meta[d_ + 2 * c]), s = LoadU16(&meta[3 * d_ + 2 * c]);
      if ((m & 0x7C00u) == 0x7C00u || (s & 0x7C00u) == 0x7C00u || (s & 0x8000u) != 0) {
        return bad("channel " + std::to_string(c) +
                   " has a mean or scale that is not finite, or a negative scale");
      }
    }
    if (total != params_.code_bits) {
      return bad("bits sum to " + std::to_string(total) + ", the codec codes " +
                 std::to_string(params_.code_bits));
    }
    for (uint32_t b = 1; b <= kMaxBits; ++b) {
      if (count[b] % kBundle != 0) {
        return bad(std::to_string(count[b]) + " channels of " + std::to_string(b) +
                   " bits (a multiple of 8)");
      }
    }
    float g;
    std::memcpy(&g, &meta[5 * d_], 4);
    int e = 0;
    if (!(g > 0.0f) || !std::isfinite(g) || std::frexp(g, &e) != 0.5f || e < -125 || e > 128) {
      return bad("norm scale is not a normal power of two");
    }
    return CheckDecodeBound(meta, g, bad);
  }

  // Finite codes must decode to finite values: a g edited to 2^127 passed verify and restored
  // infinities (issue 49). With f16 norms N <= 65504 and a block's row entries are at most
  // N·√d·max|centroid|, so g·65504·(|m_c| + s_c·√d·max|centroid|) bounds channel c (the encoder's
  // metadata stays below 2^80). With f32 norms tqkv writes g = 1; N itself can then overflow the
  // decode, as TurboQuant's f32 norm can (docs/codec.md §5).
  template <typename Bad>
  Status CheckDecodeBound(std::span<const uint8_t> meta, float g, const Bad& bad) const {
    if (params_.norm_dtype == DType::kF32) {
      return g == 1.0f ? Status::Ok() : bad("norm scale with f32 norms is not 1");
    }
    const double root_d = std::sqrt(static_cast<double>(d_));
    for (uint32_t c = 0; c < d_; ++c) {
      const double m = std::fabs(HalfToFloat(LoadU16(&meta[d_ + 2 * c])));
      const double s = meta[c] == 0 ? 0.0 : HalfToFloat(LoadU16(&meta[3 * d_ + 2 * c]));
      const double bound = g * 65504.0 * (m + s * root_d * largest_centroid_[meta[c]]);
      if (bound > 0x1p127) {  // FLT_MAX / 2: room for the rounding of products and sum
        return bad("channel " + std::to_string(c) + ": mean, scale and norm scale 2^" +
                   std::to_string(std::ilogb(g)) +
                   " can decode a finite code to infinity");
      }
    }
    return Status::Ok();
  }

  Status SelectGroupMeta(const void* x, DType dtype, size_t n, size_t stride,
                         std::span<uint8_t> meta) const override {
    TQKV_RETURN_IF_ERROR(CheckVectors("SelectGroupMeta", x, dtype, n, stride, d_));
    if (meta.size() != group_meta_bytes()) {
      return Status::InvalidArgument("SelectGroupMeta: meta has " + std::to_string(meta.size()) +
                                     " bytes, need " + std::to_string(group_meta_bytes()));
    }
    const auto& k = kernels::ActiveKernels();
    std::vector<double> s1(d_, 0.0), s2(d_, 0.0);
    std::vector<float> xf(std::min(n, kBatch) * d_);
    size_t count = 0;  // vectors of finite norm above 0 (the others have no say)
    float largest = 0.0f;
    const size_t pitch = stride * DTypeSize(dtype);
    for (size_t start = 0; start < n; start += kBatch) {
      const size_t cnt = std::min(kBatch, n - start);
      for (size_t i = 0; i < cnt; ++i) {
        k.to_f32(static_cast<const uint8_t*>(x) + (start + i) * pitch, dtype, d_,
                 xf.data() + i * d_);
      }
      k.unit_moments(xf.data(), d_, cnt, d_, s1.data(), s2.data(), &count, &largest);
    }
    std::vector<double> var(d_, 0.0);
    for (uint32_t c = 0; c < d_; ++c) {
      const double mean = count ? s1[c] / count : 0.0;
      var[c] = count ? std::max(0.0, s2[c] / count - mean * mean) : 0.0;
      const uint16_t m = FloatToHalf(static_cast<float>(mean));
      std::memcpy(&meta[d_ + 2 * c], &m, 2);
    }
    // g: the smallest power of two >= 1 that keeps every stored norm n / g within f16's range.
    float g = 1.0f;
    if (params_.norm_dtype == DType::kF16) {
      while (largest / g >= 32768.0f && g < 0x1p100f) g *= 2.0f;
    }
    std::memcpy(&meta[5 * d_], &g, 4);
    AllocateBits(var, meta.first(d_));
    // One scale per class, the root mean square deviation of its channels: the quantization error
    // then falls evenly on the class's channels (as TurboQuant's on a vector's), not in
    // proportion to each channel's variance.
    double class_var[kMaxBits + 1] = {}, class_n[kMaxBits + 1] = {};
    for (uint32_t c = 0; c < d_; ++c) {
      class_var[meta[c]] += var[c];
      class_n[meta[c]] += 1;
    }
    for (uint32_t c = 0; c < d_; ++c) {
      const double v = class_var[meta[c]] / class_n[meta[c]];
      const uint16_t s = FloatToHalf(static_cast<float>(std::sqrt(v)));
      std::memcpy(&meta[3 * d_ + 2 * c], &s, 2);
    }
    return Status::Ok();
  }

  Status Encode(const void* x, DType dtype, size_t n, size_t stride, std::span<const uint8_t> meta,
                std::span<uint8_t> out, ThreadPool* pool) const override {
    TQKV_RETURN_IF_ERROR(CheckVectors("Encode", x, dtype, n, stride, d_));
    TQKV_RETURN_IF_ERROR(CheckSpan("Encode output", out.size(), n, code_bytes_));
    TQKV_RETURN_IF_ERROR(CheckGroupMeta(meta));
    const Group g = Unpack(meta);
    const size_t pitch = stride * DTypeSize(dtype);
    const auto& k = kernels::ActiveKernels();
    std::atomic<bool> overflow{false};
    ParallelFor(pool, n, kGrain, [&](size_t b, size_t e) {
      const size_t cap = std::min(kBatch, e - b);
      // xf: the batch in f32; w: each vector's whitened row (the blocks' channels, block order)
      std::vector<float> xf(cap * d_), w(cap * d_), norms(cap);
      for (size_t start = b; start < e; start += kBatch) {
        const size_t cnt = std::min(kBatch, e - start);
        uint8_t* code = out.data() + start * code_bytes_;
        for (size_t i = 0; i < cnt; ++i) {
          k.to_f32(static_cast<const uint8_t*>(x) + (start + i) * pitch, dtype, d_,
                   xf.data() + i * d_);
        }
        k.whiten(xf.data(), d_, cnt, d_, g.row_channel.data(), g.row_mean.data(),
                 g.row_scale.data(), g.row_channel.size(), norms.data(), w.data(), d_);
        // The blocks' planes fill every byte after the norm (CheckGroupMeta: the bits sum to
        // code_bits); StoreNorm writes the norm and clears the planes of a degenerate vector.
        for (const Block& blk : g.blocks) {
          k.encode_unit(blk.plan, w.data() + blk.row_offset, d_, cnt, code + blk.planes_offset,
                        code_bytes_);
        }
        for (size_t i = 0; i < cnt; ++i) {
          if (!StoreNorm(g, norms[i], code + i * code_bytes_)) overflow.store(true);
        }
      }
    });
    if (overflow.load()) {
      return Status::InvalidArgument(
          "Encode: a vector's norm over the group's norm scale is 65520 or more, beyond what a "
          "kl code's f16 norm stores (metadata selected on other vectors?); use norm=f32");
    }
    return Status::Ok();
  }

  Status Decode(std::span<const uint8_t> codes, size_t n, std::span<const uint8_t> meta, void* out,
                DType dtype, size_t stride, ThreadPool* pool) const override {
    return DecodeImpl(codes, n, meta, nullptr, nullptr, out, dtype, stride, pool);
  }
  Status DecodeAdd(std::span<const uint8_t> codes, size_t n, std::span<const uint8_t> meta,
                   std::span<const float> mean, std::span<const float> scale, void* out,
                   DType dtype, size_t stride, ThreadPool* pool) const override {
    TQKV_RETURN_IF_ERROR(CheckMeanScale(mean.size(), scale.size(), d_, n));
    return DecodeImpl(codes, n, meta, mean.data(), scale.data(), out, dtype, stride, pool);
  }

 private:
  // Greedy reverse water-filling over bundles of 8 channels (channels by variance, largest
  // first, ties to the lower channel): code_bits / 8 steps, each giving one more bit to every
  // channel of the bundle whose distortion falls most (ties to the earlier bundle), at most 8.
  void AllocateBits(const std::vector<double>& var, std::span<uint8_t> bits) const {
    std::vector<uint32_t> order(d_);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return var[a] > var[b]; });
    const uint32_t bundles = d_ / kBundle;
    std::vector<double> bundle_var(bundles, 0.0);
    for (uint32_t j = 0; j < d_; ++j) bundle_var[j / kBundle] += var[order[j]];
    std::vector<uint32_t> bundle_bits(bundles, 0);
    const std::array<double, kMaxBits + 1>& dist = GaussianDistortion();
    using Item = std::pair<double, int64_t>;  // (gain, -bundle): the larger pops first
    std::priority_queue<Item> heap;
    for (uint32_t u = 0; u < bundles; ++u) {
      heap.push({bundle_var[u] * (1.0 - dist[1]), -int64_t{u}});
    }
    for (uint32_t left = params_.code_bits / kBundle; left > 0 && !heap.empty(); --left) {
      const auto [gain, neg_u] = heap.top();
      heap.pop();
      const auto u = static_cast<uint32_t>(-neg_u);
      const uint32_t b = ++bundle_bits[u];
      if (b < kMaxBits) heap.push({bundle_var[u] * (dist[b] - dist[b + 1]), neg_u});
    }
    for (uint32_t j = 0; j < d_; ++j) bits[order[j]] = static_cast<uint8_t>(bundle_bits[j / kBundle]);
  }

  const KlBlockRotation& RotationOf(uint32_t m) const {
    std::lock_guard<std::mutex> lock(rot_mu_);
    auto& r = rotations_[m];
    if (!r) r = std::make_unique<KlBlockRotation>(KlRotationOf(m));
    return *r;
  }

  Group Unpack(std::span<const uint8_t> meta) const {
    Group g;
    g.mean.resize(d_);
    g.scale.resize(d_);
    std::memcpy(&g.g, &meta[5 * d_], 4);
    for (uint32_t c = 0; c < d_; ++c) {
      g.mean[c] = HalfToFloat(LoadU16(&meta[d_ + 2 * c]));
      g.scale[c] = HalfToFloat(LoadU16(&meta[3 * d_ + 2 * c]));
      g.classes[meta[c]].push_back(c);
    }
    size_t at = norm_bytes_, row = 0;
    for (uint32_t b = 1; b <= kMaxBits; ++b) {
      const std::vector<uint32_t>& cls = g.classes[b];
      size_t taken = 0;
      for (uint32_t m = 1u << 15; m >= kBundle; m >>= 1) {
        if ((cls.size() & m) == 0) continue;
        const KlBlockRotation& cr = RotationOf(m);
        Block k;
        k.dim = m;
        k.channels = cls.data() + taken;
        k.planes_offset = at;
        k.row_offset = row;
        kernels::SubsetPlan& p = k.plan;
        p.dim = m;
        p.bits = b;
        p.rotation = RotationKind::kHadamard;
        p.signs1 = cr.signs.data();
        p.centroids = params_.subsets[b - 1].centroids.data();
        p.thresholds = thresholds_[b].data();
        p.enc_scale = cr.scale;
        p.dec_scale = cr.scale;
        p.norm_dtype = params_.norm_dtype;
        g.blocks.push_back(k);
        g.rotations.push_back({row, m, cr.signs.data()});
        taken += m;
        at += size_t{b} * m / 8;
        row += m;
      }
    }
    g.from_row.assign(d_, 0);
    g.a.resize(d_);
    g.b.assign(d_, 0.0f);
    for (uint32_t c = 0; c < d_; ++c) g.a[c] = g.mean[c] * g.g;
    for (const Block& k : g.blocks) {
      for (uint32_t j = 0; j < k.dim; ++j) {
        const uint32_t c = k.channels[j];
        g.from_row[c] = static_cast<uint32_t>(k.row_offset + j);
        g.b[c] = g.scale[c] * g.g;
        g.row_channel.push_back(c);
        g.row_mean.push_back(g.mean[c]);
        g.row_scale.push_back(g.scale[c]);
      }
    }
    return g;
  }

  // A vector's norm into its code (whose indices are then all 0 unless the norm is finite and
  // above 0). False when the stored norm would not fit f16.
  bool StoreNorm(const Group& g, float norm, uint8_t* code) const {
    const bool valid = norm > 0.0f && std::isfinite(norm);
    const float stored = std::isfinite(norm) ? norm / g.g : norm;  // exact: g a power of two
    bool fits = true;
    // A zero vector stores +0, one that is not finite the kernels' NaN (kernels.h).
    if (params_.norm_dtype == DType::kF32) {
      const uint32_t f = valid ? std::bit_cast<uint32_t>(stored) : norm == 0.0f ? 0u : 0x7FC00000u;
      std::memcpy(code, &f, 4);
    } else {
      const uint16_t h = valid ? FloatToHalf(stored) : norm == 0.0f ? uint16_t{0} : uint16_t{0x7E00};
      if ((h & 0x7FFFu) == 0x7C00u) fits = false;
      std::memcpy(code, &h, 2);
    }
    if (!valid) std::memset(code + norm_bytes_, 0, code_bytes_ - norm_bytes_);
    return fits;
  }

  Status DecodeImpl(std::span<const uint8_t> codes, size_t n, std::span<const uint8_t> meta,
                    const float* mean, const float* scale, void* out, DType dtype, size_t stride,
                    ThreadPool* pool) const {
    TQKV_RETURN_IF_ERROR(CheckVectors("Decode", out, dtype, n, stride, d_));
    TQKV_RETURN_IF_ERROR(CheckSpan("Decode input", codes.size(), n, code_bytes_));
    TQKV_RETURN_IF_ERROR(CheckGroupMeta(meta));
    const Group g = Unpack(meta);
    const auto& dec = kernels::ActiveKernels();
    const size_t pitch = stride * DTypeSize(dtype);
    std::vector<kernels::TransformCodeBlock> code_blocks;
    for (const Block& k : g.blocks) code_blocks.push_back({&k.plan, k.planes_offset});
    ParallelFor(pool, n, kGrain, [&](size_t b, size_t e) {
      const size_t cap = std::min(kBatch, e - b);
      // Scratch only for the routes through float buffers (SIMD stores: 16 floats of slack).
      std::vector<float> xf, cls_out, norms(cap);
      for (size_t start = b; start < e; start += kBatch) {
        const size_t cnt = std::min(kBatch, e - start);
        const uint8_t* code = codes.data() + start * code_bytes_;
        for (size_t i = 0; i < cnt; ++i) norms[i] = LoadNorm(code + i * code_bytes_);
        auto* dst = static_cast<uint8_t*>(out) + start * pitch;
        if (dec.transform_decode != nullptr &&  // the same elements, from the codes in one pass
            dec.transform_decode(code, code_bytes_, code_blocks.data(), g.rotations.data(),
                                 g.rotations.size(), g.from_row.data(), g.a.data(), g.b.data(),
                                 norms.data(), cnt, d_, mean,
                                 mean != nullptr ? scale + start : nullptr, dst, dtype, stride)) {
          continue;
        }
        if (xf.empty()) {
          xf.resize(cap * d_);
          cls_out.resize(cap * d_ + 16);
        }
        // Each block decodes into its own columns of a row (block order, contiguous); the row
        // then gathers into channel order.
        if (dec.dequantize != nullptr && dec.transform_assemble != nullptr) {  // the same floats
          for (const Block& k : g.blocks) {
            dec.dequantize(k.plan, code, code + k.planes_offset, code_bytes_, cnt,
                           cls_out.data() + k.row_offset, d_);
          }
          dec.transform_assemble(cls_out.data(), d_, g.rotations.data(), g.rotations.size(),
                                 g.from_row.data(), g.a.data(), g.b.data(), norms.data(), cnt, d_,
                                 xf.data(), d_);
        } else {
          for (const Block& k : g.blocks) {
            dec.decode(k.plan, code, code + k.planes_offset, code_bytes_, cnt,
                       cls_out.data() + k.row_offset, d_);
          }
          dec.gather_affine(cls_out.data(), d_, g.from_row.data(), g.a.data(), g.b.data(),
                            norms.data(), cnt, d_, xf.data(), d_);
        }
        if (mean != nullptr) dec.add_scaled(mean, scale + start, cnt, d_, xf.data(), d_);
        if (stride == d_) {
          dec.from_f32(xf.data(), cnt * d_, dtype, dst);
        } else {
          for (size_t i = 0; i < cnt; ++i) dec.from_f32(xf.data() + i * d_, d_, dtype, dst + i * pitch);
        }
      }
    });
    return Status::Ok();
  }

  float LoadNorm(const uint8_t* code) const {
    if (params_.norm_dtype == DType::kF32) {
      float f;
      std::memcpy(&f, code, 4);
      return f;
    }
    return HalfToFloat(LoadU16(code));
  }

  CodecParams params_;
  uint32_t d_ = 0;
  size_t norm_bytes_ = 0, code_bytes_ = 0;
  std::vector<float> thresholds_[kMaxBits + 1];  // [b]: 2^b - 1 midpoints
  double largest_centroid_[kMaxBits + 1] = {};   // [b]: max |centroid| of codebook b
  mutable std::mutex rot_mu_;
  mutable std::map<uint32_t, std::unique_ptr<KlBlockRotation>> rotations_;
};

}  // namespace

// Block k of m channels: the Hadamard rotation of m with seed DeriveSeed(kClassSeed, m), scaled
// by 1 / sqrt(m) to be orthonormal.
KlBlockRotation KlRotationOf(uint32_t m) {
  KlBlockRotation r;
  r.signs = MakeRotation(RotationKind::kHadamard, DeriveSeed(kClassSeed, m), m).signs1;
  r.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(m)));
  return r;
}

std::unique_ptr<Codec> MakeTransformCodec(const CodecParams& params) {
  return std::make_unique<TransformCodec>(params);
}

}  // namespace tqkv::codec
