// Internal: parsing and validation of a whole container, independent of any store.
// ContainerReader::Open, `tqkv verify`, the tests and the fuzzer all go through these functions.
#ifndef TQKV_SRC_FORMAT_CONTAINER_PARSE_H_
#define TQKV_SRC_FORMAT_CONTAINER_PARSE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "tqkv/container.h"
#include "tqkv/status.h"

namespace tqkv::format {

struct ParsedContainer {
  ContainerHeader header;
  std::vector<ChunkEntry> chunks;  // container order, offsets ascending
  uint64_t file_bytes = 0;
  uint64_t header_block_end = 0;  // first byte after the header block's padding
  uint64_t index_offset = 0;
  uint64_t header_checksum = 0;
  uint64_t index_checksum = 0;
};

// Reads exactly dst.size() bytes at offset; the parser only asks for ranges inside the file.
using ReadFn = std::function<Status(uint64_t offset, std::span<uint8_t> dst)>;

// Parses and validates preamble, footer, header block (with its zero padding) and index of a
// file of `file_bytes` bytes; chunk payloads are not read. Never allocates more than the file's
// size. Errors: Corruption("<name>: <what> at offset <n>: expected X, got Y"); Unsupported for a
// format_version outside [kContainerMinReadableVersion, kContainerVersion]; read errors as is.
Result<ParsedContainer> ParseContainerStructure(const ReadFn& read, uint64_t file_bytes,
                                                std::string_view name);

// Corruption unless payload has chunk i's size and checksum.
Status VerifyChunkPayload(const ParsedContainer& c, size_t i, std::span<const uint8_t> payload,
                          std::string_view name);
// Corruption unless `padding` (the bytes after chunk i up to the next chunk or the index) is zero.
Status VerifyChunkPadding(const ParsedContainer& c, size_t i, std::span<const uint8_t> padding,
                          std::string_view name);
// [begin, end) of the padding after chunk i.
inline uint64_t PaddingBegin(const ParsedContainer& c, size_t i) {
  return c.chunks[i].offset + c.chunks[i].size;
}
inline uint64_t PaddingEnd(const ParsedContainer& c, size_t i) {
  return i + 1 < c.chunks.size() ? c.chunks[i + 1].offset : c.index_offset;
}
// Chunk i's extent (ContainerReader::ChunkExtent): the 4 KiB blocks around its payload, up to the
// index at most. It always holds all of the padding: the next payload starts at or before
// ceil_4096(payload end), as the payload alignment divides 4096.
inline uint64_t ChunkExtentOffset(const ParsedContainer& c, size_t i) {
  return c.chunks[i].offset & ~(kContainerAlignment - 1);
}
inline uint64_t ChunkExtentEnd(const ParsedContainer& c, size_t i) {
  const uint64_t end = c.chunks[i].offset + c.chunks[i].size;  // <= index_offset: no wrap below
  return std::min((end + kContainerAlignment - 1) & ~(kContainerAlignment - 1), c.index_offset);
}
inline uint64_t ChunkExtent(const ParsedContainer& c, size_t i) {
  return ChunkExtentEnd(c, i) - ChunkExtentOffset(c, i);
}
inline uint64_t PayloadOffsetInExtent(const ParsedContainer& c, size_t i) {
  return c.chunks[i].offset - ChunkExtentOffset(c, i);
}
// VerifyChunkPayload and VerifyChunkPadding of an extent read whole (ChunkExtent(c, i) bytes).
Status VerifyChunkExtent(const ParsedContainer& c, size_t i, std::span<const uint8_t> extent,
                         std::string_view name);

// The whole check of an in-memory file: structure, every chunk checksum and every padding byte.
Result<ParsedContainer> ParseAndVerifyContainer(std::span<const uint8_t> file,
                                                std::string_view name);

}  // namespace tqkv::format

#endif  // TQKV_SRC_FORMAT_CONTAINER_PARSE_H_
