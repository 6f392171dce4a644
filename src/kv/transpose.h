// Transposes of 16-bit matrices: vLLM's CPU keys are channel-major per block and head
// ([head_dim][block] of bf16), tqkv's canonical layout token-major, so every key of a chunk
// crosses one on its way in or out of that cache.
#ifndef TQKV_SRC_KV_TRANSPOSE_H_
#define TQKV_SRC_KV_TRANSPOSE_H_

#include <cstddef>
#include <cstdint>

namespace tqkv {

// dst[c * dst_stride + r] = src[r * src_stride + c] for r < rows, c < cols (strides in elements).
void Transpose16(const uint16_t* src, size_t src_stride, uint16_t* dst, size_t dst_stride,
                 size_t rows, size_t cols);
// The reference: element by element.
void Transpose16Reference(const uint16_t* src, size_t src_stride, uint16_t* dst,
                          size_t dst_stride, size_t rows, size_t cols);

}  // namespace tqkv

#endif  // TQKV_SRC_KV_TRANSPOSE_H_
