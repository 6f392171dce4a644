// Bulk element conversions to and from float with the best SIMD kernel of this CPU, bit-identical
// to LoadAsFloat / StoreFromFloat of tqkv/types.h (tests/codec/kernels_test.cc). Implemented by the
// codec's kernels (src/codec/kernels/dispatch.cc).
#ifndef TQKV_INCLUDE_TQKV_CONVERT_H_
#define TQKV_INCLUDE_TQKV_CONVERT_H_

#include <cstddef>

#include "tqkv/types.h"

namespace tqkv {

void ConvertToFloat(const void* src, DType t, size_t n, float* dst);
void ConvertFromFloat(const float* src, size_t n, DType t, void* dst);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_CONVERT_H_
