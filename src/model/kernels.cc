#include "model/kernels.h"

#include <cmath>
#include <cstring>

#include "tqkv/types.h"

namespace tqkv::model {
namespace {

inline float LoadHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}

template <GgmlType kType>
void QuantDotRef(const uint8_t* w_row, const BlockQ8x4* acts, size_t nblocks, size_t n_tokens,
                 float* out, size_t out_stride) {
  constexpr size_t kBlockBytes = kType == GgmlType::kQ4_0   ? sizeof(BlockQ4_0)
                                 : kType == GgmlType::kQ4_1 ? sizeof(BlockQ4_1)
                                                            : sizeof(BlockQ8_0);
  for (size_t t = 0; t < n_tokens; ++t) {
    const BlockQ8x4* a = acts + (t / 4) * nblocks;
    const size_t lane = t % 4;
    float acc = 0.0f;
    for (size_t b = 0; b < nblocks; ++b) {
      const uint8_t* w = w_row + b * kBlockBytes;
      const int8_t* aq = a[b].qs[lane];
      const float dw = LoadHalf(w);
      int32_t isum = 0;
      if constexpr (kType == GgmlType::kQ8_0) {
        const int8_t* q = reinterpret_cast<const int8_t*>(w + 2);
        for (int j = 0; j < 32; ++j) isum += static_cast<int32_t>(q[j]) * aq[j];
        acc = acc + static_cast<float>(isum) * (dw * a[b].d[lane]);
      } else {
        const uint8_t* qs = w + (kType == GgmlType::kQ4_1 ? 4 : 2);
        for (int j = 0; j < 16; ++j) {
          isum += static_cast<int32_t>(qs[j] & 0x0F) * aq[j];
          isum += static_cast<int32_t>(qs[j] >> 4) * aq[j + 16];
        }
        if constexpr (kType == GgmlType::kQ4_0) {
          isum -= 8 * a[b].sum[lane];
          acc = acc + static_cast<float>(isum) * (dw * a[b].d[lane]);
        } else {
          const float mw = LoadHalf(w + 2);
          acc = acc + static_cast<float>(isum) * (dw * a[b].d[lane]);
          acc = acc + mw * a[b].ds[lane];
        }
      }
    }
    out[t * out_stride] = acc;
  }
}

// Dequantizes one block of 32 weights like ggml (element order 0..31).
template <GgmlType kType>
inline void DequantBlockRef(const uint8_t* w, float* out) {
  const float dw = LoadHalf(w);
  if constexpr (kType == GgmlType::kQ8_0) {
    const int8_t* q = reinterpret_cast<const int8_t*>(w + 2);
    for (int j = 0; j < 32; ++j) out[j] = dw * static_cast<float>(q[j]);
  } else if constexpr (kType == GgmlType::kQ4_0) {
    const uint8_t* qs = w + 2;
    for (int j = 0; j < 16; ++j) {
      out[j] = dw * static_cast<float>(static_cast<int>(qs[j] & 0x0F) - 8);
      out[j + 16] = dw * static_cast<float>(static_cast<int>(qs[j] >> 4) - 8);
    }
  } else {
    const float mw = LoadHalf(w + 2);
    const uint8_t* qs = w + 4;
    for (int j = 0; j < 16; ++j) {
      out[j] = dw * static_cast<float>(qs[j] & 0x0F) + mw;
      out[j + 16] = dw * static_cast<float>(qs[j] >> 4) + mw;
    }
  }
}

template <GgmlType kType>
void QuantDotF32Ref(const uint8_t* w_row, size_t nblocks, const float* x, size_t x_stride,
                    size_t n_tokens, float* out, size_t out_stride) {
  constexpr size_t kBlockBytes = kType == GgmlType::kQ4_0   ? sizeof(BlockQ4_0)
                                 : kType == GgmlType::kQ4_1 ? sizeof(BlockQ4_1)
                                                            : sizeof(BlockQ8_0);
  for (size_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * x_stride;
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float wd[32];
    for (size_t b = 0; b < nblocks; ++b) {
      DequantBlockRef<kType>(w_row + b * kBlockBytes, wd);
      const float* xb = xt + b * 32;
      for (int j = 0; j < 32; ++j) l[j % 8] = l[j % 8] + wd[j] * xb[j];
    }
    out[t * out_stride] = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  }
}

void QuantizeX4Ref(const float* x, size_t stride, size_t n_tokens, size_t elems, BlockQ8x4* out) {
  const size_t nb = elems / kQkBlock;
  std::memset(out, 0, nb * sizeof(BlockQ8x4));
  for (size_t t = 0; t < n_tokens && t < 4; ++t) {
    for (size_t b = 0; b < nb; ++b) {
      const float* xb = x + t * stride + b * kQkBlock;
      float amax = 0.0f;
      for (size_t j = 0; j < kQkBlock; ++j) {
        const float v = std::fabs(xb[j]);
        amax = v > amax ? v : amax;  // NaN ignored
      }
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      int32_t sum = 0;
      for (size_t j = 0; j < kQkBlock; ++j) {
        float v = xb[j] * id;
        v = v > -127.0f ? v : -127.0f;  // NaN -> -127
        v = v < 127.0f ? v : 127.0f;
        const int8_t q = static_cast<int8_t>(std::nearbyint(v));
        out[b].qs[t][j] = q;
        sum += q;
      }
      out[b].d[t] = d;
      out[b].sum[t] = sum;
      out[b].ds[t] = d * static_cast<float>(sum);
    }
  }
}

inline float Reduce8(const float* l) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

float DotF32Ref(const float* a, const float* b, size_t n) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < n; ++i) l[i % 8] = l[i % 8] + a[i] * b[i];
  return Reduce8(l);
}

float DotF16Ref(const uint16_t* w, const float* x, size_t n) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < n; ++i) l[i % 8] = l[i % 8] + HalfToFloat(w[i]) * x[i];
  return Reduce8(l);
}

float DotBF16Ref(const uint16_t* w, const float* x, size_t n) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < n; ++i) l[i % 8] = l[i % 8] + BF16ToFloat(w[i]) * x[i];
  return Reduce8(l);
}

void DotF16RowsRef(const uint16_t* k, size_t stride, size_t n_rows, const float* x, size_t n,
                   float* out) {
  for (size_t r = 0; r < n_rows; ++r) out[r] = DotF16Ref(k + r * stride, x, n);
}

void WeightedSumF16Ref(const float* p, const uint16_t* v, size_t stride, size_t n_rows, size_t n,
                       float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = 0.0f;
  for (size_t r = 0; r < n_rows; ++r) {
    for (size_t i = 0; i < n; ++i) out[i] = out[i] + p[r] * HalfToFloat(v[r * stride + i]);
  }
}

void SoftmaxRef(float* s, size_t n, float scale) {
  float mx = -INFINITY;
  for (size_t i = 0; i < n; ++i) {
    s[i] = s[i] / scale;
    mx = s[i] > mx ? s[i] : mx;
  }
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < n; ++i) {
    s[i] = ExpNeg(s[i] - mx);
    l[i % 8] = l[i % 8] + s[i];
  }
  const float sum = Reduce8(l);
  for (size_t i = 0; i < n; ++i) s[i] = s[i] / sum;
}

}  // namespace

float ExpNeg(float x) {
  if (!(x >= kExpMin)) return 0.0f;  // also NaN
  const float n = std::nearbyint(x * kLog2e);
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = kExpC6;
  p = p * r + kExpC5;
  p = p * r + kExpC4;
  p = p * r + kExpC3;
  p = p * r + kExpC2;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

const ModelKernels& ScalarModelKernels() {
  static const ModelKernels k = {
      SimdLevel::kScalar,
      QuantizeX4Ref,
      QuantDotRef<GgmlType::kQ4_0>,
      QuantDotRef<GgmlType::kQ4_1>,
      QuantDotRef<GgmlType::kQ8_0>,
      QuantDotF32Ref<GgmlType::kQ4_0>,
      QuantDotF32Ref<GgmlType::kQ4_1>,
      QuantDotF32Ref<GgmlType::kQ8_0>,
      DotF32Ref,
      DotF16Ref,
      DotBF16Ref,
      DotF16RowsRef,
      WeightedSumF16Ref,
      SoftmaxRef,
  };
  return k;
}

const ModelKernels& ModelKernelsFor(SimdLevel level) {
  // The model kernels have no AVX-512 version: a CPU with AVX-512 runs the AVX2 ones.
  if ((level == SimdLevel::kAvx2 || level == SimdLevel::kAvx512) &&
      SimdLevelSupported(SimdLevel::kAvx2)) {
    return Avx2ModelKernels();
  }
  return ScalarModelKernels();
}

const ModelKernels& ActiveModelKernels() { return ModelKernelsFor(ActiveSimdLevel()); }

}  // namespace tqkv::model
