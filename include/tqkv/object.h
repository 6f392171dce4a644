// Objects a store hands out: bytes to read at offsets, or to append and then publish.
// The container format (tqkv/container.h) reads and writes through these interfaces and knows
// nothing of stores; tqkv/store.h says how objects are created, opened and published.
#ifndef TQKV_INCLUDE_TQKV_OBJECT_H_
#define TQKV_INCLUDE_TQKV_OBJECT_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "tqkv/status.h"

namespace tqkv {

struct ReadRequest {
  uint64_t offset = 0;
  std::span<uint8_t> dst;  // filled completely, or the request fails
};

// An object's bytes moved so far, by how they moved (stores over local or mounted files; all
// zero elsewhere). A reader asked for O_DIRECT that shows any page_cache bytes (the file's
// unaligned tail is read with O_DIRECT too) fell back to the page cache somewhere (RestoreStats,
// `tqkv restore --json`).
struct ReadPathBytes {
  uint64_t direct = 0;      // with O_DIRECT, by preads or io_uring
  uint64_t uring = 0;       // the part of `direct` moved by io_uring
  uint64_t page_cache = 0;  // through the page cache
};

// Thread safety: Store methods may be called from any thread. A ReadableObject allows concurrent
// ReadAt/ReadBatch calls; a WritableObject is used by one thread at a time.
class ReadableObject {
 public:
  virtual ~ReadableObject() = default;
  virtual uint64_t Size() const = 0;
  // Reads exactly dst.size() bytes at offset. Past the end: Corruption naming object and offset.
  virtual Status ReadAt(uint64_t offset, std::span<uint8_t> dst) = 0;
  // Reads all requests, possibly concurrently (io_uring keeps several in flight); returns the
  // first error. Default: ReadAt in order.
  virtual Status ReadBatch(std::span<const ReadRequest> reqs);
  // Evicts the object's bytes from the page cache so the next read comes from storage.
  virtual Status DropCache() { return Status::Unsupported("drop cache"); }
  // Bytes actually moved from storage by this object so far (excluding alignment padding reuse).
  virtual uint64_t BytesRead() const { return 0; }
  virtual ReadPathBytes PathBytes() const { return {}; }
};

class WritableObject {
 public:
  // Destroying an object that was not committed aborts it.
  virtual ~WritableObject() = default;
  virtual Status Append(std::span<const uint8_t> src) = 0;
  // Makes every appended byte durable, then publishes the object atomically under its key.
  // After an Append error the object is failed: Commit returns that error and publishes nothing.
  virtual Status Commit() = 0;
  // Discards the object; nothing becomes visible. Append/Commit/Abort after Commit or Abort
  // return InvalidArgument.
  virtual Status Abort() = 0;
  virtual uint64_t BytesWritten() const = 0;
};

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_OBJECT_H_
