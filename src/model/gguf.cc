#include "model/gguf.h"

#include <cstring>
#include <limits>
#include <utility>

namespace tqkv::model {
namespace {

constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 4;

std::string_view ValueTypeName(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
      return "u8";
    case GgufValueType::kInt8:
      return "i8";
    case GgufValueType::kUint16:
      return "u16";
    case GgufValueType::kInt16:
      return "i16";
    case GgufValueType::kUint32:
      return "u32";
    case GgufValueType::kInt32:
      return "i32";
    case GgufValueType::kFloat32:
      return "f32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "u64";
    case GgufValueType::kInt64:
      return "i64";
    case GgufValueType::kFloat64:
      return "f64";
  }
  return "?";
}

// Smallest encoded size of a value of type t (for bounding counts before allocating).
uint64_t MinValueBytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
      return 8;
    case GgufValueType::kArray:
      return 12;
  }
  return 1;
}

class Reader {
 public:
  Reader(const uint8_t* data, size_t size, std::string path)
      : data_(data), size_(size), path_(std::move(path)) {}

  uint64_t pos() const { return pos_; }
  void Skip(uint64_t n) { pos_ = n < remaining() ? pos_ + n : size_; }
  uint64_t remaining() const { return size_ - pos_; }

  Status Error(std::string_view what) const {
    return Status::Corruption("GGUF " + path_ + " at offset " + std::to_string(pos_) + ": " +
                              std::string(what));
  }

  template <typename T>
  Status Read(T* out, std::string_view what) {
    if (remaining() < sizeof(T)) {
      return Error("truncated file while reading " + std::string(what) + " (file is " +
                   std::to_string(size_) + " bytes)");
    }
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }

  Status ReadString(std::string* out, std::string_view what) {
    uint64_t len = 0;
    TQKV_RETURN_IF_ERROR(Read(&len, what));
    if (len > remaining()) {
      return Error("string length " + std::to_string(len) + " of " + std::string(what) +
                   " exceeds the " + std::to_string(remaining()) + " bytes left");
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }

  Status ReadValue(GgufValueType type, GgufValue* v, int depth, std::string_view key) {
    v->type = type;
    switch (type) {
      case GgufValueType::kUint8: {
        uint8_t x;
        TQKV_RETURN_IF_ERROR(Read(&x, key));
        v->u = x;
        break;
      }
      case GgufValueType::kInt8: {
        int8_t x;
        TQKV_RETURN_IF_ERROR(Read(&x, key));
        v->i = x;
        break;
      }
      case GgufValueType::kUint16: {
        uint16_t x;
        TQKV_RETURN_IF_ERROR(Read(&x, key));
        v->u = x;
        break;
      }
      case GgufValueType::kInt16: {
        int16_t x;
        TQKV_RETURN_IF_ERROR(Read(&x, key));
        v->i = x;
        break;
      }
      case GgufValueType::kUint32: {
        uint32_t x;
        TQKV_RETURN_IF_ERROR(Read(&x, key));
        v->u = x;
        break;
      }
      case GgufValueType::kInt32: {
        int32_t x;
        TQKV_RETURN_IF_ERROR(Read(&x, key));
        v->i = x;
        break;
      }
      case GgufValueType::kUint64: {
        uint64_t x;
        TQKV_RETURN_IF_ERROR(Read(&x, key));
        v->u = x;
        break;
      }
      case GgufValueType::kInt64: {
        int64_t x;
        TQKV_RETURN_IF_ERROR(Read(&x, key));
        v->i = x;
        break;
      }
      case GgufValueType::kFloat32: {
        float x;
        TQKV_RETURN_IF_ERROR(Read(&x, key));
        v->f = x;
        break;
      }
      case GgufValueType::kFloat64: {
        double x;
        TQKV_RETURN_IF_ERROR(Read(&x, key));
        v->f = x;
        break;
      }
      case GgufValueType::kBool: {
        uint8_t x;
        TQKV_RETURN_IF_ERROR(Read(&x, key));
        if (x > 1)
          return Error("bool value " + std::to_string(x) + " of '" + std::string(key) + "'");
        v->b = x != 0;
        break;
      }
      case GgufValueType::kString:
        TQKV_RETURN_IF_ERROR(ReadString(&v->str, key));
        break;
      case GgufValueType::kArray: {
        if (depth >= kMaxArrayDepth)
          return Error("arrays nested too deeply in '" + std::string(key) + "'");
        uint32_t et = 0;
        uint64_t count = 0;
        TQKV_RETURN_IF_ERROR(Read(&et, key));
        if (et > static_cast<uint32_t>(GgufValueType::kFloat64)) {
          return Error("unknown array element type " + std::to_string(et) + " of '" +
                       std::string(key) + "'");
        }
        TQKV_RETURN_IF_ERROR(Read(&count, key));
        v->elem_type = static_cast<GgufValueType>(et);
        if (count > remaining() / MinValueBytes(v->elem_type)) {
          return Error("array '" + std::string(key) + "' claims " + std::to_string(count) +
                       " elements, more than the file can hold");
        }
        v->count = count;
        v->raw = data_ + pos_;
        const uint64_t start = pos_;
        if (v->elem_type == GgufValueType::kString || v->elem_type == GgufValueType::kArray) {
          GgufValue scratch;  // validates each element without keeping it
          for (uint64_t k = 0; k < count; ++k) {
            TQKV_RETURN_IF_ERROR(ReadValue(v->elem_type, &scratch, depth + 1, key));
          }
        } else {
          pos_ += count * MinValueBytes(v->elem_type);  // fixed size; bounded above
        }
        v->raw_size = pos_ - start;
        break;
      }
      default:
        return Error("unknown value type " + std::to_string(static_cast<uint32_t>(type)) + " of '" +
                     std::string(key) + "'");
    }
    return Status::Ok();
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  std::string path_;
  uint64_t pos_ = 0;
};

}  // namespace

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

static bool IsSigned(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}

GgufValue GgufValue::ArrayElement(uint64_t index) const {
  GgufValue out;
  if (type != GgufValueType::kArray || index >= count || raw == nullptr) return out;
  Reader r(raw, raw_size, "array");
  if (elem_type != GgufValueType::kString && elem_type != GgufValueType::kArray) {
    r.Skip(index * MinValueBytes(elem_type));
  } else {
    GgufValue scratch;
    for (uint64_t k = 0; k < index; ++k) {
      if (!r.ReadValue(elem_type, &scratch, 1, "array").ok()) return GgufValue();
    }
  }
  if (!r.ReadValue(elem_type, &out, 1, "array").ok()) return GgufValue();
  return out;
}

std::vector<std::string_view> GgufValue::ArrayStrings() const {
  std::vector<std::string_view> out;
  if (type != GgufValueType::kArray || elem_type != GgufValueType::kString) return out;
  out.reserve(count);
  uint64_t pos = 0;
  for (uint64_t k = 0; k < count; ++k) {
    uint64_t len = 0;
    if (raw_size - pos < 8) return {};
    std::memcpy(&len, raw + pos, 8);
    pos += 8;
    if (len > raw_size - pos) return {};
    out.emplace_back(reinterpret_cast<const char*>(raw + pos), len);
    pos += len;
  }
  return out;
}

std::optional<uint64_t> GgufValue::AsUint() const {
  if (!is_integer()) return std::nullopt;
  if (IsSigned(type)) {
    if (i < 0) return std::nullopt;
    return static_cast<uint64_t>(i);
  }
  return u;
}

std::optional<int64_t> GgufValue::AsInt() const {
  if (!is_integer()) return std::nullopt;
  if (IsSigned(type)) return i;
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(u);
}

std::optional<double> GgufValue::AsDouble() const {
  if (type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64) return f;
  if (!is_integer()) return std::nullopt;
  return IsSigned(type) ? static_cast<double>(i) : static_cast<double>(u);
}

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  TQKV_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  return Parse(std::move(file));
}

Result<std::unique_ptr<GgufFile>> GgufFile::Parse(std::shared_ptr<const MappedFile> file) {
  std::unique_ptr<GgufFile> g(new GgufFile());
  g->file_ = std::move(file);
  const uint64_t size = g->file_->size();
  Reader r(g->file_->data(), g->file_->size(), g->file_->path());

  uint32_t magic = 0;
  TQKV_RETURN_IF_ERROR(r.Read(&magic, "magic"));
  if (magic != kGgufMagic) return r.Error("bad magic (not a GGUF file)");
  TQKV_RETURN_IF_ERROR(r.Read(&g->version_, "version"));
  if (g->version_ < 2 || g->version_ > 3) {
    return Status::Unsupported("GGUF " + g->file_->path() + ": version " +
                               std::to_string(g->version_) + " (supported: 2, 3)");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  TQKV_RETURN_IF_ERROR(r.Read(&n_tensors, "tensor count"));
  TQKV_RETURN_IF_ERROR(r.Read(&n_kv, "metadata count"));
  if (n_kv > r.remaining() / 13)
    return r.Error("metadata count " + std::to_string(n_kv) + " exceeds the file");
  if (n_tensors > r.remaining() / 24) {
    return r.Error("tensor count " + std::to_string(n_tensors) + " exceeds the file");
  }

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    TQKV_RETURN_IF_ERROR(r.ReadString(&key, "metadata key"));
    uint32_t type = 0;
    TQKV_RETURN_IF_ERROR(r.Read(&type, "metadata value type"));
    if (type > static_cast<uint32_t>(GgufValueType::kFloat64)) {
      return r.Error("unknown value type " + std::to_string(type) + " of '" + key + "'");
    }
    GgufValue v;
    TQKV_RETURN_IF_ERROR(r.ReadValue(static_cast<GgufValueType>(type), &v, 0, key));
    if (!g->metadata_.emplace(key, std::move(v)).second)
      return r.Error("duplicate key '" + key + "'");
  }

  if (const GgufValue* a = g->Find("general.alignment")) {
    const auto al = a->AsUint();
    if (!al || *al == 0 || *al > (1u << 24)) return r.Error("bad general.alignment");
    g->alignment_ = *al;
  }

  g->tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    TQKV_RETURN_IF_ERROR(r.ReadString(&t.name, "tensor name"));
    TQKV_RETURN_IF_ERROR(r.Read(&t.n_dims, "tensor n_dims"));
    if (t.n_dims == 0 || t.n_dims > kMaxDims) {
      return r.Error("tensor '" + t.name + "' has " + std::to_string(t.n_dims) + " dimensions");
    }
    uint64_t elements = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      TQKV_RETURN_IF_ERROR(r.Read(&t.ne[d], "tensor dimension"));
      if (t.ne[d] == 0 || __builtin_mul_overflow(elements, t.ne[d], &elements) ||
          elements > (uint64_t{1} << 48)) {
        return r.Error("tensor '" + t.name + "' has a bad shape");
      }
    }
    t.elements = elements;
    uint32_t type = 0;
    TQKV_RETURN_IF_ERROR(r.Read(&type, "tensor type"));
    const auto traits = FindGgmlType(type);
    if (!traits) {
      return Status::Unsupported("GGUF " + g->file_->path() + ": tensor '" + t.name +
                                 "' has type " + std::string(GgmlTypeName(type)) + " (id " +
                                 std::to_string(type) +
                                 "); supported: f32, f16, bf16, q8_0, q4_0, q4_1");
    }
    t.type = traits->type;
    if (t.ne[0] % traits->block_elems != 0) {
      return r.Error("tensor '" + t.name + "' row of " + std::to_string(t.ne[0]) +
                     " elements is not a multiple of the " + std::string(traits->name) +
                     " block size");
    }
    t.bytes = elements / traits->block_elems * traits->block_bytes;
    TQKV_RETURN_IF_ERROR(r.Read(&t.offset, "tensor offset"));
    if (t.offset % g->alignment_ != 0) {
      return r.Error("tensor '" + t.name + "' offset " + std::to_string(t.offset) +
                     " is not a multiple of the alignment " + std::to_string(g->alignment_));
    }
    if (!g->tensor_index_.emplace(t.name, g->tensors_.size()).second) {
      return r.Error("duplicate tensor '" + t.name + "'");
    }
    g->tensors_.push_back(std::move(t));
  }

  const uint64_t end = r.pos();
  g->data_offset_ = (end + g->alignment_ - 1) / g->alignment_ * g->alignment_;
  for (auto& t : g->tensors_) {
    uint64_t begin = 0, stop = 0;
    if (__builtin_add_overflow(g->data_offset_, t.offset, &begin) ||
        __builtin_add_overflow(begin, t.bytes, &stop) || stop > size) {
      return Status::Corruption("GGUF " + g->file_->path() + ": tensor '" + t.name + "' data [" +
                                std::to_string(g->data_offset_) + " + " + std::to_string(t.offset) +
                                ", +" + std::to_string(t.bytes) + ") extends past the end of the " +
                                std::to_string(size) + "-byte file (truncated?)");
    }
    t.data = g->file_->data() + begin;
  }
  return g;
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr)
    return Status::NotFound("GGUF " + file_->path() + ": no metadata key '" + std::string(key) +
                            "'");
  auto u = v->AsUint();
  if (!u) {
    return Status::Corruption("GGUF " + file_->path() + ": '" + std::string(key) +
                              "' is not a non-negative integer (type " +
                              std::string(ValueTypeName(v->type)) + ")");
  }
  return *u;
}

Result<double> GgufFile::GetDouble(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr)
    return Status::NotFound("GGUF " + file_->path() + ": no metadata key '" + std::string(key) +
                            "'");
  auto d = v->AsDouble();
  if (!d) {
    return Status::Corruption("GGUF " + file_->path() + ": '" + std::string(key) +
                              "' is not a number (type " + std::string(ValueTypeName(v->type)) +
                              ")");
  }
  return *d;
}

Result<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr)
    return Status::NotFound("GGUF " + file_->path() + ": no metadata key '" + std::string(key) +
                            "'");
  if (v->type != GgufValueType::kString) {
    return Status::Corruption("GGUF " + file_->path() + ": '" + std::string(key) +
                              "' is not a string");
  }
  return v->str;
}

Result<uint64_t> GgufFile::GetUintOr(std::string_view key, uint64_t fallback) const {
  if (Find(key) == nullptr) return fallback;
  return GetUint(key);
}

Result<double> GgufFile::GetDoubleOr(std::string_view key, double fallback) const {
  if (Find(key) == nullptr) return fallback;
  return GetDouble(key);
}

}  // namespace tqkv::model
