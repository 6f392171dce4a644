// Session management on a shared store: listing with last-access times and pins, pinning, and
// garbage collection with a capacity cap (LRU) and a TTL, safe with other processes at work.
//
// The state lives in the store itself, so every process and machine sees the same:
//   posix: last access = the object file's atime (kernel relatime: at most once a day after the
//          first read) or mtime if later; pin = ".<name>.tqkv.pin" beside it (expiry ns, -1 forever).
//   nfs:   the same files; Open sets the atime explicitly (one SETATTR).
//   redis: "<prefix>:{K}:a" (set by Open) and "<prefix>:{K}:p".
//   s3:    objects ".<name>.tqkv.access" (ns, written by Open) and ".<name>.tqkv.pin" beside it.
// Usage is the sum of the committed objects' sizes (what List reports), not a guess per process.
#ifndef TQKV_INCLUDE_TQKV_STORE_ADMIN_H_
#define TQKV_INCLUDE_TQKV_STORE_ADMIN_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv {

inline constexpr int64_t kPinForever = -1;

struct SessionMeta {
  std::string key;
  uint64_t size = 0;
  int64_t mtime_ns = 0;         // publish time
  int64_t atime_ns = 0;         // last access (restore); 0 unknown
  int64_t pin_until_ns = 0;     // 0 not pinned, kPinForever, else expiry (Unix ns)
  std::string version;          // redis: the writer id; posix, nfs: the inode (with mtime_ns)
  int64_t LastUse() const { return atime_ns > mtime_ns ? atime_ns : mtime_ns; }
  bool PinnedAt(int64_t now_ns) const {
    return pin_until_ns == kPinForever || pin_until_ns > now_ns;
  }
};

class SessionAdmin {
 public:
  virtual ~SessionAdmin() = default;
  virtual Result<std::vector<SessionMeta>> ListSessions() = 0;
  // until_ns: kPinForever, an expiry, or 0 to unpin. NotFound if no such object (pinning).
  virtual Status SetPin(std::string_view key, int64_t until_ns) = 0;
  // Removes `listed.key` only if its published version is still the one listed (redis: same writer
  // id, checked and removed in one script; posix/nfs: the file is renamed aside, then its inode
  // and mtime checked, and a newer version is put back), so a version published after the caller
  // listed it survives. Busy if it changed.
  virtual Status RemoveIfUnchanged(const SessionMeta& listed) = 0;
};

// The admin side of a posix, nfs, redis or s3 store (the store must outlive it); Unsupported else.
Result<std::unique_ptr<SessionAdmin>> OpenSessionAdmin(Store* store);

struct GcOptions {
  uint64_t max_bytes = 0;                      // 0: no cap
  std::chrono::seconds ttl{0};                 // 0: no TTL; unused this long -> evicted
  std::chrono::seconds temp_min_age{3600};     // temps of writers dead this long are removed
  bool dry_run = false;
};

struct GcReport {
  uint64_t bytes_before = 0, bytes_after = 0;
  std::vector<SessionMeta> expired;   // TTL
  std::vector<SessionMeta> evicted;   // over the cap, least recently used first
  std::vector<std::string> pinned_kept;
  uint64_t temps_removed = 0;         // dry_run: how many a run now would remove
  bool over_cap_after = false;        // pinned sessions alone exceed the cap
};

// Removes stale temps, then sessions unused for `ttl`, then least-recently-used sessions until the
// committed bytes fit `max_bytes`. Pinned sessions are never removed; objects being written are
// temps and never touched unless older than temp_min_age. A negative ttl or temp_min_age is
// InvalidArgument, before anything is touched.
Result<GcReport> CollectGarbage(Store* store, const GcOptions& options);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_STORE_ADMIN_H_
