// Internal: the byte layout of the .tqkv container, shared by writer, reader, tests and fuzzer.
// docs/format.md is the byte-level specification; every constant here is named there.
#ifndef TQKV_SRC_FORMAT_CONTAINER_LAYOUT_H_
#define TQKV_SRC_FORMAT_CONTAINER_LAYOUT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/container.h"
#include "tqkv/status.h"

namespace tqkv::format {

// PNG-style signature: a high-bit byte (catches 7-bit channels and text mode), the name, CR LF
// (catches line-ending conversion) and ^Z (stops DOS `type`). It is not valid UTF-8 or ASCII.
inline constexpr std::array<uint8_t, 8> kMagic = {0x89, 'T', 'Q', 'K', 'V', '\r', '\n', 0x1A};
inline constexpr uint8_t kChecksumXxh3 = 1;

inline constexpr uint64_t kPreambleBytes = 32;
inline constexpr uint64_t kHeaderChecksumOffset = 24;  // within the preamble
inline constexpr uint64_t kFooterBytes = 64;
inline constexpr uint64_t kIndexRecordBytes = 48;
inline constexpr uint64_t kIndexFixedBytes = 16;  // u64 count + u64 checksum
inline constexpr size_t kMaxModelBytes = 256;
// Smallest well-formed file of versions 1 to 8: the header block, an empty index and the footer.
inline constexpr uint64_t kMinFileBytes = kContainerAlignment + kIndexFixedBytes + kFooterBytes;
// Smallest size a reader looks further at: a header block of the least alignment (version 9), an
// empty index and the footer; the header block's real end is checked once the header is parsed.
inline constexpr uint64_t kMinAnyFileBytes =
    kContainerMinAlignment + kIndexFixedBytes + kFooterBytes;

// XXH3-64 with seed 0.
uint64_t Checksum(std::span<const uint8_t> bytes);

// `a` a power of two; x + a - 1 must not wrap (callers align offsets inside a file).
inline uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }
inline uint64_t AlignDown(uint64_t x, uint64_t a) { return x & ~(a - 1); }

// Little-endian loads and stores, independent of host byte order and alignment.
inline uint16_t LoadU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | static_cast<uint16_t>(p[1]) << 8);
}
inline uint32_t LoadU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}
inline uint64_t LoadU64(const uint8_t* p) {
  return static_cast<uint64_t>(LoadU32(p)) | static_cast<uint64_t>(LoadU32(p + 4)) << 32;
}
inline void StoreU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void StoreU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void StoreU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Appends little-endian fields to a byte vector.
class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(v); }
  void U16(uint16_t v);
  void U32(uint32_t v);
  void U64(uint64_t v);
  void F32(float v);
  void F64(double v);
  void Bytes(std::span<const uint8_t> b) { out_->insert(out_->end(), b.begin(), b.end()); }

 private:
  std::vector<uint8_t>* out_;
};

// "<name>: <what> at offset <n>: expected <expected>, got <got>".
Status CorruptionAt(std::string_view name, std::string_view what, uint64_t offset,
                    std::string_view expected, std::string_view got);
std::string Hex(uint64_t v);

// Everything a header must satisfy (writer: InvalidArgument; reader maps it to Corruption).
// Checks geometry, dtypes, token_block, model length, each codec (ValidateCodecParams and the
// geometry's head_dim), layer_codec size and range, and that a full chunk's size fits 64 bits.
Status ValidateHeader(const ContainerHeader& header);

// The header body (docs/format.md §3), without the preamble.
std::vector<uint8_t> EncodeHeaderBody(const ContainerHeader& header);
// Parses a header body of exactly `body.size()` bytes that starts at file offset `base`. Every
// count is checked against the bytes left before anything is allocated. Does not run
// ValidateHeader beyond what parsing needs.
// `version` (1..9) decides which fields follow the layer codecs (docs/format.md §4).
Result<ContainerHeader> DecodeHeaderBody(std::span<const uint8_t> body, uint64_t base,
                                         std::string_view name, uint32_t version);

// Preamble: magic, version, flags, checksum type, header body size, header checksum.
std::array<uint8_t, kPreambleBytes> EncodePreamble(uint32_t header_size, uint32_t version);
// Header checksum: XXH3-64 of [preamble | body] with the checksum field read as zero.
uint64_t HeaderChecksum(std::span<const uint8_t> preamble_and_body);

struct Footer {
  uint64_t index_offset = 0;
  uint64_t index_size = 0;
  uint64_t index_checksum = 0;
  uint64_t file_size = 0;
  uint64_t header_checksum = 0;
  uint32_t format_version = 0;
};
std::array<uint8_t, kFooterBytes> EncodeFooter(const Footer& footer);

void EncodeIndexRecord(const ChunkEntry& e, uint8_t* out);  // kIndexRecordBytes

// The key fields of a chunk (what container order fixes).
struct ChunkKey {
  ChunkType type = ChunkType::kCodes;
  uint32_t layer = 0;
  uint8_t kv = 0;
  uint64_t token_begin = 0;
  uint64_t token_count = 0;
  // An entry with this key (offset, size and checksum left to the caller).
  ChunkEntry Entry() const {
    ChunkEntry e;
    e.type = type;
    e.layer = layer;
    e.kv = kv;
    e.token_begin = token_begin;
    e.token_count = token_count;
    return e;
  }
  bool Matches(const ChunkEntry& e) const {
    return e.type == type && e.layer == layer && e.kv == kv && e.token_begin == token_begin &&
           e.token_count == token_count;
  }
};
std::string DescribeChunk(ChunkType type, uint32_t layer, uint8_t kv, uint64_t token_begin,
                          uint64_t token_count);
inline std::string DescribeChunk(const ChunkKey& k) {
  return DescribeChunk(k.type, k.layer, k.kv, k.token_begin, k.token_count);
}
inline std::string DescribeChunk(const ChunkEntry& e) {
  return DescribeChunk(e.type, e.layer, e.kv, e.token_begin, e.token_count);
}

// Walks the chunks of a (validated) header in container order: for each layer its meta chunk
// (when the layer's codec has group metadata; kv 0, token_begin 0, token_count 0), its key-means
// chunk (LayerHasKeyMeans; likewise), then K chunks
// by token in token_block steps, then V chunks, then its exact-rows chunk (when the header has
// exact rows; kv 0, token_begin 0, token_count 0).
class ChunkSequence {
 public:
  explicit ChunkSequence(const ContainerHeader& header);
  bool done() const { return layer_ >= header_->geometry.layers; }
  ChunkKey current() const;  // only when !done()
  void Advance();

 private:
  enum Phase { kMeta = 0, kMeans = 1, kK = 2, kV = 3, kExact = 4 };
  void Settle();
  const ContainerHeader* header_;
  uint32_t layer_ = 0;
  Phase phase_ = kMeta;
  uint64_t token_begin_ = 0;
};

// Number of chunks a header implies; InvalidArgument if it does not fit 64 bits.
Result<uint64_t> CountChunks(const ContainerHeader& header);

}  // namespace tqkv::format

#endif  // TQKV_SRC_FORMAT_CONTAINER_LAYOUT_H_
