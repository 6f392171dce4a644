// The one key -> file name mapping of the stores that keep objects as files (posix, nfs), and
// the names of their internal files (docs/store.md, "Files"):
//   object "a/b"  a/b.tqkv
//   temp          a/.b.tqkv.tmp.<tag><pid>.<16 hex>  (tag "": writer, "r": nfs reader's link,
//                                                     "gc": gc's rename aside, "p": pin write)
//   pin           a/.b.tqkv.pin                      (expiry in ns, -1 forever)
//   probe         .tqkv-probe.<pid>.<16 hex>         (O_DIRECT check at open, in the root)
// ValidateKey refuses keys that contain ".tqkv" other than at their very end, so no object file
// of a valid key is ever taken for an internal file, nor an internal file for an object.
#ifndef TQKV_SRC_STORE_FILE_LAYOUT_H_
#define TQKV_SRC_STORE_FILE_LAYOUT_H_

#include <optional>
#include <string>
#include <string_view>

namespace tqkv::store_internal {

inline constexpr std::string_view kObjectSuffix = ".tqkv";
inline constexpr std::string_view kTempMarker = ".tqkv.tmp.";
inline constexpr std::string_view kPinSuffix = ".tqkv.pin";
inline constexpr std::string_view kProbePrefix = ".tqkv-probe.";

enum class FileKind { kObject, kTemp, kPin, kProbe, kOther };

// What a directory entry named `name` (no '/') is.
FileKind ClassifyFileName(std::string_view name);

// "<root>/a/b.tqkv" for key "a/b"; root "" gives "/a/b.tqkv" (an nfs export's root).
std::string ObjectPath(std::string_view root, std::string_view key);
// A fresh temp name beside `object_path`, unique across processes and machines.
std::string TempPath(std::string_view object_path, std::string_view tag);
std::string PinPath(std::string_view object_path);
std::string ProbePath(std::string_view root);

// The key of the object file `name` found in the directory `rel` ("" or ending in '/'), or
// nullopt when it is not an object file of a valid key.
std::optional<std::string> KeyOfObjectFile(std::string_view rel, std::string_view name);
// The key whose pin file is `name` in `rel`, or nullopt.
std::optional<std::string> KeyOfPinFile(std::string_view rel, std::string_view name);

}  // namespace tqkv::store_internal

#endif  // TQKV_SRC_STORE_FILE_LAYOUT_H_
