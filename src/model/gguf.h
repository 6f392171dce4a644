// GGUF v2/v3 reader over a memory-mapped file.
//
// Layout (little-endian): u32 magic "GGUF" · u32 version · u64 tensor_count · u64 kv_count ·
// kv_count x (string key, u32 value_type, value) · tensor_count x (string name, u32 n_dims,
// u64 ne[n_dims], u32 ggml_type, u64 offset) · padding to `general.alignment` (default 32) ·
// tensor data. Strings are u64 length + bytes (no NUL). Arrays are u32 element type, u64 count,
// elements. ne[0] is the innermost (row) dimension; offsets are relative to the data section and
// multiples of the alignment.
//
// Every count, length, size and offset is checked against the file size before use, so a bad or
// truncated file yields a Corruption/Unsupported Status, never a crash or a huge allocation.
#ifndef TQKV_SRC_MODEL_GGUF_H_
#define TQKV_SRC_MODEL_GGUF_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/ggml_types.h"
#include "model/mapped_file.h"
#include "tqkv/status.h"

namespace tqkv::model {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  // Scalars: integers in `u` (unsigned types) or `i` (signed types), floats in `f`, bool in `b`.
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0.0;
  bool b = false;
  std::string str;  // kString
  // kArray: elements stay in the mapped file (validated when parsed), so a file claiming huge
  // arrays costs no memory; read them with ArrayElement / ArrayStrings.
  GgufValueType elem_type = GgufValueType::kUint8;
  uint64_t count = 0;
  const uint8_t* raw = nullptr;  // first element
  uint64_t raw_size = 0;         // bytes of all elements

  bool is_integer() const;
  // The value as an unsigned / signed integer / float, if it is a number that fits.
  std::optional<uint64_t> AsUint() const;
  std::optional<int64_t> AsInt() const;
  std::optional<double> AsDouble() const;
  // Element i of an array (O(1) for numbers, O(i) for strings and nested arrays); a default
  // value when out of range.
  GgufValue ArrayElement(uint64_t index) const;
  // All elements of an array of strings, as views into the mapped file (empty otherwise).
  std::vector<std::string_view> ArrayStrings() const;
};

struct GgufTensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  uint64_t ne[4] = {1, 1, 1, 1};
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // relative to the data section
  uint64_t elements = 0;
  uint64_t bytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping
};

class GgufFile {
 public:
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses an already mapped file (kept alive by the GgufFile).
  static Result<std::unique_ptr<GgufFile>> Parse(std::shared_ptr<const MappedFile> file);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const MappedFile& file() const { return *file_; }

  const GgufValue* Find(std::string_view key) const;
  const GgufTensorInfo* FindTensor(std::string_view name) const;
  // Typed getters: NotFound when absent, Corruption when of the wrong type / out of range.
  Result<uint64_t> GetUint(std::string_view key) const;
  Result<double> GetDouble(std::string_view key) const;
  Result<std::string> GetString(std::string_view key) const;
  // Like the getters above, but `fallback` when the key is absent.
  Result<uint64_t> GetUintOr(std::string_view key, uint64_t fallback) const;
  Result<double> GetDoubleOr(std::string_view key, double fallback) const;

 private:
  GgufFile() = default;
  std::shared_ptr<const MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian

}  // namespace tqkv::model

#endif  // TQKV_SRC_MODEL_GGUF_H_
