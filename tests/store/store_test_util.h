// Helpers shared by the store tests: scratch directories and deterministic contents.
#ifndef TQKV_TESTS_STORE_STORE_TEST_UTIL_H_
#define TQKV_TESTS_STORE_STORE_TEST_UTIL_H_

#include <sys/statfs.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "tqkv/status.h"
#include "tqkv/store.h"
#include "test_paths.h"

namespace tqkv::testing_util {

// A fresh directory, removed with everything in it on destruction. Under /tmp unless /tmp is
// tmpfs (where O_DIRECT may be refused); then under the build directory.
class ScratchDir {
 public:
  ScratchDir() {
    std::string base = "/tmp";
    struct statfs sfs {};
    constexpr long kTmpfsMagic = 0x01021994;
    if (::statfs(base.c_str(), &sfs) == 0 && static_cast<long>(sfs.f_type) == kTmpfsMagic) {
      base = tqkv::test::BinaryDir() + "/test-tmp";
      std::filesystem::create_directories(base);
    }
    std::string tmpl = base + "/tqkv-store-test-XXXXXX";
    char* made = ::mkdtemp(tmpl.data());
    if (made != nullptr) path_ = made;
  }
  ~ScratchDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }

  // Every regular file below the directory, as paths relative to it.
  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(path_, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_regular_file(ec)) {
        out.push_back(std::filesystem::relative(it->path(), path_, ec).string());
      }
    }
    return out;
  }

 private:
  std::string path_;
};

// Deterministic bytes for (seed, size): the same call always yields the same content.
inline std::vector<uint8_t> Pattern(uint64_t seed, size_t size) {
  std::vector<uint8_t> v(size);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// Writes `data` in appends of the given piece size (0: one append), then commits.
inline Status WriteObject(Store* store, std::string_view key, std::span<const uint8_t> data,
                          size_t piece = 0) {
  TQKV_ASSIGN_OR_RETURN(auto w, store->Create(key));
  if (piece == 0) piece = data.size() == 0 ? 1 : data.size();
  for (size_t off = 0; off < data.size(); off += piece) {
    TQKV_RETURN_IF_ERROR(w->Append(data.subspan(off, std::min(piece, data.size() - off))));
  }
  if (data.empty()) TQKV_RETURN_IF_ERROR(w->Append({}));
  return w->Commit();
}

inline Result<std::vector<uint8_t>> ReadObject(Store* store, std::string_view key) {
  TQKV_ASSIGN_OR_RETURN(auto r, store->Open(key));
  std::vector<uint8_t> out(r->Size());
  TQKV_RETURN_IF_ERROR(r->ReadAt(0, out));
  return out;
}

// Removes every object of `store` and its temps of any age: shared stores outlive a test.
inline void ClearStore(Store* store) {
  auto l = store->List();
  if (l.ok()) {
    for (const auto& i : *l) (void)store->Remove(i.key);
  }
  (void)store->RemoveStaleTemps(std::chrono::seconds(0));
}

// A store under test that may need a server: `uri` gives "posix" (a scratch directory) or a
// server URI; an empty URI means unavailable, with the skip reason in `why`.
struct ServerStoreParam {
  std::string name;
  std::function<std::string()> uri;
  std::function<std::string()> why;
};
inline std::ostream& operator<<(std::ostream& os, const ServerStoreParam& p) { return os << p.name; }

}  // namespace tqkv::testing_util

#endif  // TQKV_TESTS_STORE_STORE_TEST_UTIL_H_
