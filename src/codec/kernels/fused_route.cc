// EncodeFrom / DecodeTo: a table's fused kernels where it has them, otherwise its conversions and
// float kernels over batches of vectors in one buffer (the route every table had before).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "codec/codec_internal.h"
#include "codec/kernels/kernels.h"

namespace tqkv::kernels {
namespace {

// 64-byte aligned floats, not zeroed (every float is written before it is read).
class FloatBuffer {
 public:
  explicit FloatBuffer(size_t floats)
      : buf_(std::make_unique_for_overwrite<float[]>(floats + 16)) {}
  float* get() const {
    const auto p = reinterpret_cast<uintptr_t>(buf_.get());
    return reinterpret_cast<float*>((p + 63) & ~uintptr_t{63});
  }

 private:
  std::unique_ptr<float[]> buf_;
};

}  // namespace

void EncodeFrom(const KernelTable& k, const SubsetPlan& plan, const void* x, DType dtype,
                size_t x_stride, size_t n, uint8_t* norm_out, uint8_t* planes_out,
                size_t code_stride) {
  if (k.encode_from != nullptr) {
    return k.encode_from(plan, x, dtype, x_stride, n, norm_out, planes_out, code_stride);
  }
  if (dtype == DType::kF32) {
    return k.encode(plan, static_cast<const float*>(x), x_stride, n, norm_out, planes_out,
                    code_stride);
  }
  const size_t d = plan.dim, pitch = x_stride * DTypeSize(dtype);
  const auto* src = static_cast<const uint8_t*>(x);
  FloatBuffer xf(std::min(codec::kBatch, n) * d);
  for (size_t start = 0; start < n; start += codec::kBatch) {
    const size_t cnt = std::min(codec::kBatch, n - start);
    if (x_stride == d) {  // contiguous: one conversion call for the batch
      k.to_f32(src + start * pitch, dtype, cnt * d, xf.get());
    } else {
      for (size_t i = 0; i < cnt; ++i) {
        k.to_f32(src + (start + i) * pitch, dtype, d, xf.get() + i * d);
      }
    }
    k.encode(plan, xf.get(), d, cnt, norm_out + start * code_stride,
             planes_out + start * code_stride, code_stride);
  }
}

void DecodeTo(const KernelTable& k, const SubsetPlan& plan, const uint8_t* norm_in,
              const uint8_t* planes_in, size_t code_stride, size_t n, const float* mean,
              const float* scale, void* out, DType dtype, size_t out_stride) {
  if (k.decode_to != nullptr) {
    return k.decode_to(plan, norm_in, planes_in, code_stride, n, mean, scale, out, dtype,
                       out_stride);
  }
  const size_t d = plan.dim, pitch = out_stride * DTypeSize(dtype);
  auto* dst = static_cast<uint8_t*>(out);
  if (dtype == DType::kF32) {  // straight into the output
    k.decode(plan, norm_in, planes_in, code_stride, n, static_cast<float*>(out), out_stride);
    if (mean != nullptr) k.add_scaled(mean, scale, n, d, static_cast<float*>(out), out_stride);
    return;
  }
  FloatBuffer xf(std::min(codec::kBatch, n) * d);
  for (size_t start = 0; start < n; start += codec::kBatch) {
    const size_t cnt = std::min(codec::kBatch, n - start);
    k.decode(plan, norm_in + start * code_stride, planes_in + start * code_stride, code_stride, cnt,
             xf.get(), d);
    if (mean != nullptr) k.add_scaled(mean, scale + start, cnt, d, xf.get(), d);
    if (out_stride == d) {
      k.from_f32(xf.get(), cnt * d, dtype, dst + start * pitch);
    } else {
      for (size_t i = 0; i < cnt; ++i) {
        k.from_f32(xf.get() + i * d, d, dtype, dst + (start + i) * pitch);
      }
    }
  }
}

namespace {

constexpr size_t kSplitChunk = 16;  // vectors per step of the batch-wise split route

// step(first vector, count, f32 rows, subset 0 floats, subset 1 floats) over chunks of
// kSplitChunk vectors.
template <typename Step>
void SplitBatches(const SplitPlan& sp, size_t n, Step&& step) {
  const size_t d = sp.sub[0].dim + sp.sub[1].dim;
  std::vector<float> xf(kSplitChunk * d);
  std::vector<float> g0(kSplitChunk * sp.sub[0].dim + kSplitSlack);
  std::vector<float> g1(kSplitChunk * sp.sub[1].dim + kSplitSlack);
  for (size_t i = 0; i < n; i += kSplitChunk) {
    step(i, std::min(kSplitChunk, n - i), xf.data(), g0.data(), g1.data());
  }
}

}  // namespace

void SplitEncodeBatched(const KernelTable& k, const SplitPlan& sp, const void* x, DType dtype,
                        size_t x_stride, size_t n, const uint8_t* mask, uint8_t* code,
                        size_t code_stride) {
  if (n == 0) return;
  const size_t m0 = sp.sub[0].dim, m1 = sp.sub[1].dim, d = m0 + m1;
  const size_t pitch = x_stride * DTypeSize(dtype);
  const auto* src = static_cast<const uint8_t*>(x);
  SplitBatches(sp, n, [&](size_t i, size_t cnt, float* xf, float* g0, float* g1) {
    for (size_t r = 0; r < cnt; ++r) k.to_f32(src + (i + r) * pitch, dtype, d, xf + r * d);
    uint8_t* c = code + i * code_stride;
    k.split_gather(xf, d, cnt, mask, d, g0, m0, g1, m1);
    k.encode(sp.sub[0], g0, m0, cnt, c + sp.norm_offset[0], c + sp.planes_offset[0], code_stride);
    k.encode(sp.sub[1], g1, m1, cnt, c + sp.norm_offset[1], c + sp.planes_offset[1], code_stride);
  });
}

void SplitDecodeBatched(const KernelTable& k, const SplitPlan& sp, const uint8_t* code,
                        size_t code_stride, size_t n, const uint8_t* mask, void* x, DType dtype,
                        size_t x_stride) {
  if (n == 0) return;
  const size_t m0 = sp.sub[0].dim, m1 = sp.sub[1].dim, d = m0 + m1;
  const size_t pitch = x_stride * DTypeSize(dtype);
  auto* dst = static_cast<uint8_t*>(x);
  SplitBatches(sp, n, [&](size_t i, size_t cnt, float* xf, float* g0, float* g1) {
    const uint8_t* c = code + i * code_stride;
    k.decode(sp.sub[0], c + sp.norm_offset[0], c + sp.planes_offset[0], code_stride, cnt, g0, m0);
    k.decode(sp.sub[1], c + sp.norm_offset[1], c + sp.planes_offset[1], code_stride, cnt, g1, m1);
    k.split_scatter(g0, m0, g1, m1, cnt, mask, d, xf, d);
    for (size_t r = 0; r < cnt; ++r) k.from_f32(xf + r * d, d, dtype, dst + (i + r) * pitch);
  });
}

}  // namespace tqkv::kernels
