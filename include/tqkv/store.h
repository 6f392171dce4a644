// Stores move bytes of named objects; they never parse or decode them.
//
// Keys: 1..200 bytes of [A-Za-z0-9._-] in '/'-separated segments; no empty, "." or ".." segment,
// no leading '/', and ".tqkv" nowhere but at the very end. Names with ".tqkv" inside are the
// stores' own (temps ".<name>.tqkv.tmp.*", pins ".<name>.tqkv.pin", probes ".tqkv-probe.*"), and
// directory-backed stores keep the object "a" in the file "a.tqkv", which must not collide with
// the directory of "a.tqkv/b". Every backend refuses the same keys, so a session can move between
// them. ValidateKey() says why a key is refused. docs/store.md has the key -> file mapping.
// Publish is atomic: an object created by Create() becomes visible to Open() only when Commit()
// returns OK, with all its bytes durable; a writer destroyed or aborted before that leaves nothing
// readable and nothing that breaks the next Create() of the same key. The last committed writer wins.
#ifndef TQKV_INCLUDE_TQKV_STORE_H_
#define TQKV_INCLUDE_TQKV_STORE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tqkv/object.h"
#include "tqkv/status.h"

namespace tqkv {

enum class IoMode : uint8_t {
  kBuffered = 0,  // pread/pwrite through the page cache
  kDirect = 1,    // O_DIRECT, aligned buffers, synchronous
  kUring = 2,     // O_DIRECT through io_uring, several requests in flight
};
std::string_view IoModeName(IoMode mode);
Result<IoMode> ParseIoMode(std::string_view name);  // "buffered" | "direct" | "uring"

struct StoreCaps {
  size_t io_alignment = 1;     // buffers, offsets and lengths aligned to this read fastest
  bool atomic_publish = true;
  bool drop_cache = false;     // ReadableObject::DropCache() can evict the object from RAM caches
  // The I/O path really in use. It differs from the requested io= mode when the system refused
  // it (io_fell_back): O_DIRECT -> EINVAL (e.g. some FUSE/NFS setups), or io_uring unavailable.
  IoMode io_mode = IoMode::kBuffered;
  bool io_fell_back = false;
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  int64_t mtime_ns = 0;  // last publish time
};

class Store {
 public:
  virtual ~Store() = default;
  virtual std::string_view Name() const = 0;  // "posix", "memory", "fault", ...
  virtual std::string Uri() const = 0;
  virtual StoreCaps Caps() const = 0;
  virtual Result<std::unique_ptr<WritableObject>> Create(std::string_view key) = 0;
  // NotFound when no committed object has this key.
  virtual Result<std::unique_ptr<ReadableObject>> Open(std::string_view key) = 0;
  virtual Status Remove(std::string_view key) = 0;  // NotFound if absent
  // Committed objects whose key starts with `prefix` (plain string prefix), sorted by key.
  // Unfinished writers' leftovers are never listed.
  virtual Result<std::vector<ObjectInfo>> List(std::string_view prefix = {}) = 0;
  // Deletes what writers that died before Commit or Abort left behind (temporary files) and that
  // was last modified at least `min_age` ago; returns how many were deleted. On a shared
  // directory, pick `min_age` well above the longest checkpoint write.
  virtual Result<uint64_t> RemoveStaleTemps(std::chrono::seconds min_age) { return uint64_t{0}; }
  // How many temps RemoveStaleTemps(min_age) would delete now, deleting nothing (gc --dry-run).
  // A store that overrides one overrides both.
  virtual Result<uint64_t> CountStaleTemps(std::chrono::seconds min_age) { return uint64_t{0}; }
  // Stores that keep each object as a local file (posix, on a local disk or a mounted NFS): the
  // directory, and the file a committed object of `key` lives in (whether or not it exists now),
  // for callers that need a path (cuFile, an O_DIRECT probe). nullopt for stores without local
  // files, for decorators (reading the file directly would bypass them) and for invalid keys.
  virtual std::optional<std::string> LocalRoot() const { return std::nullopt; }
  virtual std::optional<std::string> LocalPath(std::string_view key) const { return std::nullopt; }
};

// Refuses path traversal, absolute paths, empty or over-long keys and odd characters.
Status ValidateKey(std::string_view key);

// What a program chooses when it opens a store, given as values rather than text appended to
// the user's URI.
struct OpenStoreOptions {
  // The I/O mode: as the URI option io=<IoModeName>, and it wins over the URI's own io=. Only
  // schemes with an io option take it (file://); the others refuse it as they refuse ?io=.
  std::optional<IoMode> io;
};

// Opens a store by URI: "file:///abs/dir?io=direct", a plain directory path, "memory://".
// Options (query parameters): io=buffered|direct|uring, qd=N (uring queue depth),
// chunk=BYTES (I/O request size), create=0|1 (create the directory; default 1).
// Unknown options, bad values and unknown schemes: InvalidArgument. docs/store.md has the grammar.
Result<std::unique_ptr<Store>> OpenStore(std::string_view uri,
                                         const OpenStoreOptions& options = {});
// OpenStore for commands that only use what is there (restore, ls, rm, pin, gc): it never
// creates the store's directory (create=0 whatever the URI says), so a mistyped path is NotFound.
Result<std::unique_ptr<Store>> OpenExistingStore(std::string_view uri,
                                                 const OpenStoreOptions& options = {});

// A store URI taken apart: scheme://authority/path?key=value&... A plain path has scheme "file".
// Percent-escapes (%2F) are decoded in path and options.
struct StoreUri {
  std::string scheme;     // lower case: "file", "memory", ...
  std::string authority;  // host[:port]; may be empty
  std::string path;
  std::vector<std::pair<std::string, std::string>> options;  // in order, keys unique
};
Result<StoreUri> ParseStoreUri(std::string_view uri);

// Makes OpenStore() accept another scheme (optional backends, tests). Factories must refuse
// options they do not know. AlreadyExists if the scheme is taken (built-ins included).
using StoreFactory = std::function<Result<std::unique_ptr<Store>>(const StoreUri& uri)>;
Status RegisterStoreScheme(std::string_view scheme, StoreFactory factory);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_STORE_H_
