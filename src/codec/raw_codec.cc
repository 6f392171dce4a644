// The raw codec: a code is head_dim elements of raw_dtype (fp16 / bf16 / fp32), little-endian.
#include <cstring>
#include <vector>

#include "codec/codec_internal.h"
#include "codec/kernels/kernels.h"
#include "tqkv/thread_pool.h"

namespace tqkv::codec {
namespace {

class RawCodec final : public Codec {
 public:
  explicit RawCodec(const CodecParams& params)
      : params_(params), code_bytes_(CodeBytesOf(params)) {}

  const CodecParams& params() const override { return params_; }
  size_t code_bytes() const override { return code_bytes_; }
  size_t group_meta_bytes() const override { return 0; }
  Status CheckGroupMeta(std::span<const uint8_t>) const override { return Status::Ok(); }

  Status SelectGroupMeta(const void* x, DType dtype, size_t n, size_t stride,
                         std::span<uint8_t> meta) const override {
    return CheckVectors("SelectGroupMeta", x, dtype, n, stride, params_.head_dim);
  }

  Status Encode(const void* x, DType dtype, size_t n, size_t stride, std::span<const uint8_t> meta,
                std::span<uint8_t> out, ThreadPool* pool) const override {
    TQKV_RETURN_IF_ERROR(CheckVectors("Encode", x, dtype, n, stride, params_.head_dim));
    TQKV_RETURN_IF_ERROR(CheckSpan("Encode output", out.size(), n, code_bytes_));
    const size_t d = params_.head_dim;
    const auto& k = kernels::ActiveKernels();
    const auto* src = static_cast<const uint8_t*>(x);
    const size_t in_pitch = stride * DTypeSize(dtype);
    uint8_t* dst = out.data();
    ParallelFor(pool, n, kGrain, [&](size_t b, size_t e) {
      // Codes carry no alignment guarantee: convert through aligned scratch, then memcpy.
      std::vector<float> tmp(dtype == params_.raw_dtype ? 0 : d);
      std::vector<float> staged(dtype == params_.raw_dtype ? 0 : d);
      for (size_t i = b; i < e; ++i) {
        if (dtype == params_.raw_dtype) {
          std::memcpy(dst + i * code_bytes_, src + i * in_pitch, code_bytes_);
        } else {
          k.to_f32(src + i * in_pitch, dtype, d, tmp.data());
          k.from_f32(tmp.data(), d, params_.raw_dtype, staged.data());
          std::memcpy(dst + i * code_bytes_, staged.data(), code_bytes_);
        }
      }
    });
    return Status::Ok();
  }

  Status Decode(std::span<const uint8_t> codes, size_t n, std::span<const uint8_t> meta, void* out,
                DType dtype, size_t stride, ThreadPool* pool) const override {
    TQKV_RETURN_IF_ERROR(CheckVectors("Decode", out, dtype, n, stride, params_.head_dim));
    TQKV_RETURN_IF_ERROR(CheckSpan("Decode input", codes.size(), n, code_bytes_));
    const size_t d = params_.head_dim;
    const auto& k = kernels::ActiveKernels();
    auto* dst = static_cast<uint8_t*>(out);
    const size_t out_pitch = stride * DTypeSize(dtype);
    const uint8_t* src = codes.data();
    ParallelFor(pool, n, kGrain, [&](size_t b, size_t e) {
      std::vector<float> tmp(dtype == params_.raw_dtype ? 0 : d);
      std::vector<float> staged(dtype == params_.raw_dtype ? 0 : d);
      for (size_t i = b; i < e; ++i) {
        if (dtype == params_.raw_dtype) {
          std::memcpy(dst + i * out_pitch, src + i * code_bytes_, code_bytes_);
        } else {
          std::memcpy(staged.data(), src + i * code_bytes_, code_bytes_);
          k.to_f32(staged.data(), params_.raw_dtype, d, tmp.data());
          k.from_f32(tmp.data(), d, dtype, dst + i * out_pitch);
        }
      }
    });
    return Status::Ok();
  }

 private:
  CodecParams params_;
  size_t code_bytes_;
};

}  // namespace

std::unique_ptr<Codec> MakeRawCodec(const CodecParams& params) {
  return std::make_unique<RawCodec>(params);
}

}  // namespace tqkv::codec
