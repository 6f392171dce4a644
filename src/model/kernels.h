// Compute kernels of the reference engine: quantized-weight dot products against q8 activations,
// float dot products, and the fp16 KV-cache reads of attention.
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

// An activation block: 32 values x ~= d * qs, sum = sum of qs (for q4_0 / q4_1 offsets).
struct BlockQ8Act {
  float d;
  int32_t sum;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8Act) == 40, "activation block is 40 bytes");

// Quantizes x[elems] (a multiple of 32) into elems / 32 blocks: d = max|x| / 127, qs = round(x / d)
// (nearest, ties to even). Deterministic scalar code shared by every SIMD level.
void QuantizeActivations(const float* x, size_t elems, BlockQ8Act* out);

// out[t * out_stride] = dot(weight row w_row, activation row t) for t in [0, n_tokens), where
// activation row t starts at acts + t * act_stride and has nblocks blocks. Per block the integer
// sum is exact; then (per token, blocks in order):
//   q8_0: acc = acc + float(isum) * (dw * da)
//   q4_0: isum = sum(q * a) - 8 * sum(a);  acc = acc + float(isum) * (dw * da)
//   q4_1: acc = acc + float(isum) * (dw * da);  acc = acc + mw * (da * float(sum(a)))
using QuantDotFn = void (*)(const uint8_t* w_row, const BlockQ8Act* acts, size_t act_stride,
                            size_t nblocks, size_t n_tokens, float* out, size_t out_stride);

// Float dot products with 8 lane accumulators: lane i % 8 accumulates a[i] * b[i] (multiply,
// then add), then ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)).
using DotF32Fn = float (*)(const float* a, const float* b, size_t n);
using DotHalfFn = float (*)(const uint16_t* w, const float* x, size_t n);  // w: f16 or bf16 bits
// out[i] = out[i] + a * float(v[i]), v in f16.
using AxpyF16Fn = void (*)(float a, const uint16_t* v, float* out, size_t n);

struct ModelKernels {
  SimdLevel level;
  QuantDotFn dot_q4_0;
  QuantDotFn dot_q4_1;
  QuantDotFn dot_q8_0;
  DotF32Fn dot_f32;
  DotHalfFn dot_f16;
  DotHalfFn dot_bf16;
  AxpyF16Fn axpy_f16;

  QuantDotFn quant_dot(GgmlType t) const {
    switch (t) {
      case GgmlType::kQ4_0: return dot_q4_0;
      case GgmlType::kQ4_1: return dot_q4_1;
      case GgmlType::kQ8_0: return dot_q8_0;
      default: return nullptr;
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
