// File names of the posix and nfs stores (file_layout.h).
#include "store/file_layout.h"

#include <sys/random.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "tqkv/store.h"

namespace tqkv::store_internal {
namespace {

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

uint64_t RandomU64() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == static_cast<ssize_t>(sizeof(v))) return v;
  static std::atomic<uint64_t> counter{0};
  const uint64_t t = static_cast<uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  v = t ^ (static_cast<uint64_t>(::getpid()) << 32) ^
      (counter.fetch_add(1) * 0x9e3779b97f4a7c15ull);
  v ^= v >> 31;
  v *= 0xbf58476d1ce4e5b9ull;
  return v ^ (v >> 29);
}

// "<pid>.<16 hex>": the pid tells a reader whose file it is, the random part makes it unique
// across machines sharing the directory.
std::string UniqueSuffix() {
  static const char kHex[] = "0123456789abcdef";
  uint64_t v = RandomU64();
  std::string hex(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) hex[static_cast<size_t>(i)] = kHex[v & 0xf];
  return std::to_string(::getpid()) + "." + hex;
}

// "<dir>/" and "<base>" of a path ("" and the path when it has no '/').
std::pair<std::string_view, std::string_view> SplitDir(std::string_view path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return {{}, path};
  return {path.substr(0, slash + 1), path.substr(slash + 1)};
}

}  // namespace

// Pins and objects first: the pin of key "tqkv-probe.x" is ".tqkv-probe.x.tqkv.pin", which a
// probe never is (probes, like temps, end in hex digits).
FileKind ClassifyFileName(std::string_view name) {
  if (StartsWith(name, ".") && EndsWith(name, kPinSuffix)) return FileKind::kPin;
  if (EndsWith(name, kObjectSuffix)) return FileKind::kObject;
  if (StartsWith(name, kProbePrefix)) return FileKind::kProbe;
  if (StartsWith(name, ".") && name.find(kTempMarker) != std::string_view::npos) {
    return FileKind::kTemp;
  }
  return FileKind::kOther;
}

std::string ObjectPath(std::string_view root, std::string_view key) {
  std::string p(root);
  p += '/';
  p += key;
  p += kObjectSuffix;
  return p;
}

std::string TempPath(std::string_view object_path, std::string_view tag) {
  const auto [dir, base] = SplitDir(object_path);
  return std::string(dir) + "." + std::string(base) + ".tmp." + std::string(tag) + UniqueSuffix();
}

std::string PinPath(std::string_view object_path) {
  const auto [dir, base] = SplitDir(object_path);
  return std::string(dir) + "." + std::string(base) + ".pin";
}

std::string ProbePath(std::string_view root) {
  return std::string(root) + "/" + std::string(kProbePrefix) + UniqueSuffix();
}

std::optional<std::string> KeyOfObjectFile(std::string_view rel, std::string_view name) {
  if (ClassifyFileName(name) != FileKind::kObject) return std::nullopt;
  std::string key = std::string(rel) + std::string(name.substr(0, name.size() - kObjectSuffix.size()));
  if (!ValidateKey(key).ok()) return std::nullopt;
  return key;
}

std::optional<std::string> KeyOfPinFile(std::string_view rel, std::string_view name) {
  if (ClassifyFileName(name) != FileKind::kPin) return std::nullopt;
  // ".<base>.tqkv.pin" -> "<base>"
  std::string key = std::string(rel) + std::string(name.substr(1, name.size() - 1 - kPinSuffix.size()));
  if (!ValidateKey(key).ok()) return std::nullopt;
  return key;
}

}  // namespace tqkv::store_internal
