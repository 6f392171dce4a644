#include "store/posix/parallel_reads.h"

#include <algorithm>

namespace tqkv::posix_internal {

std::vector<ReadRequest> SplitReads(std::span<const ReadRequest> reqs, uint64_t chunk,
                                    uint64_t align) {
  std::vector<ReadRequest> pieces;
  for (const ReadRequest& r : reqs) {
    uint64_t off = r.offset;
    std::span<uint8_t> dst = r.dst;
    while (!dst.empty()) {
      uint64_t n = std::min<uint64_t>(dst.size(), chunk);
      if (off % align != 0) n = std::min<uint64_t>(n, align - off % align);
      pieces.push_back({off, dst.first(n)});
      off += n;
      dst = dst.subspan(n);
    }
  }
  return pieces;
}

Status ReadPieces(ThreadPool& pool, std::span<const ReadRequest> pieces,
                  const std::function<Status(const ReadRequest&)>& read) {
  return ParallelForEach(&pool, pieces.size(), 1, [&](size_t i) { return read(pieces[i]); });
}

}  // namespace tqkv::posix_internal
