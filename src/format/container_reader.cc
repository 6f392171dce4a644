// ContainerReader and the store-independent parser: nothing read from the file is trusted until
// it has been range-checked against the file size and verified by its checksum.
#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "format/container_layout.h"
#include "format/container_parse.h"
#include "tqkv/container.h"

namespace tqkv {
namespace format {
namespace {

std::string MagicString(const uint8_t* p) {
  std::string s;
  for (int i = 0; i < 8; ++i) {
    static constexpr char kDigits[] = "0123456789abcdef";
    s.push_back(kDigits[p[i] >> 4]);
    s.push_back(kDigits[p[i] & 0xF]);
  }
  return s;
}

std::string Bytes(uint64_t n) { return std::to_string(n) + " bytes"; }

// Corruption unless every byte of `bytes` (at file offset `base`) is zero.
Status CheckZero(std::span<const uint8_t> bytes, uint64_t base, std::string_view name,
                 std::string_view what) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != 0) return CorruptionAt(name, what, base + i, "0x0", Hex(bytes[i]));
  }
  return Status::Ok();
}

Status CheckField(std::string_view name, std::string_view what, uint64_t offset, uint64_t expected,
                  uint64_t got) {
  if (expected == got) return Status::Ok();
  return CorruptionAt(name, what, offset, std::to_string(expected), std::to_string(got));
}

// Reads the index and checks every record against the order, sizes and offsets the header implies.
Status ParseIndex(const ReadFn& read, const ParsedContainer& c, uint64_t index_size,
                  uint64_t footer_index_checksum, std::string_view name,
                  std::vector<ChunkEntry>* chunks, uint64_t* index_checksum) {
  const uint64_t at = c.index_offset;
  std::vector<uint8_t> index(index_size);  // index_size <= file size, checked by the caller
  TQKV_RETURN_IF_ERROR(read(at, index));
  const uint64_t stored = LoadU64(index.data() + index_size - 8);
  const uint64_t computed = Checksum({index.data(), index.size() - 8});
  if (stored != computed) {
    return CorruptionAt(name, "index checksum", at + index_size - 8, Hex(computed), Hex(stored));
  }
  if (stored != footer_index_checksum) {
    return CorruptionAt(name, "index checksum (footer copy)", c.file_bytes - kFooterBytes + 16,
                        Hex(stored), Hex(footer_index_checksum));
  }
  *index_checksum = stored;
  const uint64_t records = (index_size - kIndexFixedBytes) / kIndexRecordBytes;
  TQKV_RETURN_IF_ERROR(CheckField(name, "index record count", at, records, LoadU64(index.data())));
  auto expected_count = CountChunks(c.header);
  if (!expected_count.ok()) {
    return CorruptionAt(name, "chunk count", kPreambleBytes, "a count that fits 64 bits",
                        expected_count.status().message());
  }
  TQKV_RETURN_IF_ERROR(CheckField(name, "index record count", at, *expected_count, records));
  // Each payload has at least one byte and starts on its own aligned block of the data region.
  const uint64_t align = c.header.payload_alignment;
  const uint64_t max_chunks = (c.index_offset - c.header_block_end + align - 1) / align;
  if (records > max_chunks) {
    return CorruptionAt(name, "index record count", at,
                        "at most " + std::to_string(max_chunks) + " chunks in " +
                            Bytes(c.index_offset - c.header_block_end) + " of data",
                        std::to_string(records));
  }

  chunks->reserve(records);
  ChunkSequence seq(c.header);
  uint64_t pos = c.header_block_end;  // end of the previous payload
  for (uint64_t i = 0; i < records; ++i) {
    const uint8_t* r = index.data() + 8 + i * kIndexRecordBytes;
    const uint64_t rat = at + 8 + i * kIndexRecordBytes;
    if (seq.done()) return CorruptionAt(name, "index record", rat, "no more chunks", "a record");
    ChunkEntry e;
    e.type = static_cast<ChunkType>(r[0]);
    e.kv = r[1];
    e.layer = LoadU32(r + 4);
    e.token_begin = LoadU64(r + 8);
    e.token_count = LoadU64(r + 16);
    e.offset = LoadU64(r + 24);
    e.size = LoadU64(r + 32);
    e.checksum = LoadU64(r + 40);
    TQKV_RETURN_IF_ERROR(CheckField(name, "index record reserved", rat + 2, 0, LoadU16(r + 2)));
    const ChunkKey want = seq.current();
    if (!want.Matches(e)) {
      return CorruptionAt(name, "index record " + std::to_string(i), rat, DescribeChunk(want),
                          DescribeChunk(e));
    }
    auto size = ExpectedChunkBytes(c.header, e);
    if (!size.ok()) {
      return CorruptionAt(name, "chunk size of " + DescribeChunk(e), rat + 32,
                          "a size that fits 64 bits", size.status().message());
    }
    TQKV_RETURN_IF_ERROR(
        CheckField(name, "chunk size of " + DescribeChunk(e), rat + 32, *size, e.size));
    // pos <= index_offset < file size, so aligning cannot wrap.
    const uint64_t want_offset = AlignUp(pos, align);
    TQKV_RETURN_IF_ERROR(
        CheckField(name, "chunk offset of " + DescribeChunk(e), rat + 24, want_offset, e.offset));
    if (want_offset > c.index_offset || e.size > c.index_offset - want_offset) {
      return CorruptionAt(name, "chunk extent of " + DescribeChunk(e), rat + 24,
                          "end at or before the index at " + std::to_string(c.index_offset),
                          "[" + std::to_string(e.offset) + ", +" + std::to_string(e.size) + ")");
    }
    pos = e.offset + e.size;
    chunks->push_back(e);
    seq.Advance();
  }
  if (!seq.done()) {
    return CorruptionAt(name, "index", at, "a record for " + DescribeChunk(seq.current()),
                        "end of index");
  }
  return CheckField(name, "index offset (end of the last chunk)", c.file_bytes - kFooterBytes, pos,
                    c.index_offset);
}

}  // namespace

Result<ParsedContainer> ParseContainerStructure(const ReadFn& read, uint64_t file_bytes,
                                                std::string_view name) {
  if (file_bytes < kMinAnyFileBytes) {
    return CorruptionAt(name, "file size", 0, "at least " + Bytes(kMinAnyFileBytes),
                        Bytes(file_bytes));
  }
  ParsedContainer c;
  c.file_bytes = file_bytes;

  // 1. Preamble: magic, then the version (the only field read before a checksum covers it, so a
  //    newer file is refused as Unsupported rather than misparsed).
  std::array<uint8_t, kPreambleBytes> pre;
  TQKV_RETURN_IF_ERROR(read(0, pre));
  if (std::memcmp(pre.data(), kMagic.data(), kMagic.size()) != 0) {
    return CorruptionAt(name, "magic", 0, MagicString(kMagic.data()), MagicString(pre.data()));
  }
  const uint32_t version = LoadU32(pre.data() + 8);
  if (version < kContainerMinReadableVersion || version > kContainerVersion) {
    return Status::Unsupported(std::string(name) + ": format version at offset 8: expected " +
                               std::to_string(kContainerMinReadableVersion) + ".." +
                               std::to_string(kContainerVersion) + ", got " +
                               std::to_string(version));
  }
  const uint32_t header_size = LoadU32(pre.data() + 20);
  const uint64_t header_checksum = LoadU64(pre.data() + kHeaderChecksumOffset);

  // 2. Footer: the last 64 bytes. Its magic and file size catch truncation and appended bytes.
  const uint64_t fat = file_bytes - kFooterBytes;
  std::array<uint8_t, kFooterBytes> foot;
  TQKV_RETURN_IF_ERROR(read(fat, foot));
  if (std::memcmp(foot.data() + 56, kMagic.data(), kMagic.size()) != 0) {
    return CorruptionAt(name, "footer magic", fat + 56, MagicString(kMagic.data()),
                        MagicString(foot.data() + 56));
  }
  const uint64_t footer_checksum = Checksum({foot.data(), 48});
  if (LoadU64(foot.data() + 48) != footer_checksum) {
    return CorruptionAt(name, "footer checksum", fat + 48, Hex(footer_checksum),
                        Hex(LoadU64(foot.data() + 48)));
  }
  Footer f;
  f.index_offset = LoadU64(foot.data() + 0);
  f.index_size = LoadU64(foot.data() + 8);
  f.index_checksum = LoadU64(foot.data() + 16);
  f.file_size = LoadU64(foot.data() + 24);
  f.header_checksum = LoadU64(foot.data() + 32);
  f.format_version = LoadU32(foot.data() + 40);
  TQKV_RETURN_IF_ERROR(CheckField(name, "file size (footer)", fat + 24, file_bytes, f.file_size));
  TQKV_RETURN_IF_ERROR(
      CheckField(name, "format version (footer)", fat + 40, version, f.format_version));
  TQKV_RETURN_IF_ERROR(CheckField(name, "footer reserved", fat + 44, 0, LoadU32(foot.data() + 44)));
  if (f.header_checksum != header_checksum) {
    return CorruptionAt(name, "header checksum (footer copy)", fat + 32, Hex(header_checksum),
                        Hex(f.header_checksum));
  }
  // The index ends where the footer begins; its size is checked against the file before use.
  if (f.index_size < kIndexFixedBytes || f.index_size > fat - kContainerMinAlignment ||
      (f.index_size - kIndexFixedBytes) % kIndexRecordBytes != 0) {
    return CorruptionAt(name, "index size (footer)", fat + 8, "16 + 48 * n bytes within the file",
                        Bytes(f.index_size));
  }
  TQKV_RETURN_IF_ERROR(
      CheckField(name, "index offset (footer)", fat, fat - f.index_size, f.index_offset));
  c.index_offset = f.index_offset;

  // 3. Header block: preamble, body, zero padding to the payload alignment, which the body names
  // (version 9). One read takes the body and the most padding any alignment gives (to the next
  // 4 KiB, within the data); the padding is checked once the alignment is known.
  const uint64_t body_end = kPreambleBytes + uint64_t{header_size};
  if (body_end > c.index_offset) {
    return CorruptionAt(
        name, "header size", 20,
        "a header ending at or before the index at " + std::to_string(c.index_offset),
        Bytes(header_size));
  }
  std::vector<uint8_t> block(std::min(AlignUp(body_end, kContainerAlignment), c.index_offset));
  std::memcpy(block.data(), pre.data(), pre.size());
  TQKV_RETURN_IF_ERROR(
      read(kPreambleBytes, {block.data() + kPreambleBytes, block.size() - kPreambleBytes}));
  const std::span<const uint8_t> header_bytes(block.data(), body_end);
  const uint64_t computed = HeaderChecksum(header_bytes);
  if (computed != header_checksum) {
    return CorruptionAt(name, "header checksum", kHeaderChecksumOffset, Hex(computed),
                        Hex(header_checksum));
  }
  c.header_checksum = header_checksum;
  // Versions 1 to 9 define no flags and one checksum type; anything else is damage (a writer
  // that needs more must raise format_version).
  TQKV_RETURN_IF_ERROR(CheckField(name, "flags", 12, 0, LoadU32(pre.data() + 12)));
  TQKV_RETURN_IF_ERROR(CheckField(name, "checksum type", 16, kChecksumXxh3, pre[16]));
  TQKV_RETURN_IF_ERROR(CheckZero({pre.data() + 17, 3}, 17, name, "preamble reserved"));
  TQKV_ASSIGN_OR_RETURN(
      c.header, DecodeHeaderBody(header_bytes.subspan(kPreambleBytes), kPreambleBytes, name, version));
  if (Status s = ValidateHeader(c.header); !s.ok()) {
    return CorruptionAt(name, "header", kPreambleBytes, "a valid header", s.message());
  }
  // Canonical: a header is written with the lowest version that holds it (ContainerVersionFor).
  TQKV_RETURN_IF_ERROR(CheckField(name, "format version", 8, ContainerVersionFor(c.header), version));
  // The alignment divides 4096, so the block end is within what was read unless past the index.
  c.header_block_end = AlignUp(body_end, c.header.payload_alignment);
  if (c.header_block_end > block.size()) {
    return CorruptionAt(
        name, "header size", 20,
        "a header block ending at or before the index at " + std::to_string(c.index_offset),
        Bytes(header_size));
  }
  TQKV_RETURN_IF_ERROR(CheckZero(
      std::span<const uint8_t>(block).subspan(body_end, c.header_block_end - body_end), body_end,
      name, "header padding"));
  block = {};

  // 4. Index.
  TQKV_RETURN_IF_ERROR(
      ParseIndex(read, c, f.index_size, f.index_checksum, name, &c.chunks, &c.index_checksum));
  return c;
}

Status VerifyChunkPayload(const ParsedContainer& c, size_t i, std::span<const uint8_t> payload,
                          std::string_view name) {
  const ChunkEntry& e = c.chunks[i];
  const std::string what = "chunk " + std::to_string(i) + " (" + DescribeChunk(e) + ")";
  TQKV_RETURN_IF_ERROR(CheckField(name, what + " size", e.offset, e.size, payload.size()));
  const uint64_t sum = Checksum(payload);
  if (sum != e.checksum)
    return CorruptionAt(name, what + " checksum", e.offset, Hex(e.checksum), Hex(sum));
  return Status::Ok();
}

Status VerifyChunkPadding(const ParsedContainer& c, size_t i, std::span<const uint8_t> padding,
                          std::string_view name) {
  return CheckZero(padding, PaddingBegin(c, i), name, "padding after chunk " + std::to_string(i));
}

Status VerifyChunkExtent(const ParsedContainer& c, size_t i, std::span<const uint8_t> extent,
                         std::string_view name) {
  const uint64_t want = ChunkExtent(c, i);
  if (extent.size() != want) {
    return Status::InvalidArgument(std::string(name) + ": chunk " + std::to_string(i) + " read as " +
                                   Bytes(extent.size()) + ", its extent is " + Bytes(want));
  }
  // Bytes before the payload and past the padding belong to neighbours: they check them.
  const size_t at = static_cast<size_t>(PayloadOffsetInExtent(c, i));
  const size_t payload = static_cast<size_t>(c.chunks[i].size);
  const size_t padding = static_cast<size_t>(PaddingEnd(c, i) - PaddingBegin(c, i));
  TQKV_RETURN_IF_ERROR(VerifyChunkPayload(c, i, extent.subspan(at, payload), name));
  return VerifyChunkPadding(c, i, extent.subspan(at + payload, padding), name);
}

Result<ParsedContainer> ParseAndVerifyContainer(std::span<const uint8_t> file,
                                                std::string_view name) {
  const ReadFn read = [file, name](uint64_t offset, std::span<uint8_t> dst) -> Status {
    if (offset > file.size() || dst.size() > file.size() - offset) {
      return Status::Corruption(std::string(name) + ": read past the end at offset " +
                                std::to_string(offset));
    }
    if (!dst.empty()) std::memcpy(dst.data(), file.data() + offset, dst.size());
    return Status::Ok();
  };
  TQKV_ASSIGN_OR_RETURN(ParsedContainer c, ParseContainerStructure(read, file.size(), name));
  for (size_t i = 0; i < c.chunks.size(); ++i) {
    TQKV_RETURN_IF_ERROR(
        VerifyChunkExtent(c, i, file.subspan(ChunkExtentOffset(c, i), ChunkExtent(c, i)), name));
  }
  return c;
}

}  // namespace format

namespace {

class ContainerReaderImpl final : public ContainerReader {
 public:
  ContainerReaderImpl(ReadableObject* in, std::string name, format::ParsedContainer parsed)
      : in_(in), name_(std::move(name)), c_(std::move(parsed)) {
    for (size_t i = 0; i < c_.chunks.size(); ++i) {
      max_extent_ = std::max(max_extent_, format::ChunkExtent(c_, i));
    }
  }

  const ContainerHeader& header() const override { return c_.header; }
  const std::vector<ChunkEntry>& chunks() const override { return c_.chunks; }
  uint64_t file_bytes() const override { return c_.file_bytes; }
  uint64_t ChunkExtent(size_t i) const override { return format::ChunkExtent(c_, i); }
  uint64_t ChunkExtentOffset(size_t i) const override { return format::ChunkExtentOffset(c_, i); }
  uint64_t PayloadOffsetInExtent(size_t i) const override {
    return format::PayloadOffsetInExtent(c_, i);
  }
  uint64_t MaxChunkExtent() const override { return max_extent_; }
  Status VerifyChunkExtent(size_t i, std::span<const uint8_t> extent) const override;
  Status ReadChunks(std::span<const ChunkRead> reads) override;
  Status ReadChunkExtents(std::span<const ChunkRead> reads) override;
  Status VerifyChunk(const ChunkEntry& entry, std::span<const uint8_t> payload) const override;
  Status ReadChunk(const ChunkEntry& entry, std::span<uint8_t> dst) override;

 private:
  // Index of the chunk `entry` describes; InvalidArgument unless it equals a chunk of this file.
  Result<size_t> Find(const ChunkEntry& entry) const;

  ReadableObject* in_;
  std::string name_;
  format::ParsedContainer c_;
  uint64_t max_extent_ = 0;
};

Status ContainerReaderImpl::VerifyChunkExtent(size_t i, std::span<const uint8_t> extent) const {
  if (i >= c_.chunks.size()) {
    return Status::InvalidArgument(name_ + ": no chunk " + std::to_string(i) + " of " +
                                   std::to_string(c_.chunks.size()));
  }
  return format::VerifyChunkExtent(c_, i, extent, name_);
}

Status ContainerReaderImpl::ReadChunks(std::span<const ChunkRead> reads) {
  TQKV_RETURN_IF_ERROR(ReadChunkExtents(reads));
  for (const ChunkRead& r : reads) TQKV_RETURN_IF_ERROR(VerifyChunkExtent(r.index, r.dst));
  return Status::Ok();
}

Status ContainerReaderImpl::ReadChunkExtents(std::span<const ChunkRead> reads) {
  // Below 4 KiB alignment (version 9) neighbouring extents share blocks: what the previous read
  // of the batch fetches is copied from it afterwards, not read again (16-token sessions read
  // about 4x their size otherwise). Extents of 4 KiB-aligned files never overlap.
  struct Copy {
    size_t from, to;
    uint64_t at, bytes;  // [at, at + bytes) of reads[from].dst to the start of reads[to].dst
  };
  std::vector<ReadRequest> reqs;
  std::vector<Copy> copies;
  reqs.reserve(reads.size());
  uint64_t prev_begin = 0, prev_end = 0;
  for (size_t k = 0; k < reads.size(); ++k) {
    const ChunkRead& r = reads[k];
    if (r.index >= c_.chunks.size() || r.dst.size() != format::ChunkExtent(c_, r.index)) {
      return VerifyChunkExtent(r.index, r.dst);  // says which bound was missed
    }
    const uint64_t begin = format::ChunkExtentOffset(c_, r.index), end = begin + r.dst.size();
    uint64_t from = begin;  // stays 4 KiB-aligned: prev_end is, unless it is the index offset
    if (k > 0 && begin >= prev_begin && begin < prev_end) {
      from = std::min(prev_end, end);
      copies.push_back({k - 1, k, begin - prev_begin, from - begin});
    }
    if (from < end) reqs.push_back({from, r.dst.subspan(static_cast<size_t>(from - begin))});
    prev_begin = begin;
    prev_end = end;
  }
  TQKV_RETURN_IF_ERROR(in_->ReadBatch(reqs));
  for (const Copy& c : copies) {  // in order: a copied prefix may feed the next chunk's
    std::memcpy(reads[c.to].dst.data(), reads[c.from].dst.data() + c.at, c.bytes);
  }
  return Status::Ok();
}

Result<size_t> ContainerReaderImpl::Find(const ChunkEntry& entry) const {
  const auto& v = c_.chunks;
  auto it = std::lower_bound(v.begin(), v.end(), entry.offset,
                             [](const ChunkEntry& e, uint64_t off) { return e.offset < off; });
  if (it == v.end() || it->offset != entry.offset || it->size != entry.size ||
      it->checksum != entry.checksum ||
      !format::ChunkKey{it->type, it->layer, it->kv, it->token_begin, it->token_count}.Matches(
          entry)) {
    return Status::InvalidArgument(name_ + ": no chunk " + format::DescribeChunk(entry) +
                                   " at offset " + std::to_string(entry.offset));
  }
  return static_cast<size_t>(it - v.begin());
}

Status ContainerReaderImpl::VerifyChunk(const ChunkEntry& entry,
                                        std::span<const uint8_t> payload) const {
  TQKV_ASSIGN_OR_RETURN(const size_t i, Find(entry));
  return format::VerifyChunkPayload(c_, i, payload, name_);
}

Status ContainerReaderImpl::ReadChunk(const ChunkEntry& entry, std::span<uint8_t> dst) {
  TQKV_ASSIGN_OR_RETURN(const size_t i, Find(entry));
  if (dst.size() != entry.size) {
    return Status::InvalidArgument(name_ + ": ReadChunk of " + std::to_string(entry.size) +
                                   " bytes into a buffer of " + std::to_string(dst.size()));
  }
  TQKV_RETURN_IF_ERROR(in_->ReadAt(entry.offset, dst));
  TQKV_RETURN_IF_ERROR(format::VerifyChunkPayload(c_, i, dst, name_));
  // The padding after the payload carries no data but is part of the file: it must be zero.
  std::array<uint8_t, kContainerAlignment> pad;
  const uint64_t begin = format::PaddingBegin(c_, i);
  const size_t n = static_cast<size_t>(format::PaddingEnd(c_, i) - begin);  // < 4096
  if (n == 0) return Status::Ok();
  TQKV_RETURN_IF_ERROR(in_->ReadAt(begin, {pad.data(), n}));
  return format::VerifyChunkPadding(c_, i, {pad.data(), n}, name_);
}

}  // namespace

Result<std::unique_ptr<ContainerReader>> ContainerReader::Open(ReadableObject* in,
                                                               std::string name) {
  if (in == nullptr) return Status::InvalidArgument("container reader: null input");
  const format::ReadFn read = [in](uint64_t offset, std::span<uint8_t> dst) {
    return in->ReadAt(offset, dst);
  };
  TQKV_ASSIGN_OR_RETURN(format::ParsedContainer c,
                        format::ParseContainerStructure(read, in->Size(), name));
  return std::unique_ptr<ContainerReader>(
      std::make_unique<ContainerReaderImpl>(in, std::move(name), std::move(c)));
}

}  // namespace tqkv
