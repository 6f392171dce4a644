// Compute kernels of the reference engine: quantized-weight dot products against q8 activations
// or against fp32 activations (weights dequantized in registers), float dot products, and the fp16 KV-cache reads of attention.
//
// Every kernel exists as a scalar reference and as an AVX2 version (kernels_avx2.cc) that returns
// bit-identical results: integer block sums are exact, and the floating-point operations are the
// same operations in the same order (no FMA contraction). So logits do not depend on the SIMD
// level, on the thread count, or on how many tokens are processed per call.
#ifndef TQKV_SRC_MODEL_KERNELS_H_
#define TQKV_SRC_MODEL_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "model/ggml_types.h"
#include "tqkv/simd.h"

namespace tqkv::model {

// Activations of up to 4 tokens for one block of 32 elements (lanes of absent tokens are zero):
// x[t][j] ~= d[t] * qs[t][j]; sum[t] = sum of qs[t]; ds[t] = d[t] * float(sum[t]).
struct BlockQ8x4 {
  float d[4];
  float ds[4];
  int32_t sum[4];
  int8_t qs[4][32];
};
static_assert(sizeof(BlockQ8x4) == 176, "4-token activation block is 176 bytes");

// Quantizes n_tokens (<= 4) rows of `elems` floats (a multiple of 32; row t at x + t * stride)
// into elems / 32 blocks: d = max|x| / 127, qs = round-to-nearest-even(x / d) clamped to
// [-127, 127] (NaN -> -127).
using QuantizeX4Fn = void (*)(const float* x, size_t stride, size_t n_tokens, size_t elems,
                              BlockQ8x4* out);

// For token t in [0, n_tokens): out[t * out_stride] = dot(weight row w_row, activation row t),
// with activations packed as n_tokens / 4 rounded up groups of nblocks BlockQ8x4 (group g at
// acts + g * nblocks). Per block the integer sum is exact; then, blocks in order:
//   q8_0: acc = acc + float(isum) * (dw * d)
//   q4_0: isum = sum(q * a) - 8 * sum(a);  acc = acc + float(isum) * (dw * d)
//   q4_1: acc = acc + float(isum) * (dw * d);  acc = acc + mw * ds
using QuantDotFn = void (*)(const uint8_t* w_row, const BlockQ8x4* acts, size_t nblocks,
                            size_t n_tokens, float* out, size_t out_stride);

// The f32-activation path: for token t in [0, n_tokens), out[t * out_stride] = the dot of the
// dequantized weight row w_row (nblocks blocks of 32) with the fp32 row x + t * x_stride. Each
// weight is dequantized like ggml (q8_0: dw * q; q4_0: dw * float(q - 8); q4_1: dw * q + mw,
// a multiply then an add), then exactly as DotF32 on the dequantized row: lane j % 8
// accumulates w[j] * x[j] (multiply, then add) in element order, then
// ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). Weights stay quantized in memory.
using QuantDotF32Fn = void (*)(const uint8_t* w_row, size_t nblocks, const float* x,
                               size_t x_stride, size_t n_tokens, float* out, size_t out_stride);

// Float dot products with 8 lane accumulators: lane i % 8 accumulates a[i] * b[i] (multiply,
// then add), then ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)).
using DotF32Fn = float (*)(const float* a, const float* b, size_t n);
using DotHalfFn = float (*)(const uint16_t* w, const float* x, size_t n);  // w: f16 or bf16 bits
// out[r] = dot_f16(k + r * stride, x, n) for r in [0, n_rows) (attention scores).
using DotF16RowsFn = void (*)(const uint16_t* k, size_t stride, size_t n_rows, const float* x,
                              size_t n, float* out);
// out[i] = sum over r in order of p[r] * float(v[r * stride + i]) (out[i] = 0, then
// out[i] = out[i] + p[r] * v), i in [0, n) (attention output).
using WeightedSumF16Fn = void (*)(const float* p, const uint16_t* v, size_t stride, size_t n_rows,
                                  size_t n, float* out);
// Attention softmax in place: s[i] = s[i] / scale; m = max s; e[i] = ExpNeg(s[i] - m);
// sum = 8 lane sums (lane i % 8, in order) reduced like the dots; s[i] = e[i] / sum.
using SoftmaxFn = void (*)(float* s, size_t n, float scale);

// exp(x) for x <= 0 (softmax): Cody-Waite reduction by ln 2 and a degree-6 polynomial, every
// step a plain multiply or add (mirrored exactly by the AVX2 kernel); 0 for x < -87 or NaN.
// Relative error below 2e-7.
float ExpNeg(float x);
inline constexpr float kExpMin = -87.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;  // ln 2 = kLn2Hi + kLn2Lo, kLn2Hi exact in 9 bits
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kExpC2 = 1.0f / 2;
inline constexpr float kExpC3 = 1.0f / 6;
inline constexpr float kExpC4 = 1.0f / 24;
inline constexpr float kExpC5 = 1.0f / 120;
inline constexpr float kExpC6 = 1.0f / 720;

struct ModelKernels {
  SimdLevel level;
  QuantizeX4Fn quantize_x4;
  QuantDotFn dot_q4_0;
  QuantDotFn dot_q4_1;
  QuantDotFn dot_q8_0;
  QuantDotF32Fn dot_q4_0_f32;
  QuantDotF32Fn dot_q4_1_f32;
  QuantDotF32Fn dot_q8_0_f32;
  DotF32Fn dot_f32;
  DotHalfFn dot_f16;
  DotHalfFn dot_bf16;
  DotF16RowsFn dot_f16_rows;
  WeightedSumF16Fn weighted_sum_f16;
  SoftmaxFn softmax;

  QuantDotFn quant_dot(GgmlType t) const {
    switch (t) {
      case GgmlType::kQ4_0:
        return dot_q4_0;
      case GgmlType::kQ4_1:
        return dot_q4_1;
      case GgmlType::kQ8_0:
        return dot_q8_0;
      default:
        return nullptr;
    }
  }
  QuantDotF32Fn quant_dot_f32(GgmlType t) const {
    switch (t) {
      case GgmlType::kQ4_0:
        return dot_q4_0_f32;
      case GgmlType::kQ4_1:
        return dot_q4_1_f32;
      case GgmlType::kQ8_0:
        return dot_q8_0_f32;
      default:
        return nullptr;
    }
  }
};

const ModelKernels& ScalarModelKernels();
// The AVX2 table; only call when the CPU supports AVX2+FMA+F16C.
const ModelKernels& Avx2ModelKernels();
// The table for `level` (falls back to scalar when the level is not available).
const ModelKernels& ModelKernelsFor(SimdLevel level);
// The table for tqkv::ActiveSimdLevel().
const ModelKernels& ActiveModelKernels();

}  // namespace tqkv::model

#endif  // TQKV_SRC_MODEL_KERNELS_H_
