// Scalar reference kernels: the arithmetic kernels.h fixes, written out plainly.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "codec/kernels/internal.h"
#include "codec/kernels/kernels.h"

namespace tqkv::kernels {
namespace ref {

float Sum8Squares(const float* v, size_t m) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < m; ++i) {
    const float p = v[i] * v[i];  // rounded before the add: no contraction
    acc[i % 8] += p;
  }
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

void Fwht(float* y, size_t m) {
  for (size_t h = 1; h < m; h <<= 1) {
    for (size_t i = 0; i + h < m; ++i) {  // the bound only guards a misuse with m not 2^k
      if (i & h) continue;
      const float a = y[i];
      const float b = y[i + h];
      y[i] = a + b;
      y[i + h] = a - b;
    }
  }
}

void MatVecT(const float* mt, const float* x, size_t m, float* y) {
  std::fill(y, y + m, 0.0f);
  for (size_t i = 0; i < m; ++i) {
    const float xi = x[i];
    const float* row = mt + i * m;
    for (size_t j = 0; j < m; ++j) y[j] = std::fma(row[j], xi, y[j]);
  }
}

void KronMix(const float* mt, const float* x, size_t q, size_t block, float* y) {
  for (size_t a = 0; a < q; ++a) {
    for (size_t b = 0; b < block; ++b) {
      float acc = 0.0f;
      for (size_t a2 = 0; a2 < q; ++a2) acc = std::fma(mt[a2 * q + a], x[a2 * block + b], acc);
      y[a * block + b] = acc;
    }
  }
}

uint32_t Quantize(float z, const float* thresholds, uint32_t bits) {
  const uint32_t count = (1u << bits) - 1;
  if (bits >= 5) {
    // Thresholds ascend, so the count of t < z is the first index with !(t < z); NaN gives 0.
    uint32_t lo = 0, hi = count;
    while (lo < hi) {
      const uint32_t mid = (lo + hi) / 2;
      if (thresholds[mid] < z) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }
  uint32_t n = 0;
  for (uint32_t k = 0; k < count; ++k) n += thresholds[k] < z ? 1u : 0u;
  return n;
}

void PackPlanes(const uint8_t* idx, size_t m, uint32_t bits, uint8_t* planes) {
  const size_t pb = (m + 7) / 8;
  std::memset(planes, 0, bits * pb);
  for (uint32_t p = 0; p < bits; ++p) {
    uint8_t* plane = planes + p * pb;
    for (size_t j = 0; j < m; ++j) {
      plane[j / 8] |= static_cast<uint8_t>(((idx[j] >> p) & 1u) << (j % 8));
    }
  }
}

void UnpackPlanes(const uint8_t* planes, size_t m, uint32_t bits, uint8_t* idx) {
  const size_t pb = (m + 7) / 8;
  std::memset(idx, 0, m);
  for (uint32_t p = 0; p < bits; ++p) {
    const uint8_t* plane = planes + p * pb;
    for (size_t j = 0; j < m; ++j) {
      idx[j] |= static_cast<uint8_t>(((plane[j / 8] >> (j % 8)) & 1u) << p);
    }
  }
}

void GatherAffine(const float* row, size_t row_stride, const uint32_t* from, const float* a,
                  const float* b, const float* norms, size_t n, size_t d, float* out,
                  size_t out_stride) {
  for (size_t i = 0; i < n; ++i) {
    const float* r = row + i * row_stride;
    float* o = out + i * out_stride;
    for (size_t c = 0; c < d; ++c) {
      const float base = a[c] * norms[i];
      const float step = b[c] * r[from[c]];
      o[c] = base + step;
    }
  }
}

void Dequantize(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
                size_t code_stride, size_t n, float* out, size_t out_stride) {
  const size_t m = plan.dim;
  std::vector<uint8_t> idx(m);
  for (size_t k = 0; k < n; ++k) {
    float* o = out + k * out_stride;
    const float a = internal::LoadNorm(norm_in + k * code_stride, plan.norm_dtype) * plan.dec_scale;
    UnpackPlanes(planes_in + k * code_stride, m, plan.bits, idx.data());
    for (size_t j = 0; j < m; ++j) o[j] = plan.centroids[idx[j]] * a;
  }
}

void TransformAssemble(float* row, size_t row_stride, const TransformBlock* blocks, size_t nblocks,
                       const uint32_t* from, const float* a, const float* b, const float* norms,
                       size_t n, size_t d, float* out, size_t out_stride) {
  for (size_t i = 0; i < n; ++i) {
    float* r = row + i * row_stride;
    for (size_t k = 0; k < nblocks; ++k) {
      float* v = r + blocks[k].offset;
      Fwht(v, blocks[k].dim);
      for (uint32_t j = 0; j < blocks[k].dim; ++j) v[j] = v[j] * blocks[k].signs[j];
    }
  }
  GatherAffine(row, row_stride, from, a, b, norms, n, d, out, out_stride);
}

}  // namespace ref

namespace {

using internal::LoadNorm;
using internal::StoreNorm;

void MulSigns(float* y, const float* signs, size_t m) {
  for (size_t j = 0; j < m; ++j) y[j] *= signs[j];
}

void ToF32(const void* src, DType dtype, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = LoadAsFloat(src, dtype, i);
}

void FromF32(const float* src, size_t n, DType dtype, void* dst) {
  for (size_t i = 0; i < n; ++i) StoreFromFloat(dst, dtype, i, src[i]);
}

// The indices of one vector of the plan with its norm (finite, not 0): rotation, the multiply by
// enc_scale / norm, Quantize. Returns the norm to store (norm correction applied).
float EncodeIndices(const SubsetPlan& plan, const float* xv, float norm, float* y, float* tmp,
                    uint8_t* idx) {
  const size_t m = plan.dim;
  switch (plan.rotation) {
    case RotationKind::kHaar:
      ref::MatVecT(plan.haar_t, xv, m, y);
      break;
    case RotationKind::kKronecker:
      for (size_t j = 0; j < m; ++j) tmp[j] = xv[j] * plan.signs1[j];
      for (size_t j = 0; j < m; j += plan.block) ref::Fwht(tmp + j, plan.block);
      ref::KronMix(plan.haar_t, tmp, m / plan.block, plan.block, y);
      break;
    case RotationKind::kHadamard2:
    case RotationKind::kHadamard:
    default:
      for (size_t j = 0; j < m; ++j) y[j] = xv[j] * plan.signs1[j];
      ref::Fwht(y, m);
      if (plan.rotation == RotationKind::kHadamard2) {
        MulSigns(y, plan.signs2, m);
        ref::Fwht(y, m);
      }
      break;
  }
  const float s = plan.enc_scale / norm;
  for (size_t j = 0; j < m; ++j) {
    idx[j] = static_cast<uint8_t>(ref::Quantize(y[j] * s, plan.thresholds, plan.bits));
  }
  if (!plan.norm_correction) return norm;
  for (size_t j = 0; j < m; ++j) tmp[j] = plan.centroids[idx[j]];
  return norm * std::sqrt(static_cast<float>(m) / ref::Sum8Squares(tmp, m));
}

void Encode(const SubsetPlan& plan, const float* x, size_t x_stride, size_t n, uint8_t* norm_out,
            uint8_t* planes_out, size_t code_stride) {
  const size_t m = plan.dim;
  std::vector<float> y(m), tmp(m);
  std::vector<uint8_t> idx(m);
  for (size_t v = 0; v < n; ++v) {
    const float* xv = x + v * x_stride;
    const float norm = std::sqrt(ref::Sum8Squares(xv, m));
    float stored = norm;
    if (norm == 0.0f || !std::isfinite(norm)) {
      std::fill(idx.begin(), idx.end(), uint8_t{0});
      stored = norm == 0.0f ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    } else {
      stored = EncodeIndices(plan, xv, norm, y.data(), tmp.data(), idx.data());
    }
    StoreNorm(stored, plan.norm_dtype, norm_out + v * code_stride);
    ref::PackPlanes(idx.data(), m, plan.bits, planes_out + v * code_stride);
  }
}

void EncodeUnit(const SubsetPlan& plan, const float* x, size_t x_stride, size_t n,
                uint8_t* planes_out, size_t code_stride) {
  const size_t m = plan.dim;
  std::vector<float> y(m), tmp(m);
  std::vector<uint8_t> idx(m);
  for (size_t v = 0; v < n; ++v) {
    EncodeIndices(plan, x + v * x_stride, 1.0f, y.data(), tmp.data(), idx.data());
    ref::PackPlanes(idx.data(), m, plan.bits, planes_out + v * code_stride);
  }
}

void Whiten(const float* x, size_t x_stride, size_t n, size_t d, const uint32_t* channel,
            const float* mean, const float* scale, size_t rows, float* norms, float* w,
            size_t w_stride) {
  for (size_t i = 0; i < n; ++i) {
    const float* xv = x + i * x_stride;
    const float norm = std::sqrt(ref::Sum8Squares(xv, d));
    norms[i] = norm;
    for (size_t r = 0; r < rows; ++r) {
      const float u = xv[channel[r]] / norm;
      w[i * w_stride + r] = scale[r] > 0.0f ? (u - mean[r]) / scale[r] : 0.0f;
    }
  }
}

void UnitMoments(const float* x, size_t x_stride, size_t n, size_t d, double* s1, double* s2,
                 size_t* count, float* largest) {
  for (size_t i = 0; i < n; ++i) {
    const float* xv = x + i * x_stride;
    const float norm = std::sqrt(ref::Sum8Squares(xv, d));
    if (!(norm > 0.0f) || !std::isfinite(norm)) continue;
    ++*count;
    *largest = std::max(*largest, norm);
    for (size_t c = 0; c < d; ++c) {
      const double u = xv[c] / norm;
      s1[c] += u;
      s2[c] += u * u;
    }
  }
}

void Decode(const SubsetPlan& plan, const uint8_t* norm_in, const uint8_t* planes_in,
            size_t code_stride, size_t n, float* out, size_t out_stride) {
  const size_t m = plan.dim;
  std::vector<float> v(m), u(m);
  std::vector<uint8_t> idx(m);
  for (size_t k = 0; k < n; ++k) {
    float* o = out + k * out_stride;
    const float a = LoadNorm(norm_in + k * code_stride, plan.norm_dtype) * plan.dec_scale;
    ref::UnpackPlanes(planes_in + k * code_stride, m, plan.bits, idx.data());
    for (size_t j = 0; j < m; ++j) v[j] = plan.centroids[idx[j]] * a;
    switch (plan.rotation) {
      case RotationKind::kHaar:
        ref::MatVecT(plan.haar, v.data(), m, o);
        break;
      case RotationKind::kKronecker:
        ref::KronMix(plan.haar, v.data(), m / plan.block, plan.block, u.data());
        for (size_t j = 0; j < m; j += plan.block) ref::Fwht(u.data() + j, plan.block);
        for (size_t j = 0; j < m; ++j) o[j] = u[j] * plan.signs1[j];
        break;
      case RotationKind::kHadamard2:
      case RotationKind::kHadamard:
      default:
        ref::Fwht(v.data(), m);
        if (plan.rotation == RotationKind::kHadamard2) {
          MulSigns(v.data(), plan.signs2, m);
          ref::Fwht(v.data(), m);
        }
        for (size_t j = 0; j < m; ++j) o[j] = v[j] * plan.signs1[j];
        break;
    }
  }
}

// No whole bytes: every channel one by one.
void SplitGather(const float* x, size_t x_stride, size_t n, const uint8_t* mask, size_t d,
                 float* out0, size_t m0, float* out1, size_t m1) {
  internal::SplitGatherWalk(x, x_stride, n, mask, d, 0, out0, m0, out1, m1,
                            [](const float*, uint8_t, float*, float*) {});
}

void SplitScatter(const float* in0, size_t m0, const float* in1, size_t m1, size_t n,
                  const uint8_t* mask, size_t d, float* x, size_t x_stride) {
  internal::SplitScatterWalk(in0, m0, in1, m1, n, mask, d, 0, x, x_stride,
                             [](float*, uint8_t, const float*, const float*) {});
}

void SplitEncode(const SplitPlan& plan, const void* x, DType dtype, size_t x_stride, size_t n,
                 const uint8_t* mask, uint8_t* code, size_t code_stride) {
  const size_t m0 = plan.sub[0].dim, m1 = plan.sub[1].dim, d = m0 + m1;
  std::vector<float> xf(d), g0(m0 + kSplitSlack), g1(m1 + kSplitSlack);
  const auto* src = static_cast<const uint8_t*>(x);
  for (size_t i = 0; i < n; ++i) {
    ToF32(src + i * x_stride * DTypeSize(dtype), dtype, d, xf.data());
    SplitGather(xf.data(), d, 1, mask, d, g0.data(), m0, g1.data(), m1);
    uint8_t* c = code + i * code_stride;
    Encode(plan.sub[0], g0.data(), m0, 1, c + plan.norm_offset[0], c + plan.planes_offset[0],
           code_stride);
    Encode(plan.sub[1], g1.data(), m1, 1, c + plan.norm_offset[1], c + plan.planes_offset[1],
           code_stride);
  }
}

void SplitDecode(const SplitPlan& plan, const uint8_t* code, size_t code_stride, size_t n,
                 const uint8_t* mask, void* x, DType dtype, size_t x_stride) {
  const size_t m0 = plan.sub[0].dim, m1 = plan.sub[1].dim, d = m0 + m1;
  std::vector<float> xf(d), g0(m0 + kSplitSlack), g1(m1 + kSplitSlack);
  auto* dst = static_cast<uint8_t*>(x);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* c = code + i * code_stride;
    Decode(plan.sub[0], c + plan.norm_offset[0], c + plan.planes_offset[0], code_stride, 1,
           g0.data(), m0);
    Decode(plan.sub[1], c + plan.norm_offset[1], c + plan.planes_offset[1], code_stride, 1,
           g1.data(), m1);
    SplitScatter(g0.data(), m0, g1.data(), m1, 1, mask, d, xf.data(), d);
    FromF32(xf.data(), d, dtype, dst + i * x_stride * DTypeSize(dtype));
  }
}

void ChannelEnergy(const void* x, DType dtype, size_t n, size_t stride, size_t d,
                   double* energy) {
  std::vector<float> row(d);
  const auto* src = static_cast<const uint8_t*>(x);
  for (size_t i = 0; i < n; ++i) {
    ToF32(src + i * stride * DTypeSize(dtype), dtype, d, row.data());
    for (size_t c = 0; c < d; ++c) {
      energy[c] += static_cast<double>(row[c]) * static_cast<double>(row[c]);
    }
  }
}

void AddScaled(const float* mean, const float* scale, size_t n, size_t d, float* x,
               size_t x_stride) {
  for (size_t i = 0; i < n; ++i) {
    float* xv = x + i * x_stride;
    const float a = scale[i];
    for (size_t j = 0; j < d; ++j) xv[j] += a * mean[j];  // -ffp-contract=off: no fma
  }
}

}  // namespace

const KernelTable& ScalarKernels() {
  static const KernelTable table{"scalar", ToF32, FromF32, Encode, Decode, SplitGather,
                                 SplitScatter, SplitEncode, SplitDecode, ChannelEnergy,
                                 AddScaled, nullptr, nullptr, ref::GatherAffine,
                                 ref::Dequantize, ref::TransformAssemble, nullptr, EncodeUnit,
                                 Whiten, UnitMoments};
  return table;
}

}  // namespace tqkv::kernels
