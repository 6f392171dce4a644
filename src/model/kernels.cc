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
void QuantDotRef(const uint8_t* w_row, const BlockQ8Act* acts, size_t act_stride, size_t nblocks,
                 size_t n_tokens, float* out, size_t out_stride) {
  constexpr size_t kBlockBytes = kType == GgmlType::kQ4_0   ? sizeof(BlockQ4_0)
                                 : kType == GgmlType::kQ4_1 ? sizeof(BlockQ4_1)
                                                            : sizeof(BlockQ8_0);
  for (size_t t = 0; t < n_tokens; ++t) {
    const BlockQ8Act* a = acts + t * act_stride;
    float acc = 0.0f;
    for (size_t b = 0; b < nblocks; ++b) {
      const uint8_t* w = w_row + b * kBlockBytes;
      const float dw = LoadHalf(w);
      int32_t isum = 0;
      if constexpr (kType == GgmlType::kQ8_0) {
        const int8_t* q = reinterpret_cast<const int8_t*>(w + 2);
        for (int j = 0; j < 32; ++j) isum += static_cast<int32_t>(q[j]) * a[b].qs[j];
        acc = acc + static_cast<float>(isum) * (dw * a[b].d);
      } else {
        const uint8_t* qs = w + (kType == GgmlType::kQ4_1 ? 4 : 2);
        for (int j = 0; j < 16; ++j) {
          isum += static_cast<int32_t>(qs[j] & 0x0F) * a[b].qs[j];
          isum += static_cast<int32_t>(qs[j] >> 4) * a[b].qs[j + 16];
        }
        if constexpr (kType == GgmlType::kQ4_0) {
          isum -= 8 * a[b].sum;
          acc = acc + static_cast<float>(isum) * (dw * a[b].d);
        } else {
          const float mw = LoadHalf(w + 2);
          acc = acc + static_cast<float>(isum) * (dw * a[b].d);
          acc = acc + mw * (a[b].d * static_cast<float>(a[b].sum));
        }
      }
    }
    out[t * out_stride] = acc;
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

void AxpyF16Ref(float a, const uint16_t* v, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = out[i] + a * HalfToFloat(v[i]);
}

}  // namespace

void QuantizeActivations(const float* x, size_t elems, BlockQ8Act* out) {
  for (size_t b = 0; b < elems / kQkBlock; ++b) {
    const float* xb = x + b * kQkBlock;
    float amax = 0.0f;
    for (size_t j = 0; j < kQkBlock; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (size_t j = 0; j < kQkBlock; ++j) {
      float q = std::nearbyint(xb[j] * id);
      q = std::fmin(127.0f, std::fmax(-127.0f, q));  // also maps NaN to -127
      out[b].qs[j] = static_cast<int8_t>(q);
      sum += out[b].qs[j];
    }
    out[b].d = d;
    out[b].sum = sum;
  }
}

const ModelKernels& ScalarModelKernels() {
  static const ModelKernels k = {
      SimdLevel::kScalar,           QuantDotRef<GgmlType::kQ4_0>, QuantDotRef<GgmlType::kQ4_1>,
      QuantDotRef<GgmlType::kQ8_0>, DotF32Ref,                    DotF16Ref,
      DotBF16Ref,                   AxpyF16Ref,
  };
  return k;
}

const ModelKernels& ModelKernelsFor(SimdLevel level) {
  if (level == SimdLevel::kAvx2 && BestSimdLevel() >= SimdLevel::kAvx2) return Avx2ModelKernels();
  return ScalarModelKernels();
}

const ModelKernels& ActiveModelKernels() { return ModelKernelsFor(ActiveSimdLevel()); }

}  // namespace tqkv::model
