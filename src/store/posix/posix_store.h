// The POSIX directory store (local disk, mounted NFS): "file:///dir?io=direct" or a plain path.
//
// Object key "a/b" lives in <dir>/a/b.tqkv. A writer writes <dir>/a/.b.tqkv.tmp.<pid>.<random>,
// and Commit = fdatasync, close, rename over b.tqkv, fsync the directory. File names:
// store/file_layout.h; session admin (pins, gc): store/posix/posix_admin.h. docs/store.md.
#ifndef TQKV_SRC_STORE_POSIX_POSIX_STORE_H_
#define TQKV_SRC_STORE_POSIX_POSIX_STORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv {

struct PosixStoreOptions {
  std::string dir;                    // absolute or relative directory
  IoMode io = IoMode::kBuffered;
  // Requests in flight per ReadBatch (1..256): io=uring ring depth; io=direct I/O threads
  // (at most 16; 1 = one synchronous pread at a time on the caller's thread).
  uint32_t queue_depth = 16;
  uint64_t chunk_bytes = 1u << 20;    // largest single I/O request; multiple of 4096
  // io=direct reads through io_uring where the kernel allows it (no thread wake-up per request:
  // it holds the disk's rate when the cores are busy, docs/store.md §4), else with `qd` threads
  // of preads; true: always the threads (URI `engine=threads`).
  bool direct_threads = false;
  uint64_t write_buffer_bytes = 4u << 20;  // append staging buffer; multiple of 4096
  bool create_dir = true;
  // The command line's file paths ("dir/NAME.tqkv"): NAME is a file name, not a store key, so any
  // name without '/' or NUL is taken (ValidateKey's character set is for keys shared by every
  // store). Listing and gc still see only valid keys.
  bool file_names = false;
  // Tests: behave as if the filesystem refused O_DIRECT (EINVAL), to exercise the fallback.
  bool simulate_no_direct = false;
  // Tests: every pread/pwrite reports only half of what it moved (a short transfer), to exercise
  // the resume paths (an unaligned O_DIRECT remainder continues through the page cache).
  bool simulate_short_io = false;
  // Tests: a pread whose range covers this file offset fails with EIO.
  uint64_t simulate_read_error_at = UINT64_MAX;
};

inline constexpr size_t kPosixDirectAlignment = 4096;

Result<std::unique_ptr<Store>> OpenPosixStore(const PosixStoreOptions& options);
// The "file" scheme of OpenStore: reads io, qd, chunk, create from the URI.
Result<std::unique_ptr<Store>> OpenPosixStoreFromUri(const StoreUri& uri);

}  // namespace tqkv

#endif  // TQKV_SRC_STORE_POSIX_POSIX_STORE_H_
