// io=direct with qd > 1: a batch of reads is cut into pieces of at most `chunk` bytes, and a
// per-store pool of qd threads issues them with pread, so several are in flight at once and the
// disk keeps reading while the calling thread is descheduled (docs/store.md §4).
#ifndef TQKV_SRC_STORE_POSIX_PARALLEL_READS_H_
#define TQKV_SRC_STORE_POSIX_PARALLEL_READS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "tqkv/status.h"
#include "tqkv/store.h"
#include "tqkv/thread_pool.h"

namespace tqkv::posix_internal {

// Most I/O threads a store starts, whatever qd says (qd allows up to 256 for io_uring).
inline constexpr size_t kMaxReadThreads = 16;

// Cuts requests into pieces of at most `chunk` bytes, in order. A request starting off an
// `align` boundary first gets a piece up to that boundary, so the rest stays aligned.
std::vector<ReadRequest> SplitReads(std::span<const ReadRequest> reqs, uint64_t chunk,
                                    uint64_t align);

// Calls read(piece) for every piece on `pool` and the calling thread, claimed in order. After the
// first error no further piece starts; returns once none is running, with that error.
Status ReadPieces(ThreadPool& pool, std::span<const ReadRequest> pieces,
                  const std::function<Status(const ReadRequest&)>& read);

}  // namespace tqkv::posix_internal

#endif  // TQKV_SRC_STORE_POSIX_PARALLEL_READS_H_
