// Helpers of the model tests: where the shared models are, temp files, and a small GGUF writer.
#ifndef TQKV_TESTS_MODEL_MODEL_TEST_UTIL_H_
#define TQKV_TESTS_MODEL_MODEL_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "model/ggml_types.h"
#include "model/gguf.h"
#include "test_paths.h"

namespace tqkv::model::testing {

inline bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// $TQKV_SHARED_DIR, else <source>/../shared.
inline std::string SharedDir() {
  if (const char* e = std::getenv("TQKV_SHARED_DIR"); e != nullptr && *e != '\0') return e;
  return tqkv::test::SourceDir() + "/../shared";
}
inline std::string StoriesDir() { return SharedDir() + "/models/stories260K"; }
inline std::string StoriesBin() { return StoriesDir() + "/stories260K.bin"; }
inline std::string StoriesTok() { return StoriesDir() + "/tok512.bin"; }

// $TQKV_SMOLLM2_GGUF, else ${TQKV_CACHE_DIR:-$HOME/.cache/tqkv}/SmolLM2-135M-Instruct.Q4_1.gguf
// (where scripts/fetch_smollm2.sh puts it).
inline std::string SmolLm2Path() {
  if (const char* e = std::getenv("TQKV_SMOLLM2_GGUF"); e != nullptr && *e != '\0') return e;
  std::string dir;
  if (const char* c = std::getenv("TQKV_CACHE_DIR"); c != nullptr && *c != '\0') {
    dir = c;
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    dir = std::string(h) + "/.cache/tqkv";
  }
  return dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

#define TQKV_REQUIRE_STORIES()                                                            \
  do {                                                                                    \
    if (!::tqkv::model::testing::FileExists(::tqkv::model::testing::StoriesBin()) ||      \
        !::tqkv::model::testing::FileExists(::tqkv::model::testing::StoriesTok())) {      \
      GTEST_SKIP() << "stories260K not found at " << ::tqkv::model::testing::StoriesDir() \
                   << " (set TQKV_SHARED_DIR to the folder holding models/stories260K)";  \
    }                                                                                     \
  } while (0)

inline std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/tqkv_model_" + std::to_string(::getpid()) + "_" + name;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Writes GGUF v3 files (little-endian host).
class GgufBuilder {
 public:
  template <typename T>
  static void Put(std::string* s, T v) {
    s->append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  static void PutStr(std::string* s, const std::string& v) {
    Put<uint64_t>(s, v.size());
    s->append(v);
  }

  // A key with an already encoded value of `type`.
  void KvRaw(const std::string& key, GgufValueType type, const std::string& value) {
    PutStr(&kv_, key);
    Put<uint32_t>(&kv_, static_cast<uint32_t>(type));
    kv_ += value;
    ++n_kv_;
  }
  void KvU32(const std::string& key, uint32_t v) { KvScalar(key, GgufValueType::kUint32, v); }
  void KvI32(const std::string& key, int32_t v) { KvScalar(key, GgufValueType::kInt32, v); }
  void KvF32(const std::string& key, float v) { KvScalar(key, GgufValueType::kFloat32, v); }
  void KvBool(const std::string& key, bool v) { KvScalar(key, GgufValueType::kBool, uint8_t{v}); }
  void KvStr(const std::string& key, const std::string& v) {
    std::string e;
    PutStr(&e, v);
    KvRaw(key, GgufValueType::kString, e);
  }
  void KvStrArray(const std::string& key, const std::vector<std::string>& v) {
    std::string e;
    Put<uint32_t>(&e, static_cast<uint32_t>(GgufValueType::kString));
    Put<uint64_t>(&e, v.size());
    for (const auto& s : v) PutStr(&e, s);
    KvRaw(key, GgufValueType::kArray, e);
  }
  template <typename T>
  void KvArray(const std::string& key, GgufValueType elem, const std::vector<T>& v) {
    std::string e;
    Put<uint32_t>(&e, static_cast<uint32_t>(elem));
    Put<uint64_t>(&e, v.size());
    for (const auto& x : v) Put<T>(&e, x);
    KvRaw(key, GgufValueType::kArray, e);
  }
  template <typename T>
  void KvScalar(const std::string& key, GgufValueType type, T v) {
    std::string e;
    Put<T>(&e, v);
    KvRaw(key, type, e);
  }

  void Tensor(const std::string& name, std::vector<uint64_t> ne, GgmlType type,
              const std::string& data) {
    tensors_.push_back({name, std::move(ne), static_cast<uint32_t>(type), data});
  }
  // A 2-D tensor of `rows` rows of `cols` floats, stored as `type`.
  void Matrix(const std::string& name, uint64_t cols, uint64_t rows, GgmlType type,
              const float* x) {
    const uint64_t rb = *GgmlRowBytes(type, cols);
    std::string d(rb * rows, '\0');
    for (uint64_t r = 0; r < rows; ++r) QuantizeRow(type, x + r * cols, cols, d.data() + r * rb);
    Tensor(name, rows == 0 ? std::vector<uint64_t>{cols} : std::vector<uint64_t>{cols, rows}, type,
           d);
  }
  void Vector(const std::string& name, uint64_t n, const float* x) {
    Tensor(name, {n}, GgmlType::kF32,
           std::string(reinterpret_cast<const char*>(x), n * sizeof(float)));
  }

  std::string Build(uint32_t version = 3, uint64_t alignment = 32) const {
    std::string s;
    Put<uint32_t>(&s, kGgufMagic);
    Put<uint32_t>(&s, version);
    Put<uint64_t>(&s, tensors_.size());
    Put<uint64_t>(&s, n_kv_);
    s += kv_;
    uint64_t off = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      PutStr(&s, t.name);
      Put<uint32_t>(&s, static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) Put<uint64_t>(&s, d);
      Put<uint32_t>(&s, t.type);
      Put<uint64_t>(&s, off);
      offsets.push_back(off);
      off += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    s.resize((s.size() + alignment - 1) / alignment * alignment, '\0');
    const size_t base = s.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      s.resize(base + offsets[i], '\0');
      s += tensors_[i].data;
    }
    return s;
  }

 private:
  struct T {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::string data;
  };
  std::string kv_;
  uint64_t n_kv_ = 0;
  std::vector<T> tensors_;
};

}  // namespace tqkv::model::testing

#endif  // TQKV_TESTS_MODEL_MODEL_TEST_UTIL_H_
