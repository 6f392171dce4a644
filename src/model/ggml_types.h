// ggml tensor element types that the model loader accepts, their packed block layouts, and the
// scalar conversions (dequantize / quantize) that are the reference for every kernel.
//
// Block layouts (little-endian, as in ggml; a block covers 32 consecutive elements of a row):
//   q4_0: f16 d, 16 bytes of nibbles            x = d * (q - 8)
//   q4_1: f16 d, f16 m, 16 bytes of nibbles     x = d * q + m
//   q8_0: f16 d, 32 int8                        x = d * q
// Nibble order: byte j holds element j in its low nibble and element j + 16 in its high nibble.
#ifndef TQKV_SRC_MODEL_GGML_TYPES_H_
#define TQKV_SRC_MODEL_GGML_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tqkv::model {

// ggml's on-disk type ids (never renumbered upstream).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 8,
  kBF16 = 30,
};

inline constexpr size_t kQkBlock = 32;  // elements per quantized block

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ4_0) == 18, "q4_0 block is 18 bytes");
static_assert(sizeof(BlockQ4_1) == 20, "q4_1 block is 20 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "q8_0 block is 34 bytes");

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;
  size_t block_elems;  // elements per block (1 for plain types)
  size_t block_bytes;  // bytes per block
  bool quantized;
};

// Traits of a supported type id, or nullopt for an id this loader does not support.
std::optional<GgmlTypeTraits> FindGgmlType(uint32_t id);
GgmlTypeTraits GgmlTraits(GgmlType type);
std::string_view GgmlTypeName(uint32_t id);  // "q4_1", or "type#14" for unknown ids

// Bytes of a row of `elems` elements; nullopt if elems is not a multiple of the block size.
std::optional<uint64_t> GgmlRowBytes(GgmlType type, uint64_t elems);

// Dequantizes one row of `elems` elements (a multiple of the block size) into out[elems].
void DequantizeRow(GgmlType type, const void* row, size_t elems, float* out);

// Reference quantizers (ggml's round-to-nearest schemes), for building test models.
// `elems` must be a multiple of 32; `out` gets elems / 32 blocks.
void QuantizeRowQ4_0(const float* x, size_t elems, void* out);
void QuantizeRowQ4_1(const float* x, size_t elems, void* out);
void QuantizeRowQ8_0(const float* x, size_t elems, void* out);
// Quantizes a row into any supported type (f32/f16/bf16 copy or round).
void QuantizeRow(GgmlType type, const float* x, size_t elems, void* out);

}  // namespace tqkv::model

#endif  // TQKV_SRC_MODEL_GGML_TYPES_H_
