// TurboQuant_mse (and optional TurboQuant_prod) over one or two channel subsets.
//
// Per vector, the code is: the norm of every subset (subset order), then every subset's bit-planes
// (subset order), then, with qjl, [f32 gamma][ceil(d/8) sign bytes]. The kernels do the per-subset
// arithmetic; this file converts dtypes, gathers/scatters the outlier split, runs QJL, and splits
// the work into batches over the thread pool.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "codec/codec_internal.h"
#include "codec/kernels/kernels.h"
#include "codec/plan.h"
#include "common/prng.h"
#include "tqkv/thread_pool.h"

namespace tqkv::codec {
namespace {

// Conversion scratch: 64-byte aligned, so the kernels' whole-register stores never split a cache
// line, and not zeroed (the kernels write every float before it is read).
class Scratch {
 public:
  explicit Scratch(size_t floats) : buf_(std::make_unique_for_overwrite<float[]>(floats + 16)) {}
  float* get() const {
    const auto p = reinterpret_cast<uintptr_t>(buf_.get());
    return reinterpret_cast<float*>((p + 63) & ~uintptr_t{63});
  }

 private:
  std::unique_ptr<float[]> buf_;
};

class TurboQuantCodec final : public Codec {
 public:
  explicit TurboQuantCodec(const CodecParams& params)
      : params_(params), plan_(CodecPlan::Build(params)) {
    const size_t d = params_.head_dim;
    code_bytes_ = plan_.code_bytes();
    meta_bytes_ = plan_.meta_bytes();
    for (size_t i = 0; i < plan_.subsets().size(); ++i) kplans_.push_back(plan_.KernelPlan(i));
    qjl_offset_ = plan_.qjl_offset();
    if (plan_.split()) {
      for (size_t s = 0; s < 2; ++s) {
        split_plan_.sub[s] = kplans_[s];
        split_plan_.norm_offset[s] = plan_.subsets()[s].norm_offset;
        split_plan_.planes_offset[s] = plan_.subsets()[s].planes_offset;
      }
    }
    if (params_.qjl) {
      Prng prng(params_.qjl_seed);
      qjl_s_.resize(d * d);
      for (auto& v : qjl_s_) v = static_cast<float>(prng.Gaussian());
    }
  }

  const CodecParams& params() const override { return params_; }
  size_t code_bytes() const override { return code_bytes_; }
  size_t group_meta_bytes() const override { return meta_bytes_; }
  Status CheckGroupMeta(std::span<const uint8_t> meta) const override {
    return plan_.CheckMask("Decode", meta);
  }

  Status SelectGroupMeta(const void* x, DType dtype, size_t n, size_t stride,
                         std::span<uint8_t> meta) const override {
    TQKV_RETURN_IF_ERROR(CheckVectors("SelectGroupMeta", x, dtype, n, stride, params_.head_dim));
    if (!params_.split()) return Status::Ok();
    if (meta.size() != meta_bytes_) {
      return Status::InvalidArgument("SelectGroupMeta: meta has " + std::to_string(meta.size()) +
                                     " bytes, need " + std::to_string(meta_bytes_));
    }
    const size_t d = params_.head_dim;
    std::vector<double> energy(d, 0.0);
    kernels::ActiveKernels().channel_energy(x, dtype, n, stride, d, energy.data());
    // NaN energies rank as +inf so the comparison stays a strict weak order.
    for (auto& e : energy) {
      if (std::isnan(e)) e = HUGE_VAL;
    }
    std::vector<uint32_t> order(d);
    std::iota(order.begin(), order.end(), 0u);
    const size_t outliers = params_.subsets[0].channels;
    std::partial_sort(order.begin(), order.begin() + outliers, order.end(),
                      [&](uint32_t a, uint32_t b) {
                        return energy[a] > energy[b] || (energy[a] == energy[b] && a < b);
                      });
    std::fill(meta.begin(), meta.end(), uint8_t{0});
    for (size_t i = 0; i < outliers; ++i) meta[order[i] / 8] |= uint8_t(1u << (order[i] % 8));
    return Status::Ok();
  }

  Status Encode(const void* x, DType dtype, size_t n, size_t stride, std::span<const uint8_t> meta,
                std::span<uint8_t> out, ThreadPool* pool) const override {
    TQKV_RETURN_IF_ERROR(CheckVectors("Encode", x, dtype, n, stride, params_.head_dim));
    TQKV_RETURN_IF_ERROR(CheckSpan("Encode output", out.size(), n, code_bytes_));
    TQKV_RETURN_IF_ERROR(plan_.CheckMask("Encode", meta));
    const auto& k = kernels::ActiveKernels();
    const size_t d = params_.head_dim;
    const size_t in_pitch = stride * DTypeSize(dtype);
    const auto* src = static_cast<const uint8_t*>(x);
    uint8_t* codes = out.data();
    // f32 input goes straight to the kernels (no copy).
    const bool direct = dtype == DType::kF32;
    ParallelFor(pool, n, kGrain, [&](size_t b, size_t e) {
      if (params_.split()) {  // the split kernel converts each vector itself
        // A non-finite input makes the whole vector invalid, not just the subset holding it.
        // Checked per piece, while its codes are still in L1/L2 (after the whole range they
        // came back from memory).
        for (size_t p = b; p < e; p += kSplitPiece) {
          const size_t pe = std::min(e, p + kSplitPiece);
          k.split_encode(split_plan_, src + p * in_pitch, dtype, stride, pe - p, meta.data(),
                         codes + p * code_bytes_, code_bytes_);
          for (size_t i = p; i < pe; ++i) PoisonIfAnyNaN(codes + i * code_bytes_);
        }
        return;
      }
      const PlannedSubset& sub = plan_.subsets()[0];
      if (!params_.qjl) {  // the kernels convert each vector themselves where they can
        uint8_t* code = codes + b * code_bytes_;
        kernels::EncodeFrom(k, kplans_[0], src + b * in_pitch, dtype, stride, e - b,
                            code + sub.norm_offset, code + sub.planes_offset, code_bytes_);
        return;
      }
      // QJL also needs each vector as floats: convert in batches here.
      Scratch xf(direct ? 0 : std::min(kBatch, e - b) * d);
      std::vector<float> qjl_scratch(2 * d);
      for (size_t start = b; start < e; start += kBatch) {
        const size_t cnt = std::min(kBatch, e - start);
        const float* xs;
        size_t xs_stride;
        if (direct) {
          xs = reinterpret_cast<const float*>(src + start * in_pitch);
          xs_stride = stride;
        } else {
          if (stride == d) {  // contiguous: one conversion call for the batch
            k.to_f32(src + start * in_pitch, dtype, cnt * d, xf.get());
          } else {
            for (size_t i = 0; i < cnt; ++i) {
              k.to_f32(src + (start + i) * in_pitch, dtype, d, xf.get() + i * d);
            }
          }
          xs = xf.get();
          xs_stride = d;
        }
        uint8_t* code = codes + start * code_bytes_;
        k.encode(kplans_[0], xs, xs_stride, cnt, code + sub.norm_offset, code + sub.planes_offset,
                 code_bytes_);
        for (size_t i = 0; i < cnt; ++i) {
          QjlEncode(k, xs + i * xs_stride, code + i * code_bytes_, qjl_scratch.data());
        }
      }
    });
    return CheckF16Norms(out.data(), n);
  }

  Status Decode(std::span<const uint8_t> codes, size_t n, std::span<const uint8_t> meta, void* out,
                DType dtype, size_t stride, ThreadPool* pool) const override {
    return DecodeImpl(codes, n, meta, nullptr, nullptr, out, dtype, stride, pool);
  }
  Status DecodeAdd(std::span<const uint8_t> codes, size_t n, std::span<const uint8_t> meta,
                   std::span<const float> mean, std::span<const float> scale, void* out,
                   DType dtype, size_t stride, ThreadPool* pool) const override {
    TQKV_RETURN_IF_ERROR(CheckMeanScale(mean.size(), scale.size(), params_.head_dim, n));
    return DecodeImpl(codes, n, meta, mean.data(), scale.data(), out, dtype, stride, pool);
  }

 private:
  // mean/scale: null, or x_ij += scale_i · mean_j on each decoded vector before the conversion.
  Status DecodeImpl(std::span<const uint8_t> codes, size_t n, std::span<const uint8_t> meta,
                    const float* mean, const float* scale, void* out, DType dtype, size_t stride,
                    ThreadPool* pool) const {
    TQKV_RETURN_IF_ERROR(CheckVectors("Decode", out, dtype, n, stride, params_.head_dim));
    TQKV_RETURN_IF_ERROR(CheckSpan("Decode input", codes.size(), n, code_bytes_));
    TQKV_RETURN_IF_ERROR(CheckGroupMeta(meta));
    const auto& k = kernels::ActiveKernels();
    const size_t d = params_.head_dim;
    const size_t out_pitch = stride * DTypeSize(dtype);
    auto* dst = static_cast<uint8_t*>(out);
    const uint8_t* in = codes.data();
    const bool direct = dtype == DType::kF32;
    ParallelFor(pool, n, kGrain, [&](size_t b, size_t e) {
      if (params_.split() && mean == nullptr) {  // the split kernel converts each vector itself
        k.split_decode(split_plan_, in + b * code_bytes_, code_bytes_, e - b, meta.data(),
                       dst + b * out_pitch, dtype, stride);
        return;
      }
      if (!params_.split() && !params_.qjl) {  // conversion (and key means) in the kernels
        const PlannedSubset& sub = plan_.subsets()[0];
        const uint8_t* code = in + b * code_bytes_;
        kernels::DecodeTo(k, kplans_[0], code + sub.norm_offset, code + sub.planes_offset,
                          code_bytes_, e - b, mean, mean != nullptr ? scale + b : nullptr,
                          dst + b * out_pitch, dtype, stride);
        return;
      }
      Scratch xf(direct ? 0 : std::min(kBatch, e - b) * d);
      for (size_t start = b; start < e; start += kBatch) {
        const size_t cnt = std::min(kBatch, e - start);
        const uint8_t* code = in + start * code_bytes_;
        float* xs;
        size_t xs_stride;
        if (direct) {
          xs = reinterpret_cast<float*>(dst + start * out_pitch);
          xs_stride = stride;
        } else {
          xs = xf.get();
          xs_stride = d;
        }
        if (params_.split()) {
          k.split_decode(split_plan_, code, code_bytes_, cnt, meta.data(), xs, DType::kF32,
                         xs_stride);
        } else {
          const PlannedSubset& sub = plan_.subsets()[0];
          k.decode(kplans_[0], code + sub.norm_offset, code + sub.planes_offset, code_bytes_, cnt,
                   xs, xs_stride);
        }
        if (params_.qjl) {
          for (size_t i = 0; i < cnt; ++i) QjlAdd(code + i * code_bytes_, xs + i * xs_stride);
        }
        if (mean != nullptr) k.add_scaled(mean, scale + start, cnt, d, xs, xs_stride);
        if (!direct) {
          if (stride == d) {
            k.from_f32(xs, cnt * d, dtype, dst + start * out_pitch);
          } else {
            for (size_t i = 0; i < cnt; ++i) {
              k.from_f32(xs + i * d, d, dtype, dst + (start + i) * out_pitch);
            }
          }
        }
      }
    });
    return Status::Ok();
  }

  // If any subset's stored norm is NaN, stores NaN as every subset's norm.
  // norm=f16 holds norms below 65520 only: a larger one would be stored as inf and decode to a
  // NaN of the machine's arithmetic. Refused, naming the fix, rather than written.
  Status CheckF16Norms(const uint8_t* codes, size_t n) const {
    if (params_.norm_dtype != DType::kF16) return Status::Ok();
    for (size_t i = 0; i < n; ++i) {
      for (size_t s = 0; s < kplans_.size(); ++s) {
        uint16_t h;
        std::memcpy(&h, codes + i * code_bytes_ + s * 2, 2);
        if ((h & 0x7FFFu) == 0x7C00u) {
          return Status::InvalidArgument(
              "Encode: vector " + std::to_string(i) + " has a norm of 65520 or more, beyond what "
              "norm=f16 stores (f16's largest finite value is 65504); use norm=f32 (the default)");
        }
      }
    }
    return Status::Ok();
  }

  void PoisonIfAnyNaN(uint8_t* code) const {
    const size_t nb = DTypeSize(params_.norm_dtype);
    bool nan = false;
    for (size_t s = 0; s < kplans_.size(); ++s) {
      if (nb == 4) {
        float f;
        std::memcpy(&f, code + s * nb, 4);
        nan |= std::isnan(f);
      } else {
        uint16_t h;
        std::memcpy(&h, code + s * nb, 2);
        nan |= std::isnan(HalfToFloat(h));
      }
    }
    if (!nan) return;
    for (size_t s = 0; s < kplans_.size(); ++s) {
      if (nb == 4) {
        const uint32_t f = 0x7FC00000u;  // the kernels' NaN norm bytes (kernels.h)
        std::memcpy(code + s * nb, &f, 4);
      } else {
        const uint16_t h = 0x7E00;
        std::memcpy(code + s * nb, &h, 2);
      }
    }
  }

  // QJL of the residual r = x - DeQuant_mse(code): gamma = |r| (f32), sign bits of S r.
  void QjlEncode(const kernels::KernelTable& k, const float* x, uint8_t* code,
                 float* scratch) const {
    const size_t d = params_.head_dim;
    const PlannedSubset& sub = plan_.subsets()[0];
    float* xhat = scratch;
    float* r = scratch + d;
    k.decode(kplans_[0], code + sub.norm_offset, code + sub.planes_offset, code_bytes_, 1, xhat, d);
    for (size_t j = 0; j < d; ++j) r[j] = x[j] - xhat[j];
    // In float like the kernels' norms: a denormal-only residual has gamma 0, an overflowing one
    // gamma inf (the mse norm is then NaN already).
    const float gamma = std::sqrt(kernels::ref::Sum8Squares(r, d));
    std::memcpy(code + qjl_offset_, &gamma, 4);
    uint8_t* signs = code + qjl_offset_ + 4;
    std::memset(signs, 0, (d + 7) / 8);
    for (size_t i = 0; i < d; ++i) {
      const float* row = &qjl_s_[i * d];
      double dot = 0.0;
      for (size_t j = 0; j < d; ++j) dot += static_cast<double>(row[j]) * r[j];
      if (dot >= 0.0) signs[i / 8] |= uint8_t(1u << (i % 8));
    }
  }

  // x += sqrt(pi/2)/d * gamma * S^T z, z_i = +1 (bit set) or -1.
  void QjlAdd(const uint8_t* code, float* x) const {
    const size_t d = params_.head_dim;
    float gamma;
    std::memcpy(&gamma, code + qjl_offset_, 4);
    const uint8_t* signs = code + qjl_offset_ + 4;
    const double scale = std::sqrt(3.14159265358979323846 / 2.0) / static_cast<double>(d) * gamma;
    std::vector<double> acc(d, 0.0);
    for (size_t i = 0; i < d; ++i) {
      const double z = ((signs[i / 8] >> (i % 8)) & 1u) ? 1.0 : -1.0;
      const float* row = &qjl_s_[i * d];
      for (size_t j = 0; j < d; ++j) acc[j] += z * row[j];
    }
    for (size_t j = 0; j < d; ++j) x[j] = static_cast<float>(x[j] + scale * acc[j]);
  }

  CodecParams params_;
  size_t code_bytes_ = 0;
  size_t meta_bytes_ = 0;
  size_t qjl_offset_ = 0;
  CodecPlan plan_;                          // owns every array kplans_ points into
  std::vector<kernels::SubsetPlan> kplans_;  // plan_.KernelPlan(i)
  kernels::SplitPlan split_plan_;            // split codecs: kplans_ and the subsets' offsets
  std::vector<float> qjl_s_;     // QJL matrix S, d*d row-major
};

}  // namespace

std::unique_ptr<Codec> MakeTurboQuantCodec(const CodecParams& params) {
  return std::make_unique<TurboQuantCodec>(params);
}

}  // namespace tqkv::codec
