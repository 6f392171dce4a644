// Internal, for tests and the fuzzer only: edits files on purpose.
#ifndef TQKV_SRC_FORMAT_CONTAINER_TESTING_H_
#define TQKV_SRC_FORMAT_CONTAINER_TESTING_H_

#include <cstdint>
#include <span>

#include "format/container_layout.h"

namespace tqkv::format {

// Recomputes every structural checksum of `f` (header checksum and its footer copy, index
// checksum and its footer copy, footer checksum) so that a deliberately edited file reaches the
// reader's semantic checks instead of failing at the first checksum. Takes the preamble's header
// size and the footer's index offset/size as they are and skips what lies outside the file.
// Chunk checksums are left alone.
inline void ResignContainerForTesting(std::span<uint8_t> f) {
  if (f.size() < kMinAnyFileBytes) return;
  const uint64_t fat = f.size() - kFooterBytes;
  const uint64_t header_size = LoadU32(f.data() + 20);
  if (kPreambleBytes + header_size <= f.size()) {
    const uint64_t hs = HeaderChecksum(f.first(kPreambleBytes + header_size));
    StoreU64(f.data() + kHeaderChecksumOffset, hs);
    StoreU64(f.data() + fat + 32, hs);
  }
  const uint64_t io = LoadU64(f.data() + fat), is = LoadU64(f.data() + fat + 8);
  if (is >= kIndexFixedBytes && io <= fat && is <= fat - io) {
    const uint64_t ic = Checksum(f.subspan(io, is - 8));
    StoreU64(f.data() + io + is - 8, ic);
    StoreU64(f.data() + fat + 16, ic);
  }
  StoreU64(f.data() + fat + 48, Checksum(f.subspan(fat, 48)));
}

}  // namespace tqkv::format

#endif  // TQKV_SRC_FORMAT_CONTAINER_TESTING_H_
