// O_DIRECT reads through io_uring with several requests in flight (io=uring). Built only when
// liburing is present (TQKV_HAVE_IO_URING); this header needs no liburing include.
#ifndef TQKV_SRC_STORE_POSIX_URING_READER_H_
#define TQKV_SRC_STORE_POSIX_URING_READER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "tqkv/status.h"

namespace tqkv::posix_internal {

// One read: `len` bytes of the file at `off` into `dst`. When `bounce` is false, off, dst and len
// are O_DIRECT-aligned and the kernel reads straight into dst. Otherwise the aligned range
// [io_off, io_off + io_len) covering it is read into an internal buffer and copied out.
struct UringPiece {
  uint64_t off = 0;
  uint8_t* dst = nullptr;
  uint32_t len = 0;
  bool bounce = false;
  uint64_t io_off = 0;  // bounce only
  uint32_t io_len = 0;  // bounce only; at most the bounce size given to Create
};

class UringReader {
 public:
  // Fails (with the errno of io_uring_setup) where io_uring is unavailable: old kernels, seccomp.
  static Result<std::unique_ptr<UringReader>> Create(uint32_t queue_depth, size_t bounce_bytes);
  ~UringReader();
  UringReader(const UringReader&) = delete;
  UringReader& operator=(const UringReader&) = delete;

  // Reads every piece with up to queue_depth in flight. Pieces that come back short or are
  // refused with EINVAL (O_DIRECT not accepted) are not errors: their indices go to `retry` for
  // the caller to redo synchronously. `name` names the object in error messages; `bytes_moved`
  // grows by the bytes the kernel transferred. Not thread-safe. After an error, destroy the
  // reader (requests may be left in its submission queue).
  Status Run(int fd, std::span<const UringPiece> pieces, std::string_view name,
             std::vector<size_t>* retry, uint64_t* bytes_moved);

 private:
  struct Impl;
  explicit UringReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tqkv::posix_internal

#endif  // TQKV_SRC_STORE_POSIX_URING_READER_H_
